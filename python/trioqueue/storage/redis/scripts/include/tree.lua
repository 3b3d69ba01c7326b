-- Trees of jobs (one queue): what the end of a job does to its tree. TREE holds, per job
-- of a tree, {pa = parent, ch = {children}, po = on_child_failure, t = result TTL ms};
-- its META has tr (1: a parent, 2: has a parent). terminal() notes the tree jobs it ends
-- in TNOTES ('e' .. id; settle notes 'w' .. id for a job that waits for its children), and
-- tree_settle(now) acts on every note: the script that ended the job calls it before
-- flush() (settle leaves it to tree_act, right after; recover acts on any a crash left):
-- a parent is queued once no child is pending, failed (ChildJobFailedError)
-- at a child's failure under 'cancel' (its other children cancelled), a parent that ended
-- other than completed cancels its children, and a kept child gets its own TTL back once
-- its parent has ended.
local function tree_info(id)
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
-- a kept child's record gets its TTL (from now)
local function tree_release(c, st, now)
  local t = tree_info(c)
  local ttl = t and t.t or 0
  redis.call('ZADD', STATES, xidx(st, now + ttl), c)
  lower_sweep_at(now + ttl)
end
-- cancel a job because an ancestor ended (as cancel does), and its descendants
local function tree_cancel(c, now)
  local st = stpart(redis.call('HGET', JOBS, c))
  if not st then return end
  local kind = state_kind(st)
  local m = getm(c)
  if kind == 'queued' or kind == 'failing' or kind == 'delayed' or kind == 'waiting_children' then
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
    local t = tree_info(c)
    if t and t.ch then
      for _, g in ipairs(t.ch) do tree_cancel(g, now) end
    end
  end
end
-- the stored error of a parent failed by its children (failures: {{id, kind}...})
local function tree_error(p, failures)
  local parts, listed = {}, {}
  for _, f in ipairs(failures) do
    local c, typ, msg = f[1], 'JobCancelledError', "job '" .. f[1] .. "' was cancelled"
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
-- re-evaluate parent p; whether it is still to end (a kept child stays kept)
local function tree_eval(p, now)
  local pk = tree_kind(redis.call('HGET', JOBS, p))
  if TERMINAL_KIND[pk] then return false end
  if pk ~= 'waiting_children' and pk ~= 'processing' then return true end
  local t = tree_info(p) or {}
  local ch = t.ch or {}
  local failures, pending = {}, {}
  local sts = #ch > 0 and redis.call('HMGET', JOBS, unpack(ch)) or {}
  for k, c in ipairs(ch) do
    local kind = tree_kind(sts[k])
    if kind == 'failed' or kind == 'cancelled' then failures[#failures + 1] = {c, kind}
    elseif kind ~= 'completed' then pending[#pending + 1] = c end
  end
  local failing = #failures > 0 and (t.po or 'cancel') == 'cancel'
  if pk == 'processing' then
    if failing then
      for _, c in ipairs(pending) do tree_cancel(c, now) end
    end
    return true
  end
  local m = getm(p)
  if failing then
    local err = tree_error(p, failures)
    redis.call('HSET', ERRORS, p, err)
    ev('failed', p, nil, nil, small(err), m.i)
    terminal(p, m, now, m.t or 0, 'failed:' .. istr(now), '')
  elseif #pending == 0 then
    m.k = istr(redis.call('INCR', SEQ))
    setm(p, m)
    setst(p, 'queued:' .. istr(now))
    local LANE = lane_of(m)
    redis.call('RPUSH', LANE, m.k .. ':' .. p)
    pushed_to(m)
    ev('promoted', p, nil, nil, nil, m.i)
  end
  return true
end
local function tree_settle(now)
  while true do
    local note = redis.call('SPOP', TNOTES)
    if not note then break end
    local id = string.sub(note, 2)
    local t = string.sub(note, 1, 1) == 'e' and tree_info(id)
    if string.sub(note, 1, 1) == 'w' then tree_eval(id, now) end
    if t then
      if t.ch and #t.ch > 0 then
        local ok = tree_kind(redis.call('HGET', JOBS, id)) == 'completed'
        local sts = redis.call('HMGET', JOBS, unpack(t.ch))
        for k, c in ipairs(t.ch) do
          local st = stpart(sts[k])
          if st and TERMINAL_KIND[state_kind(st)] then
            tree_release(c, st, now)
          elseif st and not ok then
            tree_cancel(c, now)
          end
        end
      end
      if t.pa and not tree_eval(t.pa, now) then
        local st = stpart(redis.call('HGET', JOBS, id))
        if st then tree_release(id, st, now) end  -- its parent has ended: nobody needs it kept
      end
    end
  end
end
