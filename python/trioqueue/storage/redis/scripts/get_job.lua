-- ARGV: id. Returns false or {state, created_ms, attempts, max_attempts, result, error,
-- token, progress, priority}.
--@include prelude
local id = ARGV[1]
expired(id, now_ms())
return report(id)
