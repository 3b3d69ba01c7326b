-- ARGV: name. Returns 1 if it existed.
--@include prelude
redis.call('HDEL', SCHED_LAST, ARGV[1])
return redis.call('HDEL', SCHED, ARGV[1])
