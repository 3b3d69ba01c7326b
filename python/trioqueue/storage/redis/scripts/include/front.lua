-- Claimed jobs handed back (release, a reserved claim not started while paused): each goes
-- to the front of its own lane, in the order handed back, state queued, its claim cleared.
local FRONT = {}  -- {entry, metadata}, in order
-- a claimed job W held (its processing-list entry e already removed, its lease too)
local function requeue_front(id, m, e, now, W)
  m.s = nil
  m.w = nil
  m.l = nil
  setm(id, m)
  setst(id, 'queued:' .. istr(now))
  FRONT[#FRONT + 1] = {e, m}
  ev('requeued', id, W, nil, nil, m.i)
end
-- push what requeue_front (or a caller, for entries never claimed) put in FRONT
local function push_front()
  for i = #FRONT, 1, -1 do
    push_ready(FRONT[i][2], FRONT[i][1], true)
  end
end
