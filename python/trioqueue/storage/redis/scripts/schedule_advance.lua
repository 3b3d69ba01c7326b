-- ARGV: name, tick (seconds, as text: stored exactly). Moves the last tick forward;
-- returns 1 if it did.
--@include prelude
if redis.call('HEXISTS', SCHED, ARGV[1]) == 0 then return 0 end
local last = redis.call('HGET', SCHED_LAST, ARGV[1])
if last and tonumber(last) >= tonumber(ARGV[2]) then return 0 end
redis.call('HSET', SCHED_LAST, ARGV[1], ARGV[2])
return 1
