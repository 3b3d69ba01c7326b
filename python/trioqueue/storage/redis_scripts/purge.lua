-- ARGV: terminal state kind, cutoff ms ('': all), slice size. Forgets up to a slice of
-- the oldest jobs of that kind that entered it at or before the cutoff; returns how many
-- (the caller repeats while a whole slice went).
--@include _prelude
local lo = KIND[ARGV[1]] * K44
local hi = ARGV[2] == '' and lo + K44 - 1 or lo + tonumber(ARGV[2])
local ids = redis.call('ZRANGEBYSCORE', STATES, string.format('%.0f', lo), string.format('%.0f', hi),
  'LIMIT', 0, tonumber(ARGV[3]))
for _, id in ipairs(ids) do purge(id) end
return #ids
