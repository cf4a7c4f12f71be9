-- wrk script for the built-in identity provider (/auth/v1), one of three
-- modes in $AUTH_MODE, over the users in $USERS (one "email access refresh"
-- line per user, written by bench/run.sh's auth_setup):
--   signin  POST /auth/v1/token?grant_type=password, round robin over the
--           emails, password $AUTH_PASSWORD;
--   refresh POST /auth/v1/token?grant_type=refresh_token: each wrk thread
--           keeps a pool of refresh tokens (its share of $USERS); a request
--           takes one from the pool and its 200 answer puts the rotated token
--           back, as a client that refreshes does. Every request is a first
--           use of its token (no reuse-interval answers);
--   user    GET /auth/v1/user, round robin over the access tokens.
-- Counts answers by status and prints the latency percentiles in ms.
local threads = {}
local counter = 1
function setup(thread)
  thread:set("id", counter)
  counter = counter + 1
  table.insert(threads, thread)
end

local mode = os.getenv("AUTH_MODE") or "user"
local password = os.getenv("AUTH_PASSWORD") or "bench-password-0123"
local users = {}
local pool = {}
local i = 0
c200, c429, c5xx, cother, empty = 0, 0, 0, 0, 0

function init(args)
  local all = {}
  for line in io.lines(os.getenv("USERS")) do
    local email, access, refresh = line:match("^(%S+) (%S+) (%S+)$")
    if email then all[#all + 1] = {email = email, access = access, refresh = refresh} end
  end
  -- thread k of n takes every n-th user, so no refresh token is in two pools
  local n = tonumber(os.getenv("THREADS") or "2")
  for k = id, #all, n do users[#users + 1] = all[k] end
  for _, u in ipairs(users) do pool[#pool + 1] = u.refresh end
end

local json = {["Content-Type"] = "application/json"}
function request()
  if mode == "signin" then
    i = i % #users + 1
    return wrk.format("POST", "/auth/v1/token?grant_type=password", json,
      '{"email":"' .. users[i].email .. '","password":"' .. password .. '"}')
  elseif mode == "refresh" then
    local t = table.remove(pool)
    if t == nil then
      -- more connections than tokens: a request that must fail (counted)
      empty = empty + 1
      t = "none"
    end
    return wrk.format("POST", "/auth/v1/token?grant_type=refresh_token", json,
      '{"refresh_token":"' .. t .. '"}')
  else
    i = i % #users + 1
    return wrk.format("GET", "/auth/v1/user", {["Authorization"] = "Bearer " .. users[i].access})
  end
end

function response(status, hdrs, body)
  if status == 200 then
    c200 = c200 + 1
    if mode == "refresh" then
      local t = body:match('"refresh_token":"([^"]+)"')
      if t then pool[#pool + 1] = t end
    end
  elseif status == 429 then
    c429 = c429 + 1
  elseif status >= 500 then
    c5xx = c5xx + 1
  else
    cother = cother + 1
  end
end

function done(summary, latency, requests)
  local a = {0, 0, 0, 0, 0}
  for _, t in ipairs(threads) do
    a[1] = a[1] + t:get("c200")
    a[2] = a[2] + t:get("c429")
    a[3] = a[3] + t:get("c5xx")
    a[4] = a[4] + t:get("cother")
    a[5] = a[5] + t:get("empty")
  end
  io.write(string.format("answers: 200 %d, 429 %d, 5xx %d, other %d (refreshes sent without a token: %d)\n",
    a[1], a[2], a[3], a[4], a[5]))
  io.write(string.format("latency ms: p50 %.2f p90 %.2f p99 %.2f max %.2f\n",
    latency:percentile(50) / 1000, latency:percentile(90) / 1000,
    latency:percentile(99) / 1000, latency.max / 1000))
end
