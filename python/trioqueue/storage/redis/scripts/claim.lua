-- KEYS[QK + 1]: the worker's processing list; the last two KEYS: the rate log and the flow hash.
-- ARGV: worker, max_jobs, lease_ms, moved entry ('' if none, '*': the list's last entry,
-- the script being pipelined behind the blocking move), reconcile ('1': also claim
-- entries of the worker's list that a blocking move put there but no claim followed),
-- start (the first `start` claims count their attempt; the rest are reserved),
-- rate, per_ms, concurrency, group_concurrency, group_rate, group_per_ms (flow limits, 0:
-- none; see ClaimLimits).
-- Returns {{id, envelope, attempts, claim token, started, id, ...} (five entries a claim),
-- next due ms or false
-- (with flow control: or the next token / end of the hold), 1 if a ready list still holds
-- entries (else 0), false or the control stream's last id when claiming is paused or
-- refused by flow control}.
--@include prelude
--@include groups
--@include promote
local P = KEYS[QK + 1]
local W, MX, LEASE, MOVED, RECONCILE, START = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3]), ARGV[4], ARGV[5], tonumber(ARGV[6])
local now = now_ms()
redis.call('SADD', PROCS, W)
promote(now)
local paused = redis.call('EXISTS', PAUSED) == 1
--@include flow_claim
local out = {}  -- flat: a reply of nested tables costs the server ~4,000 instructions a claim
local nout = 0  -- claims in out
local function push(id, env, a, tok, started)
  out[nout * 5 + 1] = id; out[nout * 5 + 2] = env; out[nout * 5 + 3] = a; out[nout * 5 + 4] = tok; out[nout * 5 + 5] = started
  nout = nout + 1
