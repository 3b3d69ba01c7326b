-- ARGV: id. Returns the status string.
--@include prelude
--@include tree
local id = ARGV[1]
local now = now_ms()
expired(id, now)
local st = stpart(redis.call('HGET', JOBS, id))
if not st then return 'not_found' end
local m = getm(id)
if starts(st, 'queued:') or starts(st, 'failing:') or starts(st, 'delayed:') or starts(st, 'waiting_children:') then
  -- its ready-list entry (if any) no longer matches: dropped when met
  m.k = -1
  redis.call('ZREM', D, id)
  ev('cancelled', id, nil, nil, nil, m.i)
  terminal(id, m, now, m.t or 0, 'cancelled:' .. now, '')
  tree_settle(now)  -- its children are cancelled, its parent told
  flush()
  return 'cancelled'
end
if starts(st, 'cancelled:') then return 'cancelled' end
if starts(st, 'processing:') then
  if m.x ~= 1 then
    m.x = 1
    setm(id, m)
    ev('cancel_requested', id, m.w, nil, nil, m.i)
  end
  local t = m.tr and tree_info(id)
  if t and t.ch then  -- its children (added while it runs) are cancelled with it
    for _, c in ipairs(t.ch) do tree_cancel(c, now) end
    tree_settle(now)
  end
  flush()
  return 'cancelled'
end
return state_kind(st)
