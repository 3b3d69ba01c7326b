-- ARGV: name, spec. Creates or replaces a schedule (its last tick is kept).
--@include prelude
redis.call('HSET', SCHED, ARGV[1], ARGV[2])
return 1
