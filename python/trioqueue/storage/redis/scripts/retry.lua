-- ARGV: id, incarnation token, reset steps ('1': forget the job's stored steps; else they
-- are kept: the run resumes after the last one). A failed or cancelled job whose envelope
-- is kept goes back to the ready list (its priority's lane) as a new incarnation
-- (attempts 0), a job of its own: out of its tree (no parent, children, dependencies or
-- dependents: a waiting parent or dependent counted its end already). Returns 1, or 0
-- (nothing changed).
--@include prelude
--@include groups
local id, token, reset = ARGV[1], ARGV[2], ARGV[3]
local now = now_ms()
if expired(id, now) then return 0 end
local st = stpart(redis.call('HGET', JOBS, id))
if not (starts(st, 'failed:') or starts(st, 'cancelled:')) then return 0 end
if redis.call('HEXISTS', ENV, id) == 0 then return 0 end
local old = getm(id) or {}
local tok = redis.call('INCR', SEQ)
redis.call('HDEL', ERRORS, id)
redis.call('HDEL', PROGRESS, id)
redis.call('HDEL', TREE, id)
if reset == '1' then redis.call('HDEL', PROGRESS, '\255' .. id) end  -- its steps (step.lua)
local m = {a = 0, m = old.m or 1, t = old.t or 0, k = tok, c = now, i = token, n = 0, s = 0, x = 0, p = old.p, g = old.g}
setm(id, m)
setst(id, 'queued:' .. now)
push_ready(m, tok .. ':' .. id, false)  -- its own priority's (and group's) lane
ev('enqueued', id, nil, nil, nil, token)
flush()
return 1
