-- wrk script: POST /api/payments {"plan":"PRO"} round robin over the session
-- tokens in $TOKENS (one per line, distinct users; thread k of $THREADS takes
-- lines k, k+THREADS, ...). The route allows 5 checkouts per user per 15 min:
-- give enough tokens that no user is used more than that (429s are counted).
local threads = {}
local counter = 1
function setup(thread)
  thread:set("id", counter)
  counter = counter + 1
  table.insert(threads, thread)
end

local tokens = {}
local i = 0
c2xx, c429, c503, cother = 0, 0, 0, 0

function init(args)
  local n = tonumber(os.getenv("THREADS") or "2")
  local k = 0
  for line in io.lines(os.getenv("TOKENS")) do
    if k % n == id - 1 then
      tokens[#tokens + 1] = line
    end
    k = k + 1
  end
end

local body = '{"plan":"PRO"}'
function request()
  i = i % #tokens + 1
  return wrk.format("POST", "/api/payments", {
    ["Content-Type"] = "application/json",
    ["Authorization"] = "Bearer " .. tokens[i],
  }, body)
end

function response(status, hdrs, body)
  if status >= 200 and status < 300 then
    c2xx = c2xx + 1
  elseif status == 429 then
    c429 = c429 + 1
  elseif status == 503 then
    c503 = c503 + 1
  else
    cother = cother + 1
  end
end

function done(summary, latency, requests)
  local ok, limited, shed, other = 0, 0, 0, 0
  for _, t in ipairs(threads) do
    ok = ok + t:get("c2xx")
    limited = limited + t:get("c429")
    shed = shed + t:get("c503")
    other = other + t:get("cother")
  end
  io.write(string.format("answers: 2xx %d, 429 %d, 503 %d, other %d\n", ok, limited, shed, other))
  io.write(string.format("latency ms: p50 %.2f p90 %.2f p99 %.2f max %.2f\n",
    latency:percentile(50) / 1000, latency:percentile(90) / 1000,
    latency:percentile(99) / 1000, latency.max / 1000))
end
