-- ARGV: id, incarnation token. A failed or cancelled job whose envelope is kept goes back
-- to the ready list (its priority's lane) as a new incarnation (attempts 0). Returns 1, or 0 (nothing changed).
--@include prelude
--@include groups
local id, token = ARGV[1], ARGV[2]
local now = now_ms()
if expired(id, now) then return 0 end
local st = stpart(redis.call('HGET', JOBS, id))
if not (starts(st, 'failed:') or starts(st, 'cancelled:')) then return 0 end
if redis.call('HEXISTS', ENV, id) == 0 then return 0 end
local old = getm(id) or {}
local tok = redis.call('INCR', SEQ)
redis.call('HDEL', ERRORS, id)
redis.call('HDEL', PROGRESS, id)
local m = {a = 0, m = old.m or 1, t = old.t or 0, k = tok, c = now, i = token, n = 0, s = 0, x = 0, p = old.p, g = old.g}
setm(id, m)
setst(id, 'queued:' .. now)
push_ready(m, tok .. ':' .. id, false)  -- its own priority's (and group's) lane
ev('enqueued', id, nil, nil, nil, token)
flush()
return 1
