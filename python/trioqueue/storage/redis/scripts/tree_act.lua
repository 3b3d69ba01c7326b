-- Acts on the notes of trees of jobs (TNOTES) that a settle left (see include tree).
-- Returns 1.
--@include prelude
--@include tree
local now = now_ms()
tree_settle(now)
flush()
return 1
