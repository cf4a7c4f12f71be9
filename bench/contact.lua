-- wrk script: POST /api/contact from many distinct client IPs (X-Forwarded-For),
-- so the per-IP limit is not what is measured. Run the api with TRUST_PROXY=true.
local counter = 0
request = function()
  counter = counter + 1
  local ip = string.format("10.%d.%d.%d", math.floor(counter / 65536) % 256, math.floor(counter / 256) % 256, counter % 256)
  local body = string.format('{"name":"Bench %d","email":"bench%d@example.com","message":"Hello from wrk"}', counter, counter)
  return wrk.format("POST", "/api/contact", {
    ["Content-Type"] = "application/json",
    ["X-Forwarded-For"] = ip,
  }, body)
end
