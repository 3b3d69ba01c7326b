-- ARGV: id, name, entry (the message's stored form: storage._steps.encode_step).
-- Returns 'not_found' (unknown or terminal job: nothing written), 'woken' (appended, and
-- the job, waiting for it, is queued again: in its lane, publishing 'promoted', waking
-- the claims of every process) or 'delivered' (appended).
--@include prelude
--@include groups
--@include signal
local id, name, entry = ARGV[1], ARGV[2], ARGV[3]
local now = now_ms()
expired(id, now)
local v = redis.call('HGET', JOBS, id)
if not v or isrec(v) then return 'not_found' end
local field = '\254' .. id
redis.call('HSET', PROGRESS, field, (redis.call('HGET', PROGRESS, field) or '') .. entry)
if not starts(v, 'waiting_signal:') then return 'delivered' end
local m = getm(id)
if m.ws ~= name or sig_count(id, name) < (m.wc or 1) then return 'delivered' end
redis.call('ZREM', D, id)
sig_queue(id, m, now)
ev('promoted', id, nil, nil, nil, m.i)
flush()
return 'woken'
