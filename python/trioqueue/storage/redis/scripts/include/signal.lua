-- Signals (Job.wait_for_signal). A job's mailbox is the field '\254' .. id of PROGRESS
-- (a byte no UTF-8 id holds, as the steps' '\255'): the messages sent to it, each in the
-- steps' stored form (storage._steps.encode_step: the name's and the payload's lengths,
-- 4 bytes each, big-endian, then the name and the payload), in the order they were sent.
-- A job in waiting_signal keeps in its metadata what it waits for: ws the name, wc how
-- many messages on it it needs; its deadline, if any, is its due time in D.
-- how many messages on name the mailbox of id holds
local function sig_count(id, name)
  local box = redis.call('HGET', PROGRESS, '\254' .. id)
  if not box then return 0 end
  local n, pos, len = 0, 1, #box
  while pos + 7 <= len do
    local a, b, c, d, e, f, g, h = string.byte(box, pos, pos + 7)
    local nl = ((a * 256 + b) * 256 + c) * 256 + d
    local vl = ((e * 256 + f) * 256 + g) * 256 + h
    if nl == #name and string.sub(box, pos + 8, pos + 7 + nl) == name then n = n + 1 end
    pos = pos + 8 + nl + vl
  end
  return n
end
-- the waiting (or settling) job id is queued again, in its lane
local function sig_queue(id, m, now)
  m.ws = nil
  m.wc = nil
  m.k = istr(redis.call('INCR', SEQ))
  setm(id, m)
  setst(id, 'queued:' .. istr(now))
  push_ready(m, m.k .. ':' .. id, false)
end
-- the held job id settles waiting for a signal (data: the settlement's JSON
-- [name, count, deadline ms or null]): queued again at once when its mailbox has the
-- messages already (a signal raced with the settlement: event requeued), else
-- waiting_signal (event waiting_signal), due at the deadline if any. Its attempt was not counted (the caller took it back).
local function park_signal(id, m, now, W, data)
  local w = cjson.decode(data)
  m.w = nil
  m.s = nil
  if sig_count(id, w[1]) >= w[2] then
    sig_queue(id, m, now)
    ev('requeued', id, W, nil, nil, m.i)
    return
  end
  m.ws = w[1]
  m.wc = w[2]
  setm(id, m)
  setst(id, 'waiting_signal:' .. istr(now))
  ev('waiting_signal', id, W, nil, nil, m.i)
  if type(w[3]) == 'number' then to_delayed(id, w[3]) end
end
