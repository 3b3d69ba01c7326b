-- KEYS[QK + 1]: the worker's processing list; the last KEY: the flow hash. ARGV: worker,
-- refund ('1': none of these claims ran, a started claim's attempt is taken back), ids...
-- Gives claimed-but-unfinished jobs back to the front of the ready list (without refund
-- a started claim's attempt stays counted, and one that used its last attempt fails,
-- StalledJobError, as the reaper's recovery; a job with a cancel request ends cancelled
-- instead).
-- Returns how many went back ({n, 'tree'} if a job of a tree of jobs ended: the caller
-- runs tree_act).
--@include prelude
--@include groups
--@include cancel
--@include front
--@include flow_free
local P = KEYS[QK + 1]
local W, REFUND = ARGV[1], ARGV[2] == '1'
local now = now_ms()
local byid = {}
for _, e in ipairs(redis.call('LRANGE', P, '0', '-1')) do
  local tok, id = split(e)
  if id then
    if not byid[id] then byid[id] = {} end
    table.insert(byid[id], e)
  else
    redis.call('LREM', P, '0', e)
  end
end
for i = 3, #ARGV do
  local id = ARGV[i]
  local list = byid[id]
  byid[id] = nil
  if list then
    local st = redis.call('HGET', JOBS, id)
    local m = st and getm(id) or nil
    for _, e in ipairs(list) do
      redis.call('LREM', P, '1', e)
      local tok = split(e)
      if m and tok == tostring(m.k) then
        if starts(st, 'processing:') and m.w == W then
          redis.call('ZREM', L, id)
          group_left(id, m, FLOW)
          if m.x == 1 then
            cancel_claimed(id, m, now, W)
          elseif not REFUND and m.s == 1 and m.a >= (m.m or 1) then
            -- a started claim that used its last attempt (its handler may have run):
            -- failed, as the reaper's recovery of it would, never run past max_attempts
            m.w = nil
            m.l = nil
            fail_stalled(id, m, now, W)
          else
            if REFUND and m.s == 1 then m.a = m.a - 1 end
            requeue_front(id, m, e, now, W)
          end
        elseif starts(st, 'queued:') then
          FRONT[#FRONT + 1] = {e, m}  -- moved by a blocking claim, never claimed
        end
        st = nil
      end
    end
  end
end
push_front()
if #FRONT > 0 or EVN > 0 then slot_freed() end
flush()
if TREED then return {#FRONT, 'tree'} end
return #FRONT
