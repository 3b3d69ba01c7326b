-- ARGV: id. Returns the status string, or {status, 'tree'} when a job of a tree of jobs
-- ended or its children are to be cancelled (noted in TNOTES: the caller runs tree_act).
--@include prelude
local id = ARGV[1]
local now = now_ms()
expired(id, now)
local st = stpart(redis.call('HGET', JOBS, id))
if not st then return 'not_found' end
local m = getm(id)
if starts(st, 'queued:') or starts(st, 'failing:') or starts(st, 'delayed:') or starts(st, 'waiting_children:')
    or starts(st, 'waiting_signal:') then
  -- its ready-list entry (if any) no longer matches: dropped when met
  m.k = -1
  redis.call('ZREM', D, id)
  ev('cancelled', id, nil, nil, nil, m.i)
  terminal(id, m, now, m.t or 0, 'cancelled:' .. now, '')
  flush()
  if TREED then return {'cancelled', 'tree'} end  -- its children are cancelled, its parent told
  return 'cancelled'
end
if starts(st, 'cancelled:') then return 'cancelled' end
if starts(st, 'processing:') then
  if m.x ~= 1 then
    m.x = 1
    setm(id, m)
    ev('cancel_requested', id, m.w, nil, nil, m.i)
  end
  flush()
  local raw = m.tr and redis.call('HGET', TREE, id)
  if raw and cjson.decode(raw).ch then  -- its children (added while it runs) are cancelled with it
    redis.call('SADD', TNOTES, 'c' .. id)
    return {'cancelled', 'tree'}
  end
  return 'cancelled'
end
return state_kind(st)
