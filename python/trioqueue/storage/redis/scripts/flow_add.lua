-- Children added to a running job, in one step, on its queue or others (include queues:
-- KEYS holds the keys of each queue in turn). ARGV[1]: the children, JSON
-- [{id, q, pa, pq, ch, cq, po, t}...] (parents first; the direct children's pa is the job;
-- q: the index of the child's queue in ARGV[7]); ARGV[2]: the job; ARGV[3]: its worker;
-- ARGV[4]: its claim token; ARGV[5]: its on_child_failure if these are its first
-- children; ARGV[6]: the call token; ARGV[7]: JSON, the names of the queues (the job's
-- first; more may follow: queues of the job's ancestors); then the jobs as for enqueue.
-- Returns {'lost'} (the claim is not held, or the job is being cancelled: its cancel
-- request, or an ancestor failed or cancelled whose cascade (tree_act) is on its way;
-- nothing written), {'need', queue} (an ancestor is on that queue, not declared: nothing
-- done, call again with it declared after the others), {'exists', id} or {'ok'}.
--@include prelude
--@include groups
--@include delay
--@include queues
set_queues(cjson.decode(ARGV[7]))  -- (a statement first: the locals below are the call's own)
local tree = cjson.decode(ARGV[1])
local P_ID, P_W, P_CLAIM, P_POLICY = ARGV[2], ARGV[3], ARGV[4], ARGV[5]
expired(P_ID, now_ms())
local pst = stpart(redis.call('HGET', JOBS, P_ID))
local pm = getm(P_ID)
if not (pst and starts(pst, 'processing:') and pm and pm.w == P_W and pm.l == P_CLAIM) then return {'lost'} end
if pm.x == 1 then return {'lost'} end  -- a cancel request: no child may start after it
do  -- an ancestor that ended failed or cancelled: the job is being cancelled too
  local aq, aid = QN[1], P_ID
  for _ = 1, 64 do
    use_queue(aq)
    local raw = redis.call('HGET', TREE, aid)
    local t = raw and cjson.decode(raw)
    if not (t and t.pa) then break end
    aq, aid = t.pq or aq, t.pa
    if not QAT[aq] then return {'need', aq} end
    use_queue(aq)
    local ast = stpart(redis.call('HGET', JOBS, aid))
    local ak = ast and state_kind(ast)
    if ak == 'failed' or ak == 'cancelled' then return {'lost'} end
    if not ak or ak == 'completed' then break end  -- (a completed one cancels nothing below it)
  end
  use_queue(QN[1])
end
local now0 = now_ms()
for _, job in ipairs(tree) do
  use_queue(QN[job.q])
  expired(job.id, now0)
  local st = stpart(redis.call('HGET', JOBS, job.id))
  if st and not starts(st, 'cancelled:') then return {'exists', job.id} end
end
local groups = tree_argv(tree, ARGV, ARGV[6], 7)
for qi = 1, #QN do
  if groups[qi] then
    use_queue(QN[qi])
    local ARGV = groups[qi]
    local A = 1  -- the call token's position in ARGV
--@include enqueue
  end
end
local nows = istr(now0)
local PQ = QN[1]
use_queue(PQ)
local pt = cjson.decode(redis.call('HGET', TREE, P_ID) or '{}')
if not pt.ch then pt.ch = {}; pt.po = P_POLICY end
if not pt.t then pt.t = pm.t or 0 end
for _, job in ipairs(tree) do
  use_queue(QN[job.q])
  local q = QN[job.q]
  job.q = nil
  local m = getm(job.id)
  m.tr = 2
  if job.ch then
    m.k = -1
    setst(job.id, 'waiting_children:' .. nows)
  end
  setm(job.id, m)
  redis.call('HSET', TREE, job.id, cjson.encode(job))
  if job.pa == P_ID and (job.pq or q) == PQ then  -- (pq: only where it is not the child's own)
    if q ~= PQ and not pt.cq then  -- its first child on another queue: every child's queue named
      pt.cq = {}
      for k = 1, #pt.ch do pt.cq[k] = PQ end
    end
    pt.ch[#pt.ch + 1] = job.id
    if pt.cq then pt.cq[#pt.ch] = q end
  end
end
use_queue(PQ)
redis.call('HSET', TREE, P_ID, cjson.encode(pt))
pm = getm(P_ID)
if not pm.tr then pm.tr = 1; setm(P_ID, pm) end
if #QN > 1 then link_queues(QN) end
flush()
return {'ok'}
