-- KEYS[QK + 1]: the worker's processing list. ARGV: worker, then (id, claim token) pairs.
-- Counts the attempts of reserved claims about to run. Returns 1/0 per pair. While the
-- queue is paused a reserved claim does not start: it goes back to the front of its lane
-- (its attempt never counted). A last 'tree' if a job of a tree of jobs ended (cancelled):
-- the caller runs tree_act.
--@include prelude
--@include groups
--@include cancel
--@include front
local P = KEYS[QK + 1]
local W = ARGV[1]
local now = now_ms()
local out = {}
local paused = nil  -- looked up at the first reserved claim
for i = 2, #ARGV, 2 do
  local id, claim = ARGV[i], ARGV[i + 1]
  local st = redis.call('HGET', JOBS, id)
  local m = st and getm(id) or nil
  if not (m and starts(st, 'processing:') and m.w == W and m.l == claim) then
    out[#out + 1] = 0
  elseif m.x == 1 and m.s ~= 1 then
    redis.call('LREM', P, '1', m.k .. ':' .. id)
    redis.call('ZREM', L, id)
    group_left(id, m, nil)  -- (no prefetch under group_concurrency: no group is marked full)
    cancel_claimed(id, m, now, W)
    out[#out + 1] = 0
  else
    if m.s ~= 1 and paused == nil then paused = redis.call('EXISTS', PAUSED) == 1 end
    if m.s ~= 1 and paused then
      local e = m.k .. ':' .. id
      redis.call('LREM', P, '1', e)
      redis.call('ZREM', L, id)
      group_left(id, m, nil)
      requeue_front(id, m, e, now, W)
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
end
push_front()
flush()
if TREED then out[#out + 1] = 'tree' end
return out
