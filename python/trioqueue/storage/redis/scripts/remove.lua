-- ARGV: id. Forgets a job that is not processing (its ready-list entry no longer matches
-- any metadata: dropped when met). Returns 1, or 0 (unknown or processing).
--@include prelude
local id = ARGV[1]
if expired(id, now_ms()) then return 0 end
local st = redis.call('HGET', JOBS, id)
if not st or starts(st, 'processing:') then return 0 end
local m = getm(id) or {}
purge(id)
ev('removed', id, nil, nil, nil, m.i)
flush()
return 1
