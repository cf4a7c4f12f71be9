-- wrk script: provider notifications, each a first delivery. $BODIES holds one
-- signed JSON body per line (bench_peer notify-a); wrk thread k of $THREADS
-- takes lines k, k+THREADS, ... so no two requests share a body until a
-- thread runs out of lines (then it wraps and the repeats are duplicates:
-- the "wrapped" count printed at the end says so). Counts answers by status.
-- $WEBHOOK_PATH: the route (default /api/webhooks/provider_a).
local threads = {}
local counter = 1
function setup(thread)
  thread:set("id", counter)
  counter = counter + 1
  table.insert(threads, thread)
end

local path = os.getenv("WEBHOOK_PATH") or "/api/webhooks/provider_a"
local bodies = {}
local i = 0
wrapped = 0
c2xx, c503, cother = 0, 0, 0

function init(args)
  local n = tonumber(os.getenv("THREADS") or "2")
  local k = 0
  for line in io.lines(os.getenv("BODIES")) do
    if k % n == id - 1 then
      bodies[#bodies + 1] = line
    end
    k = k + 1
  end
end

local headers = { ["Content-Type"] = "application/json" }
function request()
  i = i + 1
  if i > #bodies then
    i = 1
    wrapped = wrapped + 1
  end
  return wrk.format("POST", path, headers, bodies[i])
end

function response(status, hdrs, body)
  if status >= 200 and status < 300 then
    c2xx = c2xx + 1
  elseif status == 503 then
    c503 = c503 + 1
  else
    cother = cother + 1
  end
end

function done(summary, latency, requests)
  local ok, shed, other, wraps = 0, 0, 0, 0
  for _, t in ipairs(threads) do
    ok = ok + t:get("c2xx")
    shed = shed + t:get("c503")
    other = other + t:get("cother")
    wraps = wraps + t:get("wrapped")
  end
  io.write(string.format("answers: 2xx %d, 503 %d, other %d; body list wrapped %d times\n",
    ok, shed, other, wraps))
  io.write(string.format("latency ms: p50 %.2f p90 %.2f p99 %.2f max %.2f\n",
    latency:percentile(50) / 1000, latency:percentile(90) / 1000,
    latency:percentile(99) / 1000, latency.max / 1000))
end
