-- Shared by every queue script (spliced in at load time by _lua.py).
-- Every key a script touches is declared in KEYS (one hash tag: one cluster slot):
local JOBS, META, ENV, RESULTS, ERRORS, PROGRESS = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6]
local Q, D, L, X, WK, PROCS = KEYS[7], KEYS[8], KEYS[9], KEYS[10], KEYS[11], KEYS[12]
local SEQ, PAUSED, CTL, SCHED, SCHED_LAST, EVENTS = KEYS[13], KEYS[14], KEYS[15], KEYS[16], KEYS[17], KEYS[18]
local STATES = KEYS[19]
-- KEYS[29]: the notices channel, a second pub/sub channel carrying only the events a
-- waiter or a job's holder acts on (NOTICE below); EVENTS carries every event.
local NOTICES = KEYS[29]
-- The ready list in lanes by priority (0 first): the default priority (5) keeps Q, the
-- others are KEYS[20..28]. FIFO within a lane; a job keeps its lane for life (m.p).
local LANES = {KEYS[20], KEYS[21], KEYS[22], KEYS[23], KEYS[24], Q, KEYS[25], KEYS[26], KEYS[27], KEYS[28]}
local DEFAULT_PRIORITY = 5
local function lane_of(m) return LANES[(m.p or DEFAULT_PRIORITY) + 1] end
-- Wake-ups. A blocking claim waits with BLMOVE on Q (one list, so that what it moves is
-- always in the worker's processing list, never lost if the client is cancelled or
-- closed), and it only blocks while Q is empty. A job pushed to another lane therefore
-- pushes a '~' marker to Q when Q is empty (one per such job, up to 16): it wakes a
-- blocked claimer, whose claim script (pipelined behind the move) drops the marker and
-- scans every lane. When Q is not empty no claimer is blocked, and markers are skipped
-- as stale entries by claims. Jobs of the default priority never cost a marker.
local WAKE = 0
local function pushed_to(m) if (m.p or DEFAULT_PRIORITY) ~= DEFAULT_PRIORITY then WAKE = WAKE + 1 end end
-- whether any lane holds entries (Q first: the common case costs one call)
local function ready_any()
  if redis.call('LLEN', Q) > 0 then return 1 end
  for p = 1, #LANES do
    if redis.call('LLEN', LANES[p]) > 0 then return 1 end
  end
  return 0
end
local SMALL = 65536
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
local EV = {}
-- The kinds also published on NOTICES (``NOTICE_KINDS`` in storage/_base.py): terminal
-- outcomes for waiters, cancel requests and fenced settlements for the holder.
local NOTICE = {
  completed = true, failed = true, cancelled = true, removed = true, cancel_requested = true, fenced = true, error = true,
}
local NV = {}
local function ns(s)
  if s == nil or s == false then return '-' end
  return #s .. ':' .. s
end
local function small(s)
  if s and #s <= SMALL then return s end
  return nil
end
-- an event: kind, job id, worker, result, error, incarnation token
local function ev(kind, id, worker, result, err, token)
  local e = ns(kind) .. ns(id) .. ns(worker) .. ns(result) .. ns(err) .. ns(token)
  EV[#EV + 1] = e
  if NOTICE[kind] then NV[#NV + 1] = e end
end
local function flush()
  if WAKE > 0 and redis.call('LLEN', Q) == 0 then
    for _ = 1, math.min(WAKE, 16) do redis.call('RPUSH', Q, '~') end
  end
  WAKE = 0
  if #EV > 0 then redis.call('PUBLISH', EVENTS, table.concat(EV)) end
  if #NV > 0 then redis.call('PUBLISH', NOTICES, table.concat(NV)) end
end
local function split(entry)
  local c = string.find(entry, ':', 1, true)
  if not c then return nil, nil end
  return string.sub(entry, 1, c - 1), string.sub(entry, c + 1)
end
local function starts(s, p) return s and string.sub(s, 1, #p) == p end
-- a job's metadata: a attempts, m max_attempts, t result TTL (ms), k ready-list entry
-- token, c created (ms), w worker holding it, q enqueue-call token, z settle-call token,
-- i incarnation token, l claim token, n claims, s started (1: attempt counted),
-- x cancel requested (1), p priority (absent: the default)
local function getm(id)
  local raw = redis.call('HGET', META, id)
  if not raw then return nil end
  return cjson.decode(raw)
end
local function setm(id, m) redis.call('HSET', META, id, cjson.encode(m)) end
local function purge(id)
  redis.call('HDEL', JOBS, id)
  redis.call('ZREM', STATES, id)
  redis.call('HDEL', META, id)
  redis.call('HDEL', ENV, id)
  redis.call('HDEL', RESULTS, id)
  redis.call('HDEL', ERRORS, id)
  redis.call('HDEL', PROGRESS, id)
  redis.call('ZREM', X, id)
  redis.call('ZREM', D, id)
  redis.call('ZREM', L, id)
end
-- The per-state index STATES: one zset, id -> kind * 2^44 + the ms the job entered its
-- state, so each state is a score range ordered by entry time (ties: by id), counted by
-- ZCOUNT and paged by rank. Every write of a state string goes through setst/setsts.
local K44 = 17592186044416
local KIND = {queued = 0, delayed = 1, processing = 2, failing = 3, completed = 4, failed = 5, cancelled = 6}
local function sidx(st)
  local c = string.find(st, ':', 1, true)
  local rest = string.sub(st, c + 1)
  local c2 = string.find(rest, ':', 1, true)
  local score = KIND[string.sub(st, 1, c - 1)] * K44 + tonumber(c2 and string.sub(rest, 1, c2 - 1) or rest)
  return string.format('%.0f', score)
end
local function setst(id, st)
  redis.call('HSET', JOBS, id, st)
  redis.call('ZADD', STATES, sidx(st), id)
end
-- w: id, state, id, state...
local function setsts(w)
  local z = {}
  for i = 1, #w, 2 do z[#z + 1] = sidx(w[i + 1]); z[#z + 1] = w[i] end
  for i = 1, #w, 1000 do
    redis.call('HSET', JOBS, unpack(w, i, math.min(i + 999, #w)))
    redis.call('ZADD', STATES, unpack(z, i, math.min(i + 999, #z)))
  end
end
local function expired(id, now)
  local s = redis.call('ZSCORE', X, id)
  if s and tonumber(s) <= now then purge(id) return true end
  return false
end
-- forget up to n expired terminal jobs; returns how many
local function sweep(now, n)
  local ids = redis.call('ZRANGEBYSCORE', X, '-inf', now, 'LIMIT', 0, n)
  for _, id in ipairs(ids) do purge(id) end
  return #ids
end
-- a terminal job keeps its registry entry (and result/error) for ttl ms
local function terminal(id, m, now, ttl)
  if ttl <= 0 then purge(id) return end
  redis.call('ZADD', X, now + ttl, id)
  redis.call('ZREM', L, id)
  m.w = nil
  setm(id, m)
end
local function state_kind(st) return string.sub(st, 1, (string.find(st, ':', 1, true) or 0) - 1) end
