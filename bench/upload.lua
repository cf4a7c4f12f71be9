-- wrk script: PUT one avatar file ($AVATAR_FILE, raw PNG bytes) to the signed
-- upload route, round robin over the grants in $GRANTS ("<user id> <token>"
-- lines). Requests are built once per grant: each wrk thread holds them.
local f = assert(io.open(os.getenv("AVATAR_FILE"), "rb"))
local body = f:read("*a")
f:close()
local requests = {}
for line in io.lines(os.getenv("GRANTS")) do
  local user, token = line:match("(%S+) (%S+)")
  requests[#requests + 1] = wrk.format("PUT",
    "/storage/v1/object/upload/sign/avatars/" .. user .. "/avatar?token=" .. token,
    { ["Content-Type"] = "image/png" }, body)
end
local i = 0
request = function()
  i = i % #requests + 1
  return requests[i]
end
