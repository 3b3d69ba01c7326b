-- ARGV: groups whose slot a settlement freed while they were full (settle.lua says which):
-- each goes back in the ring of each priority where it has ready jobs (waking claimers).
--@include prelude
--@include groups
for _, g in ipairs(ARGV) do group_requeue(g) end
flush()
return 1
