-- ARGV: name, tick (seconds, as text: stored exactly), then nothing (a skipped tick) or
-- enqueue.lua's ARGV for the tick's job (call token, then the job's five fields).
-- One step: if the schedule exists and the tick is later than its last tick, enqueue the
-- job exactly as enqueue.lua does (the same fragment), then record the tick; returns 1.
-- Otherwise changes nothing; returns 0.
--@include prelude
--@include groups
--@include delay
if redis.call('HEXISTS', SCHED, ARGV[1]) == 0 then return 0 end
local last = redis.call('HGET', SCHED_LAST, ARGV[1])
if last and tonumber(last) >= tonumber(ARGV[2]) then return 0 end
if #ARGV > 2 then
local A = 3
--@include enqueue
end
redis.call('HSET', SCHED_LAST, ARGV[1], ARGV[2])
return 1
