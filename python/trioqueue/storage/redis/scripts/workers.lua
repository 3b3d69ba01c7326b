-- ARGV: '1' to include workers whose heartbeat expired. Returns {worker, expiry_ms, ...}.
--@include prelude
if ARGV[1] == '1' then return redis.call('ZRANGE', WK, '0', '-1', 'WITHSCORES') end
return redis.call('ZRANGEBYSCORE', WK, '(' .. now_ms(), '+inf', 'WITHSCORES')
