-- ARGV: group, '1' pause, '0' resume. Returns 1 if the flag changed. A paused group
-- leaves the rings at its next turn; resuming puts it back in them (include groups),
-- which wakes blocked claimers.
--@include prelude
--@include groups
local g, want = ARGV[1], ARGV[2] == '1'
local changed
if want then
  changed = redis.call('SADD', GPAUSED, g)
else
  changed = redis.call('SREM', GPAUSED, g)
  if changed == 1 then group_requeue(g) end
end
flush()
return changed
