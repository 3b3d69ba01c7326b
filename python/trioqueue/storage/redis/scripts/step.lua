-- ARGV: groups of four: worker, id, claim token, entry (a step's stored form:
-- storage._steps.encode_step), one group a step save (the concurrent saves of a queue
-- ride in one call: storage._coalesce).
-- Appends each entry to its job's steps if the worker holds the claim. A job's steps are
-- the field '\255' .. id of PROGRESS (a byte no UTF-8 id holds: _keys.STEP_FIELD), so
-- that forgetting the job's progress (purge, clear) forgets them with no key more.
-- Returns, a group each, 1 if stored, 0 if the claim is not held.
--@include prelude
local out = {}
for i = 1, #ARGV, 4 do
  local W, id, claim, entry = ARGV[i], ARGV[i + 1], ARGV[i + 2], ARGV[i + 3]
  local st = redis.call('HGET', JOBS, id)
  local m = st and getm(id) or nil
  if m and starts(st, 'processing:') and m.w == W and m.l == claim then
    local field = '\255' .. id
    redis.call('HSET', PROGRESS, field, (redis.call('HGET', PROGRESS, field) or '') .. entry)
    out[#out + 1] = 1
  else
    out[#out + 1] = 0
  end
end
return out
