-- KEYS[QK + 1..]: the processing lists of the workers named in ARGV (the members of PROCS
-- and WK the caller read just before); the last KEY: the flow hash. Recovers expired leases and the jobs of dead
-- workers, promotes due jobs, removes dead workers that hold nothing.
-- Returns {{id, 'requeued'|'failed'|'cancelled'}..., next deadline ms or false, how many
-- notes of trees of jobs TNOTES holds (the caller runs tree_act: a crash may have left some)}.
--@include prelude
--@include groups
--@include promote
--@include cancel
--@include flow_free
local now = now_ms()
local rec = {}
local lists = {}
for i = 1, #ARGV do lists[ARGV[i]] = KEYS[QK + i] end
promote(now)
local function recover(id, m, W)
  redis.call('ZREM', L, id)
  group_left(id, m, FLOW)
  ev('stalled', id, W, nil, nil, m.i)
  m.w = nil
  m.l = nil
  if m.x == 1 then
    cancel_claimed(id, m, now, W)
    rec[#rec + 1] = {id, 'cancelled'}
  elseif m.s ~= 1 or m.a < (m.m or 1) then
    -- a reserved claim never ran: it goes back at no cost
    m.s = nil
    setm(id, m)
    setst(id, 'queued:' .. now)
    push_ready(m, m.k .. ':' .. id, false)
    ev('requeued', id, W, nil, nil, m.i)
    rec[#rec + 1] = {id, 'requeued'}
  else
    fail_stalled(id, m, now, W)
    rec[#rec + 1] = {id, 'failed'}
  end
end
-- 1. expired leases (of workers whose list the caller declared)
for _, id in ipairs(redis.call('ZRANGEBYSCORE', L, '-inf', now, 'LIMIT', '0', '1000')) do
  local st = redis.call('HGET', JOBS, id)
  local m = st and getm(id) or nil
  if m and starts(st, 'processing:') and m.w then
    local P = lists[m.w]
    if P then
      redis.call('LREM', P, '1', m.k .. ':' .. id)
      recover(id, m, m.w)
    end
  else
    redis.call('ZREM', L, id)
  end
end
-- 2. processing lists of dead workers (including entries moved but never claimed)
local nd = nil
for W, P in pairs(lists) do
  local alive = redis.call('ZSCORE', WK, W)
  if not alive or tonumber(alive) <= now then
    local entries = redis.call('LRANGE', P, '0', '-1')
    redis.call('DEL', P)
    redis.call('SREM', PROCS, W)
    local back = {}
    for _, e in ipairs(entries) do
      local tok, id = split(e)
      if id then
        local st = redis.call('HGET', JOBS, id)
        local m = st and getm(id) or nil
        if m and tostring(m.k) == tok then
          if starts(st, 'processing:') and m.w == W then recover(id, m, W)
          elseif starts(st, 'queued:') then back[#back + 1] = {e, m} end
        end
      end
    end
    for i = #back, 1, -1 do
      push_ready(back[i][2], back[i][1], true)
    end
    -- a dead worker holding nothing leaves the registry
    if alive then redis.call('ZREM', WK, W) end
  elseif redis.call('LLEN', P) > 0 then
    local t = tonumber(alive)
    if not nd or t < nd then nd = t end
  end
end
local first = redis.call('ZRANGE', L, '0', '0', 'WITHSCORES')
if first[2] then
  local t = tonumber(first[2])
  if not nd or t < nd then nd = t end
end
local due = next_due()
if due then
  local t = tonumber(due)
  if not nd or t < nd then nd = t end
end
if #rec > 0 then slot_freed() end
flush()
return {rec, nd or false, redis.call('SCARD', TNOTES)}
