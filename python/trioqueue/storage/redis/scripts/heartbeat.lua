-- ARGV: worker, ttl_ms, lease_ms, then (id, claim token) pairs.
-- Returns the ids among them that have a cancel request.
--@include prelude
local W, ttl, lease = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
local now = now_ms()
redis.call('ZADD', WK, now + ttl, W)
local requested = {}
for i = 4, #ARGV, 2 do
  local id, claim = ARGV[i], ARGV[i + 1]
  if starts(redis.call('HGET', JOBS, id), 'processing:') then
    local m = getm(id)
    if m and m.w == W and m.l == claim then
      redis.call('ZADD', L, 'XX', now + lease, id)
      if m.x == 1 then requested[#requested + 1] = id end
    end
  end
end
return requested
