-- Due retries (failing) and delayed jobs, and jobs waiting for a signal whose deadline
-- passed (signal.lua), go to the ready list.
local function promote(now)
  local ids = redis.call('ZRANGEBYSCORE', D, '-inf', istr(now), 'LIMIT', '0', '1000')
  for _, id in ipairs(ids) do
    redis.call('ZREM', D, id)
    local st = redis.call('HGET', JOBS, id)
    if starts(st, 'failing:') or starts(st, 'delayed:') or starts(st, 'waiting_signal:') then
      local m = getm(id)
      m.ws = nil
      m.wc = nil
      local tok = redis.call('INCR', SEQ)
      m.k = istr(tok)
      setm(id, m)
      setst(id, 'queued:' .. istr(now))
      push_ready(m, m.k .. ':' .. id, false)
      ev(starts(st, 'failing:') and 'requeued' or 'promoted', id, nil, nil, nil, m.i)
    end
  end
end
local function next_due()
  local nd = redis.call('ZRANGE', D, '0', '0', 'WITHSCORES')
  return nd[2] or false
end
