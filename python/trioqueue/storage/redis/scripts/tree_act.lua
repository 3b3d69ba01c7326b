-- Acts on the notes of trees of jobs (TNOTES) that a script ending a job left (see
-- include tree), on every queue those trees span. ARGV: the queues' names (the first
-- the caller's); KEYS: the script's keys of each in turn. Returns {'need', names...}
-- (trees with a job on these queues span those too: nothing done, call again with them
-- declared) or 1.
--@include prelude
--@include groups
--@include queues
--@include tree
set_queues(ARGV)
local need = undeclared()
if need then return {'need', unpack(need)} end
tree_settle(now_ms())
flush()
return 1
