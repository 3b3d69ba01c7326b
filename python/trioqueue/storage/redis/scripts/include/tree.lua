-- Trees of jobs: what the end of a job does to its tree (include queues first: a tree
-- may span queues, and a job is named by its queue and id). TREE holds, per job of a
-- tree, {pa = parent, pq = the parent's queue, ch = {children}, cq = {their queues, in
-- the order of ch}, po = on_child_failure, t = result TTL ms} (pq and cq only where a
-- queue differs from the job's own); its META has tr (1: a parent, 2: has a parent).
-- The scripts that end a job note it in its queue's TNOTES and tell their caller, which
-- runs tree_act (TNOTES of a crashed caller: the reaper's recover finds them). A note:
-- 'e' .. id (the job ended), 'w' .. id (it waits for its children), 'c' .. id (it was
-- cancelled while running: its children are), 'u' .. JSON [queue or '', parent] (a
-- child or a dependency of that job was removed), 'd' .. JSON [queue or '', parent, id] (as
-- 'u', but job id of this queue had completed: it is dropped from the parent's lists), 'r' .. JSON [queue or '', id] (a parent
-- or a dependent of that job was removed). tree_settle(now) acts on every note of every
-- declared queue: a parent is queued once no child is pending, failed
-- (ChildJobFailedError) at a child's failure under 'cancel' (its other children
-- cancelled; waiting for them or for a signal, or back in the queue for a run of its
-- own; a running one gets m.cf = 1 and settle fails its run whatever it ends with), a
-- parent that ended other than completed cancels its children, and a kept child gets
-- its own TTL back once its parent has ended. Dependencies (depends_on): a dependent's
-- entry has dp (their ids) and dq (their queues), a dependency's ds (its dependents) and
-- dsq (their queues); a dependent counts its dependencies as its children (but never
-- cancels them), and a dependency is kept until no parent or dependent of it is waiting.
local function tree_info(q, id)
  use_queue(q)
  local raw = redis.call('HGET', TREE, id)
  if raw then return cjson.decode(raw) end
  return nil
end
local function tree_kind(v)
  local st = stpart(v)
  if not st then return 'cancelled' end  -- gone (removed): counted as cancelled
  return state_kind(st)
end
local TERMINAL_KIND = {completed = true, failed = true, cancelled = true}
-- the queue of child k of the job of tree entry t, on queue q
local function kid_q(t, k, q) return t.cq and t.cq[k] or q end
-- whether job c of queue cq is still a child of job p of queue q: a child cancelled or
-- removed and then enqueued again under its id is a job of its own, outside the tree
local function still_kid(cq, c, q, p)
  local ct = tree_info(cq, c)
  return ct ~= nil and ct.pa == p and (ct.pq or cq) == q
end
-- whether job d of queue dq still lists job p of queue q as a dependent (depends_on): a
-- dependency removed, or cancelled and enqueued again as a job of its own, does not
local function still_dep(dq, d, q, p)
  local dt = tree_info(dq, d)
  if not dt or not dt.ds then return false end
  for k, x in ipairs(dt.ds) do
    if x == p and dt.dsq[k] == q then return true end
  end
  return false
end
-- whether job p of queue q (a parent or a dependent) has not ended and still waits for
-- job c of queue cq: as a child (kid), or as a dependency
local function waits_for(q, p, cq, c, kid)
  local pt = tree_info(q, p)
  if not pt then return false end
  local pk = tree_kind(redis.call('HGET', JOBS, p))
  if TERMINAL_KIND[pk] then return false end
  local list, qs = pt.ch, pt.cq
  if not kid then list, qs = pt.dp, pt.dq end
  for k, x in ipairs(list or {}) do
    if x == c and ((qs and qs[k]) or q) == cq then return true end
  end
  return false
end
-- whether the ended job c of queue cq is still needed (kept) by its parent or a dependent
local function still_needed(cq, c)
  local ct = tree_info(cq, c)
  if not ct then return false end
  if ct.pa and waits_for(ct.pq or cq, ct.pa, cq, c, true) then return true end
  for k, d in ipairs(ct.ds or {}) do
    if waits_for(ct.dsq[k], d, cq, c, false) then return true end
  end
  return false
end
-- whether job c of queue cq, a child (kid) or a dependency of job p of queue q, was
-- removed after it completed and the 'd' note that drops it from p's lists waits in cq's
-- TNOTES (it counts as completed meanwhile)
local function removed_done(cq, c, q, p, kid)
  use_queue(cq)
  local pq = q
  if kid and q == cq then pq = '' end
  return redis.call('SISMEMBER', TNOTES, 'd' .. cjson.encode({pq, p, c})) == 1
end
-- the registry values of the children of t (job p, on queue q), in order; false for a
-- child that is no longer of the tree (it counts as cancelled, as a removed one)
local function kid_states(t, q, p)
  local sts = {}
  for k, c in ipairs(t.ch or {}) do
    local cq = kid_q(t, k, q)
    sts[k] = still_kid(cq, c, q, p) and redis.call('HGET', JOBS, c) or false
  end
  return sts
end
-- job c of queue cq, removed after it completed, is no longer listed by job p of queue pq
-- (its parent or a dependent)
local function drop_done(pq, p, cq, c)
  local t = tree_info(pq, p)
  if not t then return end
  local function drop(list, qs, own)
    if not list then return list, qs end
    local l2, q2 = {}, {}
    for k, x in ipairs(list) do
      local xq = qs and qs[k] or own
      if not (x == c and xq == cq) then
        l2[#l2 + 1] = x
        if qs then q2[#q2 + 1] = qs[k] end
      end
    end
    if not qs then q2 = nil end
    if #l2 == 0 then return nil, nil end
    return l2, q2
  end
  t.ch, t.cq = drop(t.ch, t.cq, pq)
  t.dp, t.dq = drop(t.dp, t.dq, nil)
  use_queue(pq)
  redis.call('HSET', TREE, p, cjson.encode(t))
end
-- a kept child's (or dependency's) record gets its TTL (from now), unless a parent or a
-- dependent of it still needs it
local function tree_release(q, c, st, now)
  if still_needed(q, c) then return end
  local t = tree_info(q, c)
  local ttl = t and t.t or 0
  redis.call('ZADD', STATES, xidx(st, now + ttl), c)
  lower_sweep_at(now + ttl)
end
-- cancel a job because an ancestor ended (as cancel does), and its descendants
local function tree_cancel(q, c, now)
  use_queue(q)
  local st = stpart(redis.call('HGET', JOBS, c))
  if not st then return end
  local kind = state_kind(st)
  local m = getm(c)
  if kind == 'queued' or kind == 'failing' or kind == 'delayed' or kind == 'waiting_children' or kind == 'waiting_signal' then
    m.k = -1
    redis.call('ZREM', D, c)
    ev('cancelled', c, nil, nil, nil, m.i)
    terminal(c, m, now, m.t or 0, 'cancelled:' .. istr(now), '')
  elseif kind == 'processing' then
    if m.x ~= 1 then
      m.x = 1
      setm(c, m)
      ev('cancel_requested', c, m.w, nil, nil, m.i)
    end
    local t = tree_info(q, c)
    if t and t.ch then
      for k, g in ipairs(t.ch) do
        if still_kid(kid_q(t, k, q), g, q, c) then tree_cancel(kid_q(t, k, q), g, now) end
      end
    end
  end
end
-- the stored error of a parent failed by its children (failures: {{id, kind, queue}...})
local function tree_error(p, failures)
  local parts, listed = {}, {}
  for _, f in ipairs(failures) do
    local c, typ, msg = f[1], 'JobCancelledError', "job '" .. f[1] .. "' was cancelled"
    use_queue(f[3])
    local e = f[2] == 'failed' and redis.call('HGET', ERRORS, c)
    if e then
      local ok, d = pcall(cjson.decode, e)
      if ok and type(d) == 'table' then typ = tostring(d.type or 'Error'); msg = tostring(d.message or '') end
    end
    parts[#parts + 1] = c .. ': ' .. typ .. ': ' .. msg
    listed[c] = {type = typ, message = msg}
  end
  return cjson.encode({type = 'ChildJobFailedError', traceback = cjson.encode(listed),
    message = "job '" .. p .. "' failed because of its children: " .. table.concat(parts, '; ')})
end
-- re-evaluate parent p of queue q; whether it is still to end (a kept child stays kept)
local function tree_eval(q, p, now)
  use_queue(q)
  local pk = tree_kind(redis.call('HGET', JOBS, p))
  if TERMINAL_KIND[pk] then return false end
  -- back for a run of its own (the run that added its children was cut short), or
  -- waiting for a signal (a child's failure under 'cancel' fails it as well)
  local back = pk == 'queued' or pk == 'failing' or pk == 'delayed' or pk == 'waiting_signal'
  if pk ~= 'waiting_children' and pk ~= 'processing' and not back then return true end
  local t = tree_info(q, p) or {}
  local failures, pending = {}, {}
  local present = false  -- a failure of a child still there (not one removed)
  local sts = kid_states(t, q, p)
  for k, c in ipairs(t.ch or {}) do
    local kind = tree_kind(sts[k])
    if not sts[k] and removed_done(kid_q(t, k, q), c, q, p, true) then kind = 'completed' end
    if kind == 'failed' or kind == 'cancelled' then
      failures[#failures + 1] = {c, kind, kid_q(t, k, q)}
      if sts[k] then present = true end
    elseif kind ~= 'completed' then pending[#pending + 1] = {c, kid_q(t, k, q)} end
  end
  local waiting = #pending  -- its dependencies count as its children do (never cancelled by it)
  for k, d in ipairs(t.dp or {}) do
    local dq = t.dq[k]
    local v = still_dep(dq, d, q, p) and redis.call('HGET', JOBS, d) or false
    local kind = tree_kind(v)
    if not v and removed_done(dq, d, q, p, false) then kind = 'completed' end
    if kind == 'failed' or kind == 'cancelled' then
      failures[#failures + 1] = {d, kind, dq}
      if v then present = true end
    elseif kind ~= 'completed' then waiting = waiting + 1 end
  end
  local failing = #failures > 0 and (t.po or 'cancel') == 'cancel'
  if pk == 'processing' then
    if failing then
      -- its run fails whatever it ends with (settle), as waiting for them would
      use_queue(q)
      local m = getm(p)
      if m and m.cf ~= 1 then m.cf = 1; setm(p, m) end
      for _, c in ipairs(pending) do tree_cancel(c[2], c[1], now) end
    end
    return true
  end
  if back and not (failing and present) then return true end
  if failing then
    local err = tree_error(p, failures)
    use_queue(q)
    local m = getm(p)
    if back then  -- out of its lane (the entry left there is skipped) or the delayed set
      m.k = -1
      redis.call('ZREM', D, p)
    end
    redis.call('HSET', ERRORS, p, err)
    ev('failed', p, nil, nil, small(err), m.i)
    terminal(p, m, now, m.t or 0, 'failed:' .. istr(now), '')
  elseif waiting == 0 then
    use_queue(q)
    local m = getm(p)
    m.k = istr(redis.call('INCR', SEQ))
    setm(p, m)
    setst(p, 'queued:' .. istr(now))
    push_ready(m, m.k .. ':' .. p, false)
    ev('promoted', p, nil, nil, nil, m.i)
  end
  return true
end
-- act on one note of queue q's TNOTES
local function tree_note(q, note, now)
  local kind, id = string.sub(note, 1, 1), string.sub(note, 2)
  if kind == 'w' then tree_eval(q, id, now) return end
  if kind == 'u' then
    local d = cjson.decode(id)
    tree_eval(d[1] ~= '' and d[1] or q, d[2], now)
    return
  end
  if kind == 'd' then  -- job d[3] of q, removed after it completed, is no longer listed by d[2] of queue d[1] (or q)
    local d = cjson.decode(id)
    local pq = d[1] ~= '' and d[1] or q
    drop_done(pq, d[2], q, d[3])
    tree_eval(pq, d[2], now)
    return
  end
  if kind == 'r' then  -- a parent or dependent of job d[2] of queue d[1] (or q) was removed: kept only if still needed
    local d = cjson.decode(id)
    local dq = d[1] ~= '' and d[1] or q
    use_queue(dq)
    local st = stpart(redis.call('HGET', JOBS, d[2]))
    local s = tonumber(redis.call('ZSCORE', STATES, d[2]) or '0')
    if st and TERMINAL_KIND[state_kind(st)] and s % K44 == K44 - 1 then  -- (kept: at the end of time)
      tree_release(dq, d[2], st, now)
    end
    return
  end
  local t = tree_info(q, id)
  if not t then return end
  if t.ch and #t.ch > 0 then
    local ok = kind == 'e' and tree_kind(redis.call('HGET', JOBS, id)) == 'completed'
    local sts = kid_states(t, q, id)
    for k, c in ipairs(t.ch) do
      local st = stpart(sts[k])
      if st and TERMINAL_KIND[state_kind(st)] then
        if kind == 'e' then tree_release(kid_q(t, k, q), c, st, now) end
      elseif st and not ok then
        tree_cancel(kid_q(t, k, q), c, now)
      end
    end
  end
  if kind == 'e' and t.dp then  -- its dependencies are no longer needed by it
    for k, d in ipairs(t.dp) do
      local dq = t.dq[k]
      if still_dep(dq, d, q, id) then
        local st = stpart(redis.call('HGET', JOBS, d))
        if st and TERMINAL_KIND[state_kind(st)] then tree_release(dq, d, st, now) end
      end
    end
  end
  if kind == 'e' and (t.pa or t.ds) then
    if t.pa then tree_eval(t.pq or q, t.pa, now) end
    for k, d in ipairs(t.ds or {}) do tree_eval(t.dsq[k], d, now) end
    use_queue(q)
    local st = stpart(redis.call('HGET', JOBS, id))
    if st then tree_release(q, id, st, now) end  -- kept only while a parent or a dependent needs it
  end
end
local function tree_settle(now)
  local more = true
  while more do
    more = false
    for _, q in ipairs(QN) do
      use_queue(q)
      local note = redis.call('SPOP', TNOTES)
      while note do
        more = true
        tree_note(q, note, now)
        use_queue(q)
        note = redis.call('SPOP', TNOTES)
      end
    end
  end
end
