-- wrk script: POST /api/ai/generate, round robin over the session tokens in
-- $TOKENS (one per line, distinct users; wrk thread k of $THREADS starts at a
-- different offset). The prompt is $AI_PROMPT (default "chunks=20 delay_ms=0":
-- bench_peer's fake upstream then streams 20 content chunks at once). Counts
-- answers by status and prints the latency percentiles in ms.
local threads = {}
local counter = 1
function setup(thread)
  thread:set("id", counter)
  counter = counter + 1
  table.insert(threads, thread)
end

local tokens = {}
local i = 0
c200, c429, c5xx, cother = 0, 0, 0, 0

function init(args)
  for line in io.lines(os.getenv("TOKENS")) do
    tokens[#tokens + 1] = line
  end
  local n = tonumber(os.getenv("THREADS") or "2")
  i = math.floor((id - 1) * #tokens / n)
end

local prompt = os.getenv("AI_PROMPT") or "chunks=20 delay_ms=0"
local body = '{"prompt":"' .. prompt .. '"}'
function request()
  i = i % #tokens + 1
  return wrk.format("POST", "/api/ai/generate", {
    ["Content-Type"] = "application/json",
    ["Authorization"] = "Bearer " .. tokens[i],
  }, body)
end

function response(status, hdrs, body)
  if status == 200 then
    c200 = c200 + 1
  elseif status == 429 then
    c429 = c429 + 1
  elseif status >= 500 then
    c5xx = c5xx + 1
  else
    cother = cother + 1
  end
end

function done(summary, latency, requests)
  local ok, limited, failed, other = 0, 0, 0, 0
  for _, t in ipairs(threads) do
    ok = ok + t:get("c200")
    limited = limited + t:get("c429")
    failed = failed + t:get("c5xx")
    other = other + t:get("cother")
  end
  io.write(string.format("answers: 200 %d, 429 %d, 5xx %d, other %d\n", ok, limited, failed, other))
  io.write(string.format("latency ms: p50 %.2f p90 %.2f p99 %.2f max %.2f\n",
    latency:percentile(50) / 1000, latency:percentile(90) / 1000,
    latency:percentile(99) / 1000, latency.max / 1000))
end
