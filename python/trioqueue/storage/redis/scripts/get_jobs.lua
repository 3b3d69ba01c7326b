-- ARGV: ids. Returns, for each id in order, false or what get_job returns for it (one
-- call for many statuses: Queue.get_statuses).
--@include prelude
local now = now_ms()
local out = {}
for i = 1, #ARGV do
  local id = ARGV[i]
  expired(id, now)
  local r = report(id)
  if r then r[11] = redis.call('HGET', TREE, id) or false end
  out[i] = r or false
end
return out
