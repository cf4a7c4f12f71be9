-- wrk script: POST /api/waitlist with a distinct email and client IP per request.
-- Each wrk thread gets its own prefix so emails never collide (409 would not insert).
local counter = 0
local prefix = ""
setup = function(thread)
  thread:set("tid", math.random(1, 1000000000))
end
init = function(args)
  prefix = tostring(tid) .. "-" .. tostring(os.time())
end
request = function()
  counter = counter + 1
  local ip = string.format("10.%d.%d.%d", math.floor(counter / 65536) % 256, math.floor(counter / 256) % 256, counter % 256)
  local body = string.format('{"email":"w%s-%d@example.com","name":"Bench"}', prefix, counter)
  return wrk.format("POST", "/api/waitlist", {
    ["Content-Type"] = "application/json",
    ["X-Forwarded-For"] = ip,
  }, body)
end
