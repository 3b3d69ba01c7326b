-- A tree of jobs, in one step, on one queue or several (include queues: KEYS holds the
-- keys of each queue in turn). ARGV[1]: the tree, JSON [{id, q, pa, pq, ch, cq, po, t}...]
-- (root first; q: the index of the job's queue in ARGV[3]; pq, cq: see include tree);
-- ARGV[2]: the call token; ARGV[3]: JSON, the names of the queues (the root's first);
-- then the jobs as for enqueue (id, envelope, '<max_attempts>:<result_ttl_ms>[:<priority>]',
-- incarnation token, run-at ms or ''), in the tree's order.
-- Returns {'dup'} (the root's id is known: nothing written, enqueue says what it is),
-- {'exists', id} (a child's id is known: nothing written) or {'ok'}. Parents enter
-- 'waiting_children' (their ready-list entries go stale: a new one when they are queued).
--@include prelude
--@include groups
--@include delay
--@include queues
set_queues(cjson.decode(ARGV[3]))  -- (a statement first: the locals below are the call's own)
local tree = cjson.decode(ARGV[1])
local now0 = now_ms()
for j, job in ipairs(tree) do
  use_queue(QN[job.q])
  expired(job.id, now0)
  local st = stpart(redis.call('HGET', JOBS, job.id))
  if st and not starts(st, 'cancelled:') then
    if j == 1 then return {'dup'} end
    return {'exists', job.id}
  end
end
-- each queue's jobs as one enqueue call's
local groups = tree_argv(tree, ARGV, ARGV[2], 3)
for qi = 1, #QN do
  use_queue(QN[qi])
  local ARGV = groups[qi]
  local A = 1  -- the call token's position in ARGV
--@include enqueue
end
local nows = istr(now0)
for _, job in ipairs(tree) do
  use_queue(QN[job.q])
  job.q = nil
  local m = getm(job.id)
  m.tr = job.pa and 2 or 1
  if job.ch then
    m.k = -1
    setst(job.id, 'waiting_children:' .. nows)
  end
  setm(job.id, m)
  redis.call('HSET', TREE, job.id, cjson.encode(job))
end
if #QN > 1 then link_queues(QN) end
flush()
return {'ok'}
