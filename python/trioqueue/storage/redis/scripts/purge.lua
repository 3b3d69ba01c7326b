-- ARGV: terminal state kind, cutoff ms ('': all), slice size, offset. Forgets the jobs of
-- that kind that entered it at or before the cutoff, looking at up to a slice of the
-- kind's STATES range (ordered by when each job is forgotten, not by when it entered the
-- state) past the first `offset` entries, the ones earlier calls kept. Returns {how many
-- were forgotten, the offset for the next call, or false when the range is done}. A job
-- kept for a parent or dependent that waits is spared.
--@include prelude
local lo = KIND[ARGV[1]] * K44
local cutoff = ARGV[2] ~= '' and tonumber(ARGV[2]) or nil
local slice, offset = tonumber(ARGV[3]), tonumber(ARGV[4])
-- (short of the range's end: a job kept for a parent or dependent sits there, and no TTL runs for it)
local ids = redis.call('ZRANGEBYSCORE', STATES, istr(lo), istr(lo + K44 - 2), 'LIMIT', offset, slice)
local n = 0
for _, id in ipairs(ids) do
  local _, ms = split(stpart(redis.call('HGET', JOBS, id)) or '')
  if not cutoff or not ms or tonumber(ms) <= cutoff then
    purge(id)
    n = n + 1
  else
    offset = offset + 1
  end
end
if #ids < slice then return {n, false} end
return {n, offset}
