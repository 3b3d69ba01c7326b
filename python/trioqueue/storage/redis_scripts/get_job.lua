-- ARGV: id. Returns false or {state, created_ms, attempts, max_attempts, result, error,
-- token, progress, priority}.
--@include _prelude
local id = ARGV[1]
expired(id, now_ms())
local st = redis.call('HGET', JOBS, id)
if not st then return false end
local m = getm(id) or {}
return {st, tostring(m.c or 0), tostring(m.a or 0), tostring(m.m or 0),
        redis.call('HGET', RESULTS, id), redis.call('HGET', ERRORS, id),
        m.i or false, redis.call('HGET', PROGRESS, id), m.p or DEFAULT_PRIORITY}
