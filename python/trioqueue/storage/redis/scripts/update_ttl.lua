-- ARGV: id, ttl_ms.
--@include prelude
local id, ttl = ARGV[1], tonumber(ARGV[2])
local now = now_ms()
expired(id, now)
local v = redis.call('HGET', JOBS, id)
if not v then return 'not_found' end
local st = stpart(v)
if starts(st, 'completed:') then
  if not isrec(v) then return 'missing_payload' end  -- (a record keeps the result)
elseif starts(st, 'failed:') then
  if redis.call('HEXISTS', ERRORS, id) == 0 then return 'missing_payload' end
elseif not starts(st, 'cancelled:') then
  return 'not_terminal'
end
if ttl <= 0 then purge(id) return 'updated' end
redis.call('ZADD', STATES, xidx(st, now + ttl), id)
lower_sweep_at(now + ttl)
return 'updated'
