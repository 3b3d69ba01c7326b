-- ARGV: id. Returns false or {state, created_ms, attempts, max_attempts, result, error,
-- token, progress, priority, group, tree (JSON: the job's parent and children, or false)}.
--@include prelude
local id = ARGV[1]
expired(id, now_ms())
local r = report(id)
if r then r[11] = redis.call('HGET', TREE, id) or false end
return r
