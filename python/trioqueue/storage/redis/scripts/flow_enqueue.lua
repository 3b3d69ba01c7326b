-- A tree of jobs (one queue), in one step. ARGV[1]: the tree, JSON [{id, pa, ch, po, t}...]
-- (root first); ARGV[2]: the call token, then the jobs as for enqueue (id, envelope,
-- '<max_attempts>:<result_ttl_ms>[:<priority>]', incarnation token, run-at ms or '').
-- Returns {'dup'} (the root's id is known: nothing written, enqueue says what it is),
-- {'exists', id} (a child's id is known: nothing written) or {'ok'}. Parents enter
-- 'waiting_children' (their ready-list entries go stale: a new one when they are queued).
--@include prelude
--@include delay
local tree = cjson.decode(ARGV[1])
local now0 = now_ms()
for j, job in ipairs(tree) do
  expired(job.id, now0)
  local st = stpart(redis.call('HGET', JOBS, job.id))
  if st and not starts(st, 'cancelled:') then
    if j == 1 then return {'dup'} end
    return {'exists', job.id}
  end
end
local A = 2  -- the call token's position in ARGV
--@include enqueue
for _, job in ipairs(tree) do
  local m = getm(job.id)
  m.tr = job.pa and 2 or 1
  if job.ch then
    m.k = -1
    setst(job.id, 'waiting_children:' .. nows)
  end
  setm(job.id, m)
  redis.call('HSET', TREE, job.id, cjson.encode(job))
end
return {'ok'}
