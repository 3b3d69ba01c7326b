-- A tree of jobs, in one step, on one queue or several (include queues: KEYS holds the
-- keys of each queue in turn). ARGV[1]: the tree, JSON [{id, q, pa, pq, ch, cq, po, t}...]
-- (root first; q: the index of the job's queue in ARGV[3]; pq, cq: see include tree);
-- ARGV[2]: the call token; ARGV[3]: JSON, the names of the queues (the root's first);
-- then the jobs as for enqueue (id, envelope, '<max_attempts>:<result_ttl_ms>[:<priority>]',
-- incarnation token, run-at ms or ''), in the tree's order.
-- Returns {'dup'} (the root's id is known: nothing written, enqueue says what it is),
-- {'exists', id} (a child's id is known: nothing written), {'nodep', id, dependency,
-- its queue} (a dependency is unknown: nothing written) or {'ok'}. Parents and
-- dependents (dp: the ids of their dependencies, dq: their queues, all among ARGV[3])
-- enter 'waiting_children' (their ready-list entries go stale: a new one when they are
-- queued). A dependency lists its dependents in its TREE entry (ds, dsq) and is kept
-- (m.dd; ended already: its STATES score at the end of time) until they have ended;
-- a dependent is noted 'w' (the caller runs tree_act: a dependency that ended counts at once).
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
for _, job in ipairs(tree) do
  for k, d in ipairs(job.dp or {}) do
    use_queue(job.dq[k])
    expired(d, now0)
    if not redis.call('HGET', JOBS, d) then return {'nodep', job.id, d, job.dq[k]} end
  end
end
-- each queue's jobs as one enqueue call's
local groups = tree_argv(tree, ARGV, ARGV[2], 3)
for qi = 1, #QN do
  use_queue(QN[qi])
  local ARGV = groups[qi]
  if ARGV then  -- (a queue of dependencies only has no job written)
  local A = 1  -- the call token's position in ARGV
--@include enqueue
  end
end
local nows = istr(now0)
local tree_q = {}
for qi, job in ipairs(tree) do
  use_queue(QN[job.q])
  tree_q[qi] = job.q
  job.q = nil
  local m = getm(job.id)
  m.tr = job.pa and 2 or 1
  if job.ch or job.dp then
    m.k = -1
    setst(job.id, 'waiting_children:' .. nows)
  end
  setm(job.id, m)
  redis.call('HSET', TREE, job.id, cjson.encode(job))
  if job.dp then redis.call('SADD', TNOTES, 'w' .. job.id) end
end
for qi, job in ipairs(tree) do
  for k, d in ipairs(job.dp or {}) do
    local jq = QN[tree_q[qi]]
    use_queue(job.dq[k])
    local raw = redis.call('HGET', TREE, d)
    local dt = raw and cjson.decode(raw) or {}
    local v = redis.call('HGET', JOBS, d)
    if isrec(v) then  -- ended already: kept (its score at the end of time) for its dependents
      if not dt.t then  -- (what it had left of its TTL, given back once they have ended)
        local s = tonumber(redis.call('ZSCORE', STATES, d)) or 0
        dt.t = math.max(0, s - math.floor(s / K44) * K44 - now0)
      end
      redis.call('ZADD', STATES, xidx(stpart(v), K44), d)
    else
      local dm = getm(d)
      dm.tr = dm.tr or 3  -- (3: a dependency only, outside any tree)
      dm.dd = 1
      setm(d, dm)
      dt.t = dt.t or dm.t or 0
    end
    dt.ds = dt.ds or {}
    dt.dsq = dt.dsq or {}
    dt.ds[#dt.ds + 1] = job.id
    dt.dsq[#dt.dsq + 1] = jq
    redis.call('HSET', TREE, d, cjson.encode(dt))
  end
end
if #QN > 1 then link_queues(QN) end
flush()
return {'ok'}
