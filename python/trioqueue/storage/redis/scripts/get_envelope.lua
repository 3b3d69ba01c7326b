-- ARGV: id. Returns the job's envelope, or false (unknown or expired).
--@include prelude
local id = ARGV[1]
expired(id, now_ms())
if not redis.call('HGET', JOBS, id) then return false end
return redis.call('HGET', ENV, id)
