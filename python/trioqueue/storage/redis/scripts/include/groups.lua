-- Groups (fair queuing), for every script that puts jobs in the ready list (push_ready)
-- or takes them out of processing (group_left); include it right after prelude.
-- A grouped job's ready entry is a member of GREADY, a zset of score-0 members ordered
-- by their bytes: '<priority><group>\0<order: 13 hex digits><entry>', so a group's lane
-- of a priority is one lex range, FIFO by order (a push to the front: an order below
-- all). RING holds per priority the groups with ready entries, '<p>:<group>' scored
-- p * 2^44 + its turn ('<p>:' is the lane of the jobs without a group, LANES[p + 1]):
-- a claim serves the first, which goes to the end, so a claim costs O(log groups).
-- GRUN: '<group>\0<id>' of the claimed jobs of each group (group_concurrency; checked
-- against the registry when a group looks full, so a lost removal never leaks a slot).
-- GPAUSED: paused groups. A group that left the rings for its concurrency limit has a
-- field 'b:<group>' in the flow hash (KEYS[#KEYS] of claim, settle, release, recover): the
-- first of its jobs to leave processing puts it back (settle has the caller run
-- group_requeue: its library function is at Lua's limit of upvalues). Groups hold no NUL
-- (validated).
local GK44 = 17592186044416
local GBASE = 281474976710656  -- 2^48: orders are GBASE + n (pushed last), GBASE - n (first)
-- group g (a ring member: '' for the ungrouped lane) joins the ring of priority p
local function ring_join(p, g)
  local mem = istr(p) .. ':' .. g
  if not redis.call('ZSCORE', RING, mem) then
    redis.call('ZADD', RING, istr(p * GK44 + redis.call('INCR', SEQ)), mem)
    WAKE = WAKE + 1  -- a blocked claimer may take it (flush pushes the wake marker)
  end
end
-- the ready entry e of job m goes to the end (front: the start) of its lane
local function push_ready(m, e, front)
  if not m.g then
    redis.call(front and 'LPUSH' or 'RPUSH', lane_of(m), e)
    pushed_to(m)
    return
  end
  local p = m.p or DEFAULT_PRIORITY
  local n = redis.call('INCR', SEQ)
  redis.call('ZADD', GREADY, '0', istr(p) .. m.g .. '\0' .. string.format('%013x', front and GBASE - n or GBASE + n) .. e)
  ring_join(p, m.g)
end
-- the first member of group g's lane of priority p in GREADY, or nil
local function group_first(p, g)
  local pre = istr(p) .. g
  return redis.call('ZRANGEBYLEX', GREADY, '[' .. pre .. '\0', '(' .. pre .. '\1', 'LIMIT', '0', '1')[1]
end
-- group g goes back in the ring of each priority where it has ready entries
local function group_requeue(g)
  for p = 0, #LANES - 1 do
    if group_first(p, g) then ring_join(p, g) end
  end
end
-- a claimed job (metadata m) left processing: its group's slot is free (flow: the flow
-- hash, where a full group is marked)
local function group_left(id, m, flow)
  if not (m and m.g) then return end
  redis.call('ZREM', GRUN, m.g .. '\0' .. id)
  if flow and redis.call('HDEL', flow, 'b:' .. m.g) == 1 then group_requeue(m.g) end
end
-- group_rate (claim.lua): whether group g has had rate claims in the last per ms (its
-- older entries in GRATE dropped first); if so it sleeps in GSLEEP until its next token
local function group_rated(g, now, rate, per)
  local lo = '[' .. g .. '\0'
  redis.call('ZREMRANGEBYLEX', GRATE, lo, '(' .. g .. '\0' .. string.format('%013x', now - per + 1))
  if redis.call('ZLEXCOUNT', GRATE, lo, '(' .. g .. '\1') < rate then return false end
  local first = redis.call('ZRANGEBYLEX', GRATE, lo, '(' .. g .. '\1', 'LIMIT', '0', '1')[1]
  redis.call('ZADD', GSLEEP, istr(tonumber(string.sub(first, #g + 2, #g + 14), 16) + per), g)
  return true
end
-- groups over their rate whose next token is due go back in the rings
local function groups_wake(now)
  for _, g in ipairs(redis.call('ZRANGEBYSCORE', GSLEEP, '-inf', istr(now))) do
    redis.call('ZREM', GSLEEP, g)
    group_requeue(g)
  end
end
-- how many jobs of group g are claimed; at the limit, entries of jobs no longer
-- processing are dropped first (but those of ids in mine: claimed by this very call)
local function group_running(g, limit, mine)
  local lo, hi = '[' .. g .. '\0', '(' .. g .. '\1'
  local n = redis.call('ZLEXCOUNT', GRUN, lo, hi)
  if n < limit then return n end
  for _, mem in ipairs(redis.call('ZRANGEBYLEX', GRUN, lo, hi)) do
    local id = string.sub(mem, #g + 2)
    if not mine[id] and not starts(redis.call('HGET', JOBS, id), 'processing:') then
      redis.call('ZREM', GRUN, mem)
    end
  end
  return redis.call('ZLEXCOUNT', GRUN, lo, hi)
end
-- an enqueue's grouped jobs ({metadata, entry} each) into their groups' lanes and rings:
-- push_ready's writes, batched (one INCRBY, a ZADD per 500)
local function push_grouped(grouped)
  if #grouped == 0 then return end
  local n0 = redis.call('INCRBY', SEQ, #grouped) - #grouped
  local z, joins, seen_g = {}, {}, {}
  for k, ge in ipairs(grouped) do
    local pre = istr(ge[1].p) .. ge[1].g
    z[#z + 1] = '0'
    z[#z + 1] = pre .. '\0' .. string.format('%013x', GBASE + n0 + k) .. ge[2]
    if not seen_g[pre] then
      seen_g[pre] = true
      joins[#joins + 1] = ge[1]
    end
  end
  for i = 1, #z, 1000 do redis.call('ZADD', GREADY, unpack(z, i, math.min(i + 999, #z))) end
  for _, m in ipairs(joins) do ring_join(m.p, m.g) end
end