end
local took = {}  -- entries claimed from the ready list, appended to P in one RPUSH
local back = {}  -- entries a blocking move took while claiming is paused: they go back
-- A job the blocking move took from Q (the default priority's lane) yields to queued
-- jobs of the lanes before Q, grouped ones included (a ring of a priority before it):
-- it goes back to the head of Q, and the lanes are scanned.
local function urgent()
  return lanes_hold(1, DEFAULT_PRIORITY) or redis.call('ZCOUNT', RING, '0', istr(DEFAULT_PRIORITY * GK44 - 1)) > 0
end
local yield = false
-- 'claim' | 'held' (already claimed by W: leave it) | 'stale' | 'back' | 'front'
local function try(entry)
  local tok, id = split(entry)
  if not id then return 'stale' end
  local st = redis.call('HGET', JOBS, id)
  if not st then return 'stale' end
  local m = getm(id)
  if not m or tostring(m.k) ~= tok then return 'stale' end
  if starts(st, 'processing:') and m.w == W then return 'held' end
  if not starts(st, 'queued:') then return 'stale' end
  if paused or nout >= MX then return 'back' end
  if yield then return 'front' end
  m.n = (m.n or 0) + 1
  m.l = m.i .. '.' .. istr(m.n)
  m.w = W
  local started = nout < START
  if started then
    m.a = m.a + 1
    m.s = 1
  else
    m.s = nil  -- absent: 0 (an older version wrote 0)
  end
  setm(id, m)
  setst(id, 'processing:' .. istr(now) .. ':' .. W)
  redis.call('ZADD', L, istr(now + LEASE), id)
  push(id, redis.call('HGET', ENV, id), started and m.a or m.a + 1, m.l, started and 1 or 0)
  return 'claim'
end
yield = (RECONCILE == '1' or MOVED ~= '') and urgent()
local fronts = {}  -- moved entries yielding to urgent lanes, in the order they left Q
if RECONCILE == '1' then
  for _, e in ipairs(redis.call('LRANGE', P, '0', '-1')) do
    if nout >= MX then break end
    local r = try(e)
    if r == 'stale' or r == 'back' or r == 'front' then redis.call('LREM', P, '1', e) end
    if r == 'back' then back[#back + 1] = e end
    if r == 'front' then fronts[#fronts + 1] = e end
  end
end
if MOVED == '*' then
  -- pipelined behind a blocking move: what it moved, if anything, is P's last entry
  local last = redis.call('LINDEX', P, '-1')
  if last then
    local r = try(last)
    if r == 'stale' or r == 'back' or r == 'front' then redis.call('LREM', P, '-1', last) end
    if r == 'back' then back[#back + 1] = last end
    if r == 'front' then fronts[#fronts + 1] = last end
  end
elseif MOVED ~= '' then
  -- moved into P by the blocking client; claim it only if it is still there
  if redis.call('LPOS', P, MOVED, 'RANK', '-1') then
    local r = try(MOVED)
    if r == 'stale' or r == 'back' or r == 'front' then redis.call('LREM', P, '-1', MOVED) end
    if r == 'back' then back[#back + 1] = MOVED end
    if r == 'front' then fronts[#fronts + 1] = MOVED end
  end
end
for i = #fronts, 1, -1 do redis.call('LPUSH', Q, fronts[i]) end
yield = false
-- The ready list, lane by lane (priority 0 first), in batches: one HMGET per hash for the
-- popped entries and one write per hash for the claims (a redis.call per job and hash
-- would cost more than the work). Ten lanes: O(1) in the number of queued jobs. One
-- EXISTS skips the lanes before Q, and one the lanes after it, when they are empty (the
-- common case: every redis.call costs ~1.5 us of script time).
local claimed = {}
local w_meta, w_jobs, w_leases, c_ids, c_meta = {}, {}, {}, {}, {}
local lease_at = istr(now + LEASE)
local W_JSON = cjson.encode(W)
local processing = 'processing:' .. istr(now) .. ':' .. W
-- claim the valid entries among those taken from the ready list (stale ones are dropped);
-- returns the id of the last one claimed (or nil)
local function consider(entries)
  local ids, toks = {}, {}
  for k, e in ipairs(entries) do
    local tok, id = split(e)
    toks[k] = tok
    ids[k] = id or ''
  end
  local sts = redis.call('HMGET', JOBS, unpack(ids))
  local metas = redis.call('HMGET', META, unpack(ids))
  local last = nil
  for k, entry in ipairs(entries) do
    local id = ids[k]
    if id ~= '' and not claimed[id] and metas[k] and starts(sts[k], 'queued:') then
      local raw = metas[k]
      local m = cjson.decode(raw)
      if tostring(m.k) == toks[k] then
        claimed[id] = true
        -- a job's first claim: its metadata as enqueue wrote it (attempts first, at 0),
        -- none of the claim's fields yet
        local first = m.n == nil and m.w == nil and m.l == nil and m.s == nil and string.sub(raw, 1, 7) == '{"a":0,'
        m.n = (m.n or 0) + 1
        m.l = m.i .. '.' .. istr(m.n)
        m.w = W
        if nout + #c_ids < START then
          m.a = m.a + 1
          m.s = 1
        else
          m.s = nil
        end
        w_meta[#w_meta + 1] = id
        if first then
          -- written as text, the attempts in place and the claim's fields after the rest:
          -- cjson.encode writes each number through '%.14g' (an snprintf of a double,
          -- ~2,200 server instructions; five a claim, an eighth of a claim's work)
          w_meta[#w_meta + 1] = '{"a":' .. istr(m.a) .. ',' .. string.sub(raw, 8, -2) .. ',"n":1,"l":' ..
            cjson.encode(m.l) .. ',"w":' .. W_JSON .. (m.s and ',"s":1}' or '}')
        else
          w_meta[#w_meta + 1] = cjson.encode(m)
        end
        w_jobs[#w_jobs + 1] = id
        w_jobs[#w_jobs + 1] = processing
        w_leases[#w_leases + 1] = lease_at
        w_leases[#w_leases + 1] = id
        c_ids[#c_ids + 1] = id
        c_meta[#c_meta + 1] = m
        took[#took + 1] = entry
        last = id
      end
    end
  end
  return last
end
-- Groups (include groups): the turns of priority p's ring, one job a turn, while the
-- claim wants more; false when the ring has no member left (the lane is then claimed
-- as without groups).
local GLIMIT = tonumber(ARGV[10] or '0')  -- group_concurrency (0: none)
local GRATE_N, GPER = tonumber(ARGV[11] or '0'), tonumber(ARGV[12] or '0')  -- group_rate (0: none), its window (ms)
local function turns(p, LANE)
  local lo, hi = istr(p * GK44), istr((p + 1) * GK44 - 1)
  local first = redis.call('ZRANGEBYSCORE', RING, lo, hi, 'LIMIT', '0', '1')[1]
  if not first then return false end
  if redis.call('EXISTS', LANE) == 1 then ring_join(p, '') end  -- jobs without a group take turns too
  while nout + #c_ids < MX do
    local mem = first or redis.call('ZRANGEBYSCORE', RING, lo, hi, 'LIMIT', '0', '1')[1]
    first = nil
    if not mem then return false end
    local g = string.sub(mem, 3)
    local entry, more = nil, false
    if g == '' then
      entry = redis.call('LPOP', LANE)
      more = entry and redis.call('EXISTS', LANE) == 1
    elseif redis.call('SISMEMBER', GPAUSED, g) == 1 then
      entry = nil  -- paused: out of the ring until resumed
    elseif GLIMIT > 0 and group_running(g, GLIMIT, claimed) >= GLIMIT then
      redis.call('HSET', FLOW, 'b:' .. g, '1')  -- full: out of the ring until a slot of it is freed
    elseif GRATE_N > 0 and group_rated(g, now, GRATE_N, GPER) then
      entry = nil  -- over its rate: out of the ring until its next token (GSLEEP)
    else
      local gm = group_first(p, g)
      if gm then
        redis.call('ZREM', GREADY, gm)
        entry = string.sub(gm, #g + 16)  -- after '<p><group>\0<13 hex digits>'
        more = group_first(p, g) ~= nil
      end
    end
    if more then
      redis.call('ZADD', RING, istr(p * GK44 + redis.call('INCR', SEQ)), mem)  -- to the end
    else
      redis.call('ZREM', RING, mem)
    end
    if entry then
      local id = consider({entry})
      if id and g ~= '' then
        redis.call('ZADD', GRUN, '0', g .. '\0' .. id)
        if GRATE_N > 0 then redis.call('ZADD', GRATE, '0', g .. '\0' .. string.format('%013x', now) .. '\0' .. id) end
      end
    end
  end
  return true
end
-- The ready list, lane by lane (priority 0 first), in batches: one HMGET per hash for the
-- popped entries and one write per hash for the claims (a redis.call per job and hash
-- would cost more than the work). Ten lanes: O(1) in the number of queued jobs. One
-- EXISTS skips the lanes before Q, and one the lanes after it, when they are empty (the
-- common case: every redis.call costs ~1.5 us of script time). A priority whose ring has
-- members (groups) is served by turns first.
if GRATE_N > 0 and not paused then groups_wake(now) end
local grouped = redis.call('EXISTS', RING) == 1
local QLANE = DEFAULT_PRIORITY + 1
local lane = 1
while nout + #c_ids < MX and not paused and lane <= #LANES do
  if not grouped and ((lane == 1 and not lanes_hold(1, QLANE - 1)) or (lane == QLANE + 1 and not lanes_hold(lane, #LANES))) then
    lane = lane == 1 and QLANE or #LANES + 1
  end
  if lane > #LANES then break end
  local LANE = LANES[lane]
  if grouped and turns(lane - 1, LANE) then break end  -- (the claim has what it wants)
  local want = MX - nout - #c_ids
  if want <= 0 then break end
  local entries = redis.call('LPOP', LANE, want)
  if not entries or #entries < want then lane = lane + 1 end  -- the lane is empty now
  if entries then consider(entries) end
end
if #c_ids > 0 then
  for i = 1, #w_meta, 1000 do
    redis.call('HSET', META, unpack(w_meta, i, math.min(i + 999, #w_meta)))
    redis.call('ZADD', L, unpack(w_leases, i, math.min(i + 999, #w_leases)))
  end
  setsts(w_jobs)
  local envs = {}
  for i = 1, #c_ids, 1000 do
    local part = redis.call('HMGET', ENV, unpack(c_ids, i, math.min(i + 999, #c_ids)))
    for _, e in ipairs(part) do envs[#envs + 1] = e end
  end
  for k, id in ipairs(c_ids) do
    local m = c_meta[k]
    push(id, envs[k], m.s == 1 and m.a or m.a + 1, m.l, m.s == 1 and 1 or 0)
  end
end
for i = 1, #took, 1000 do  -- in chunks: Lua's unpack has a stack limit
  redis.call('RPUSH', P, unpack(took, i, math.min(i + 999, #took)))
end
for i = #back, 1, -1 do redis.call('LPUSH', Q, back[i]) end
flush()
flow_claimed(out, nout)
local ctl = false
if paused then
  local last = redis.call('XREVRANGE', CTL, '+', '-', 'COUNT', '1')
  ctl = last[1] and last[1][1] or '0-0'
end
local nd = flow_due(next_due())
if GRATE_N > 0 and nout == 0 then  -- a group over its rate may be claimed when its next token is due
  local sl = redis.call('ZRANGE', GSLEEP, '0', '0', 'WITHSCORES')[2]
  if sl and (not nd or tonumber(sl) < tonumber(nd)) then nd = sl end
end
return {out, nd, (ready_any() == 1 or redis.call('EXISTS', RING) == 1) and 1 or 0, ctl}
