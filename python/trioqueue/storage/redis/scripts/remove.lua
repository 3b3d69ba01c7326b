-- ARGV: id. Forgets a job that is not processing (its ready-list entry no longer matches
-- any metadata: dropped when met). Returns 1, or 0 (unknown or processing).
--@include prelude
--@include tree
local id = ARGV[1]
local now = now_ms()
if expired(id, now) then return 0 end
local st = redis.call('HGET', JOBS, id)
if not st or starts(st, 'processing:') then return 0 end
local m = getm(id) or {}
local t = m.tr and tree_info(id)
purge(id)
ev('removed', id, nil, nil, nil, m.i)
-- a removed child counts as cancelled for its parent
if t and t.pa then tree_eval(t.pa, now) end
tree_settle(now)
flush()
return 1
