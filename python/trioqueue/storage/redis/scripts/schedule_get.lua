-- Returns {name, spec, ...} and {name, last tick ms, ...}.
--@include prelude
return {redis.call('HGETALL', SCHED), redis.call('HGETALL', SCHED_LAST)}
