-- KEYS[QK + 1]: the worker's processing list. ARGV: worker, then (id, claim token) pairs.
-- Counts the attempts of reserved claims about to run. Returns 1/0 per pair.
--@include _prelude
--@include _cancel
local P = KEYS[QK + 1]
local W = ARGV[1]
local now = now_ms()
local out = {}
for i = 2, #ARGV, 2 do
  local id, claim = ARGV[i], ARGV[i + 1]
  local st = redis.call('HGET', JOBS, id)
  local m = st and getm(id) or nil
  if not (m and starts(st, 'processing:') and m.w == W and m.l == claim) then
    out[#out + 1] = 0
  elseif m.x == 1 and m.s ~= 1 then
    redis.call('LREM', P, '1', m.k .. ':' .. id)
    redis.call('ZREM', L, id)
    cancel_claimed(id, m, now, W)
    out[#out + 1] = 0
  else
    if m.s ~= 1 then
      m.s = 1
      m.a = m.a + 1
      setm(id, m)
    end
    out[#out + 1] = 1
  end
end
flush()
return out
