-- Jobs entering the delayed set D (a delayed enqueue, a retry, a rate-limited put-back).
-- One due before everything already pending there publishes 'due' (its time in the
-- result field: the reaper, which promotes due jobs, wakes for it) and wakes a blocked
-- claimer (a '~' marker, see WAKE), so that both recompute when to wake up. Call
-- due_flush() before flush().
local DUE_FIRST = nil  -- D's earliest due time before this call's first entry (false: none)
local DUE_NEW = false  -- the earliest due time this call added before DUE_FIRST
local function to_delayed(id, at)
  if DUE_FIRST == nil then
    local f = redis.call('ZRANGE', D, '0', '0', 'WITHSCORES')
    DUE_FIRST = f[2] and tonumber(f[2]) or false
  end
  redis.call('ZADD', D, istr(at), id)
  if (not DUE_FIRST or at < DUE_FIRST) and (not DUE_NEW or at < DUE_NEW) then DUE_NEW = at end
end
local function due_flush()
  if DUE_NEW then
    ev('due', '', nil, istr(DUE_NEW), nil, nil)
    WAKE = WAKE + 1
    DUE_NEW = false
  end
end
