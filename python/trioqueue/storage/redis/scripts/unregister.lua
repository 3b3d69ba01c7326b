-- KEYS[QK + 1]: the worker's processing list. ARGV: worker
--@include prelude
local W = ARGV[1]
redis.call('ZREM', WK, W)
if redis.call('LLEN', KEYS[QK + 1]) == 0 then redis.call('SREM', PROCS, W) end
return 1
