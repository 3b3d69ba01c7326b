-- ARGV: name, spec, then '0' (write only if there is no such schedule) or '1' and the
-- spec expected to be stored (write only if it still is). Creates or replaces the
-- schedule (its last tick is kept); returns 1 if it wrote, 0 if not.
--@include prelude
local stored = redis.call('HGET', SCHED, ARGV[1])
if ARGV[3] == '0' then
  if stored then return 0 end
elseif stored ~= ARGV[4] then
  return 0
end
redis.call('HSET', SCHED, ARGV[1], ARGV[2])
return 1
