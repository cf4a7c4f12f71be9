-- wrk script: authenticated POST /api/profile, round robin over the session
-- tokens in the file $TOKENS (one per line; distinct users).
local tokens = {}
for line in io.lines(os.getenv("TOKENS")) do
  tokens[#tokens + 1] = line
end
local i = 0
local body = '{"full_name":"Bench User"}'
request = function()
  i = i % #tokens + 1
  return wrk.format("POST", "/api/profile", {
    ["Content-Type"] = "application/json",
    ["Authorization"] = "Bearer " .. tokens[i],
  }, body)
end
