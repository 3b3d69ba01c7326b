-- Children added to a running job (one queue), in one step. ARGV[1]: the children, JSON
-- [{id, pa, ch, po, t}...] (parents first; the direct children's pa is the job);
-- ARGV[2]: the job; ARGV[3]: its worker; ARGV[4]: its claim token; ARGV[5]: its
-- on_child_failure if these are its first children; ARGV[6]: the call token, then the
-- jobs as for enqueue. Returns {'lost'} (the claim is not held: nothing written),
-- {'exists', id} or {'ok'}.
--@include prelude
--@include delay
expired(ARGV[2], now_ms())  -- (a statement first: the locals below are the call's own)
local tree = cjson.decode(ARGV[1])
local P_ID, P_W, P_CLAIM, P_POLICY = ARGV[2], ARGV[3], ARGV[4], ARGV[5]
local pst = stpart(redis.call('HGET', JOBS, P_ID))
local pm = getm(P_ID)
if not (pst and starts(pst, 'processing:') and pm and pm.w == P_W and pm.l == P_CLAIM) then return {'lost'} end
local now0 = now_ms()
for _, job in ipairs(tree) do
  expired(job.id, now0)
  local st = stpart(redis.call('HGET', JOBS, job.id))
  if st and not starts(st, 'cancelled:') then return {'exists', job.id} end
end
local A = 6  -- the call token's position in ARGV
--@include enqueue
local pt = cjson.decode(redis.call('HGET', TREE, P_ID) or '{}')
if not pt.ch then pt.ch = {}; pt.po = P_POLICY end
if not pt.t then pt.t = pm.t or 0 end
for _, job in ipairs(tree) do
  local m = getm(job.id)
  m.tr = 2
  if job.ch then
    m.k = -1
    setst(job.id, 'waiting_children:' .. nows)
  end
  setm(job.id, m)
  redis.call('HSET', TREE, job.id, cjson.encode(job))
  if job.pa == P_ID then pt.ch[#pt.ch + 1] = job.id end
end
redis.call('HSET', TREE, P_ID, cjson.encode(pt))
pm = getm(P_ID)
if not pm.tr then pm.tr = 1; setm(P_ID, pm) end
return {'ok'}
