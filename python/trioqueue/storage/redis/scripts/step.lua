-- ARGV: worker, id, claim token, entry (a step's stored form: storage._steps.encode_step).
-- Appends the entry to the job's steps if the worker holds the claim. A job's steps are
-- the field '\255' .. id of PROGRESS (a byte no UTF-8 id holds: _keys.STEP_FIELD), so
-- that forgetting the job's progress (purge, clear) forgets them with no key more.
-- Returns 1 if stored, 0 if the claim is not held.
--@include prelude
local W, id, claim, entry = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
local st = redis.call('HGET', JOBS, id)
local m = st and getm(id) or nil
if not (m and starts(st, 'processing:') and m.w == W and m.l == claim) then return 0 end
local field = '\255' .. id
redis.call('HSET', PROGRESS, field, (redis.call('HGET', PROGRESS, field) or '') .. entry)
return 1
