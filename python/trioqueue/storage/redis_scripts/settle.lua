-- KEYS[19]: the worker's processing list.
-- ARGV: worker, call token, then (id, data, '<kind c|f|r|x>:<ttl_ms>:<delay_ms>', claim
-- token) per settlement. Returns a list of 1 (settled, or already settled by this claim)
-- / 0 (fenced: the claim is not the job's current one in this worker's list).
--@include _prelude
--@include _cancel
local P = KEYS[19]
local W, CALL = ARGV[1], ARGV[2]
local now = now_ms()
local out = {}
local wake = false
for i = 3, #ARGV, 4 do
  local id, data, meta, claim = ARGV[i], ARGV[i + 1], ARGV[i + 2], ARGV[i + 3]
  local kind, rest = split(meta)
  local ttl_s, delay_s = split(rest)
  local ttl, delay = tonumber(ttl_s), tonumber(delay_s)
  local st = redis.call('HGET', JOBS, id)
  local m = st and getm(id) or nil
  local held = m and starts(st, 'processing:') and m.w == W and m.l == claim
  if held and redis.call('LREM', P, 1, m.k .. ':' .. id) == 0 then held = false end
  if not held then
    if m and m.l == claim and not starts(st, 'processing:') then
      out[#out + 1] = 1  -- settled by this very claim already: a retried call
    else
      ev('fenced', id, W, nil, nil, m and m.i or nil)
      out[#out + 1] = 0
    end
  else
    out[#out + 1] = 1
    if m.s ~= 1 and kind ~= 'x' then m.a = m.a + 1 end  -- settled without start()
    m.z = CALL
    redis.call('ZREM', L, id)
    if kind == 'x' or (kind == 'r' and m.x == 1) then
      cancel_claimed(id, m, now, W)
    elseif kind == 'c' then
      if ttl > 0 then redis.call('HSET', RESULTS, id, data) end
      redis.call('HSET', JOBS, id, 'completed:' .. now)
      ev('completed', id, W, small(data), nil, m.i)
      terminal(id, m, now, ttl)
    elseif kind == 'f' then
      if ttl > 0 then redis.call('HSET', ERRORS, id, data) end
      redis.call('HSET', JOBS, id, 'failed:' .. now)
      ev('failed', id, W, nil, small(data), m.i)
      terminal(id, m, now, ttl)
    else
      m.w = nil
      setm(id, m)
      redis.call('HSET', JOBS, id, 'failing:' .. now .. ':' .. m.a)
      redis.call('ZADD', D, now + delay, id)
      redis.call('HSET', ERRORS, id, data)
      ev('failing', id, W, nil, small(data), m.i)
      if delay <= 0 then wake = true end
    end
  end
end
-- a retry due now: wake a blocked claimer (the claim script drops this entry)
if wake then redis.call('RPUSH', Q, '~') end
flush()
return out
