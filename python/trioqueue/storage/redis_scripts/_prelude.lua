-- Shared by every queue script (spliced in at load time by _lua.py).
-- Every key a script touches is declared in KEYS (one hash tag: one cluster slot):
local JOBS, META, ENV, RESULTS, ERRORS, PROGRESS = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6]
local Q, D, L, X, WK, PROCS = KEYS[7], KEYS[8], KEYS[9], KEYS[10], KEYS[11], KEYS[12]
local SEQ, PAUSED, CTL, SCHED, SCHED_LAST, EVENTS = KEYS[13], KEYS[14], KEYS[15], KEYS[16], KEYS[17], KEYS[18]
local SMALL = 65536
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
local EV = {}
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
  EV[#EV + 1] = ns(kind) .. ns(id) .. ns(worker) .. ns(result) .. ns(err) .. ns(token)
end
local function flush()
  if #EV > 0 then redis.call('PUBLISH', EVENTS, table.concat(EV)) end
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
-- x cancel requested (1)
local function getm(id)
  local raw = redis.call('HGET', META, id)
  if not raw then return nil end
  return cjson.decode(raw)
end
local function setm(id, m) redis.call('HSET', META, id, cjson.encode(m)) end
local function purge(id)
  redis.call('HDEL', JOBS, id)
  redis.call('HDEL', META, id)
  redis.call('HDEL', ENV, id)
  redis.call('HDEL', RESULTS, id)
  redis.call('HDEL', ERRORS, id)
  redis.call('HDEL', PROGRESS, id)
  redis.call('ZREM', X, id)
  redis.call('ZREM', D, id)
  redis.call('ZREM', L, id)
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
  redis.call('HDEL', ENV, id)
  m.w = nil
  setm(id, m)
end
local function state_kind(st) return string.sub(st, 1, (string.find(st, ':', 1, true) or 0) - 1) end
