-- KEYS[1]: the lock. ARGV: owner, ttl_ms.
local h = redis.call('GET', KEYS[1])
if not h or h == ARGV[1] then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', tonumber(ARGV[2]))
  return 1
end
return 0
