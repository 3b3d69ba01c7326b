-- ARGV: call token, then (id, envelope, '<max_attempts>:<result_ttl_ms>[:<priority>]',
-- incarnation token, run-at ms or '') per job (no priority: the default).
-- Returns per job {'q'} | {'d', state, token} | {'c', state, result, token}.
-- The work is the fragment enqueue's (schedule_tick.lua runs it too).
--@include prelude
--@include groups
--@include delay
local A = 1  -- the call token's position in ARGV
--@include enqueue
return out
