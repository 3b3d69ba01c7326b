"""Lua scripts of :class:`~trioqueue.storage.redis.RedisStorage`.

Every script of one queue receives ``KEYS[1] = "{prefix:name}:jobs"`` (the registry hash)
and derives the other keys of that queue from it, so every key it touches carries the same
hash tag (one cluster slot). Key layout, with ``B = "{prefix:name}"``:

- ``B:queue``                 ready list of entries ``<token>:<id>`` (head = next to claim)
- ``B:processing:<worker>``   one list per worker, same entries
- ``B:procs``                 set of workers that may have a processing list
- ``B:jobs``                  hash id -> state string (the registry)
- ``B:job:<id>``              hash of one job: e envelope, a attempts, m max_attempts,
                              t result TTL (ms), k current token, c created (ms),
                              w worker holding it, q enqueue-call token (idempotent retry)
- ``B:leases``                zset id -> lease deadline (ms)
- ``B:delayed``               zset id -> run-at (ms) of ``failing`` jobs
- ``B:expiry``                zset id -> when a terminal registry entry expires (ms)
- ``B:result:<id>``, ``B:error:<id>``  strings with their own PX TTL
- ``B:workers``               zset worker -> heartbeat expiry (ms)
- ``B:seq``                   counter of entry tokens
- ``B:events``                pub/sub channel

The token makes every ready-list entry unique: a cancelled job's entry stays in the list
(or in a processing list after a blocking move) but no longer matches the job's ``k`` and
is dropped when met, even if the same id (and envelope) was enqueued again since.

Events are published once per script call as a batch: each event is five fields
(kind, id, worker, result, error), each written ``<len>:<bytes>`` or ``-`` for none.
Timestamps come from the server's ``TIME``.
"""

from __future__ import annotations

SMALL = 65536  # results/errors up to this size ride along in events

_PRELUDE = r"""
local J = KEYS[1]
local B = string.sub(J, 1, -6)
local Q = B .. ':queue'
local D = B .. ':delayed'
local L = B .. ':leases'
local X = B .. ':expiry'
local SMALL = 65536
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
local function jk(id) return B .. ':job:' .. id end
local function pk(w) return B .. ':processing:' .. w end
local EV = {}
local function ns(s)
  if s == nil or s == false then return '-' end
  return #s .. ':' .. s
end
local function small(s)
  if s and #s <= SMALL then return s end
  return nil
end
local function ev(kind, id, worker, result, err)
  EV[#EV + 1] = ns(kind) .. ns(id) .. ns(worker) .. ns(result) .. ns(err)
end
local function flush()
  if #EV > 0 then redis.call('PUBLISH', B .. ':events', table.concat(EV)) end
end
local function split(entry)
  local c = string.find(entry, ':', 1, true)
  if not c then return nil, nil end
  return string.sub(entry, 1, c - 1), string.sub(entry, c + 1)
end
local function starts(s, p) return s and string.sub(s, 1, #p) == p end
local function purge(id)
  redis.call('HDEL', J, id)
  redis.call('DEL', jk(id), B .. ':result:' .. id, B .. ':error:' .. id)
  redis.call('ZREM', X, id)
  redis.call('ZREM', D, id)
  redis.call('ZREM', L, id)
end
local function expired(id, now)
  local s = redis.call('ZSCORE', X, id)
  if s and tonumber(s) <= now then purge(id) return true end
  return false
end
local function sweep(now)
  local ids = redis.call('ZRANGEBYSCORE', X, '-inf', now, 'LIMIT', 0, 100)
  for _, id in ipairs(ids) do purge(id) end
end
-- a terminal job keeps its registry entry (and result/error) for ttl ms
local function terminal(id, now, ttl)
  if ttl <= 0 then purge(id) return end
  redis.call('ZADD', X, now + ttl, id)
  redis.call('HDEL', jk(id), 'e', 'w')
  redis.call('PEXPIRE', jk(id), ttl)
end
local function setpx(key, data, ttl)
  if ttl > 0 then redis.call('SET', key, data, 'PX', ttl) end
end
"""

# ARGV: call_token, then (id, envelope, '<max_attempts>:<result_ttl_ms>') per job.
# Returns per job {'q'} | {'d', state} | {'c', state, result}.
ENQUEUE = _PRELUDE + r"""
local now = now_ms()
sweep(now)
local call = ARGV[1]
local out = {}
local seen = {}
local fresh = {}
-- One INCRBY reserves a token per job of the batch (unused ones are skipped: harmless).
local tok = redis.call('INCRBY', B .. ':seq', (#ARGV - 1) / 3) - (#ARGV - 1) / 3
for i = 2, #ARGV, 3 do
  local id = ARGV[i]
  local st = redis.call('HGET', J, id)
  if st and expired(id, now) then st = false end
  if seen[id] then
    out[#out + 1] = {'d', st}
  elseif not st then
    tok = tok + 1
    redis.call('HSET', J, id, 'queued:' .. now)
    local m, t = split(ARGV[i + 2])
    redis.call('HSET', jk(id), 'e', ARGV[i + 1], 'a', 0, 'm', m, 't', t,
               'k', tok, 'c', now, 'q', call)
    fresh[#fresh + 1] = tok .. ':' .. id
    ev('enqueued', id)
    out[#out + 1] = {'q'}
    st = 'queued:' .. now
  elseif redis.call('HGET', jk(id), 'q') == call then
    out[#out + 1] = {'q'}  -- a retry of this very call after a lost reply
  elseif starts(st, 'completed:') then
    local r = redis.call('GET', B .. ':result:' .. id)
    if r then out[#out + 1] = {'c', st, r} else out[#out + 1] = {'d', st} end
  else
    out[#out + 1] = {'d', st}
  end
  seen[id] = true
end
for i = 1, #fresh, 1000 do  -- RPUSH in chunks (Lua's unpack has a stack limit)
  redis.call('RPUSH', Q, unpack(fresh, i, math.min(i + 999, #fresh)))
end
flush()
return out
"""

_PROMOTE = r"""
local function promote(now)
  local ids = redis.call('ZRANGEBYSCORE', D, '-inf', now, 'LIMIT', 0, 1000)
  for _, id in ipairs(ids) do
    redis.call('ZREM', D, id)
    local st = redis.call('HGET', J, id)
    if starts(st, 'failing:') then
      local tok = redis.call('INCR', B .. ':seq')
      redis.call('HSET', jk(id), 'k', tok)
      redis.call('HSET', J, id, 'queued:' .. now)
      redis.call('RPUSH', Q, tok .. ':' .. id)
      ev('requeued', id)
    end
  end
end
"""

# ARGV: worker, max_jobs, lease_ms, moved entry ('' if none, '*': P's last entry, the
# script being pipelined behind the blocking move), reconcile ('1': also claim
# entries of the worker's list that a blocking move put there but no claim followed,
# e.g. its reply was lost to a fault or its caller was cancelled).
# Returns {{{id, envelope, attempts}...}, next delayed run-at ms or false, ready-list length}.
CLAIM = _PRELUDE + _PROMOTE + r"""
local W, MX, LEASE, MOVED, RECONCILE = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3]), ARGV[4], ARGV[5]
local now = now_ms()
local P = pk(W)
redis.call('SADD', B .. ':procs', W)
promote(now)
local out = {}
local took = {}  -- entries claimed from the ready list, appended to P in one RPUSH
-- 'claim' | 'held' (already claimed by W: leave it) | 'stale'
local function try(entry)
  local tok, id = split(entry)
  if not id then return 'stale' end
  local st = redis.call('HGET', J, id)
  if not st then return 'stale' end
  local h = redis.call('HMGET', jk(id), 'k', 'e', 'w', 'a')
  if h[1] ~= tok then return 'stale' end
  if starts(st, 'processing:') and h[3] == W then return 'held' end
  if not starts(st, 'queued:') then return 'stale' end
  local a = (tonumber(h[4]) or 0) + 1
  redis.call('HSET', jk(id), 'a', a, 'w', W)
  redis.call('HSET', J, id, 'processing:' .. now .. ':' .. W)
  redis.call('ZADD', L, now + LEASE, id)
  out[#out + 1] = {id, h[2], a}
  return 'claim'
end
if RECONCILE == '1' then
  for _, e in ipairs(redis.call('LRANGE', P, 0, -1)) do
    if #out >= MX then break end
    if try(e) == 'stale' then redis.call('LREM', P, 1, e) end
  end
end
if MOVED == '*' and #out < MX then
  -- pipelined behind a blocking move: what it moved, if anything, is P's last entry
  local last = redis.call('LINDEX', P, -1)
  if last and try(last) == 'stale' then redis.call('LREM', P, -1, last) end
elseif MOVED ~= '' and #out < MX then
  -- moved into P by the blocking client; claim it only if it is still there
  if redis.call('LPOS', P, MOVED, 'RANK', -1) then
    if try(MOVED) == 'stale' then redis.call('LREM', P, -1, MOVED) end
  end
end
while #out < MX do
  local entries = redis.call('LPOP', Q, MX - #out)
  if not entries then break end
  for _, entry in ipairs(entries) do
    if try(entry) == 'claim' then took[#took + 1] = entry end
  end
end
for i = 1, #took, 1000 do  -- in chunks: Lua's unpack has a stack limit
  redis.call('RPUSH', P, unpack(took, i, math.min(i + 999, #took)))
end
flush()
local nd = redis.call('ZRANGE', D, 0, 0, 'WITHSCORES')
return {out, nd[2] or false, redis.call('LLEN', Q)}
"""

# ARGV: worker, call token, then (id, data, '<kind c|f|r>:<ttl_ms>:<delay_ms>') per settlement.
# Returns a list of 1 (settled) / 0 (fenced). A retry of the same call (its reply was lost)
# finds its token on the job and answers 1 again instead of fencing.
SETTLE = _PRELUDE + r"""
local W, CALL = ARGV[1], ARGV[2]
local now = now_ms()
local P = pk(W)
local out = {}
local wake = false
for i = 3, #ARGV, 3 do
  local id, data, meta = ARGV[i], ARGV[i + 1], ARGV[i + 2]
  local kind, rest = split(meta)
  local ttl_s, delay_s = split(rest)
  local ttl, delay = tonumber(ttl_s), tonumber(delay_s)
  local st = redis.call('HGET', J, id)
  local h = nil
  if starts(st, 'processing:') then
    h = redis.call('HMGET', jk(id), 'w', 'k', 'a', 't')
    if h[1] ~= W or redis.call('LREM', P, 1, h[2] .. ':' .. id) == 0 then h = nil end
  end
  if not h then
    if st and redis.call('HGET', jk(id), 'z') == CALL then
      out[#out + 1] = 1
    else
      ev('fenced', id, W)
      out[#out + 1] = 0
    end
  else
    out[#out + 1] = 1
    redis.call('HSET', jk(id), 'z', CALL)
    redis.call('ZREM', L, id)
    if kind == 'c' then
      setpx(B .. ':result:' .. id, data, ttl)
      redis.call('HSET', J, id, 'completed:' .. now)
      terminal(id, now, ttl)
      ev('completed', id, W, small(data), nil)
    elseif kind == 'f' then
      setpx(B .. ':error:' .. id, data, ttl)
      redis.call('HSET', J, id, 'failed:' .. now)
      terminal(id, now, ttl)
      ev('failed', id, W, nil, small(data))
    else
      redis.call('HDEL', jk(id), 'w')
      redis.call('HSET', J, id, 'failing:' .. now .. ':' .. h[3])
      redis.call('ZADD', D, now + delay, id)
      setpx(B .. ':error:' .. id, data, delay + math.max(tonumber(h[4]) or 0, 1000) + 1000)
      ev('failing', id, W, nil, small(data))
      if delay <= 0 then wake = true end
    end
  end
end
-- a retry due now: wake a blocked claimer (the claim script drops this entry)
if wake then redis.call('RPUSH', Q, '~') end
flush()
return out
"""

# ARGV: worker, ids... Returns how many were given back.
RELEASE = _PRELUDE + r"""
local W = ARGV[1]
local now = now_ms()
local P = pk(W)
local byid = {}
for _, e in ipairs(redis.call('LRANGE', P, 0, -1)) do
  local tok, id = split(e)
  if id then
    if not byid[id] then byid[id] = {} end
    table.insert(byid[id], e)
  else
    redis.call('LREM', P, 0, e)
  end
end
local back = {}
for i = 2, #ARGV do
  local id = ARGV[i]
  local list = byid[id]
  byid[id] = nil
  if list then
    local st = redis.call('HGET', J, id)
    local h = redis.call('HMGET', jk(id), 'k', 'w')
    for _, e in ipairs(list) do
      redis.call('LREM', P, 1, e)
      local tok = split(e)
      if st and tok == h[1] then
        if starts(st, 'processing:') and h[2] == W then
          redis.call('HINCRBY', jk(id), 'a', -1)
          redis.call('HDEL', jk(id), 'w')
          redis.call('HSET', J, id, 'queued:' .. now)
          redis.call('ZREM', L, id)
          back[#back + 1] = e
          ev('requeued', id, W)
        elseif starts(st, 'queued:') then
          back[#back + 1] = e  -- moved by a blocking claim, never claimed
        end
        st = nil
      end
    end
  end
end
for i = #back, 1, -1 do redis.call('LPUSH', Q, back[i]) end
flush()
return #back
"""

# ARGV: id. Returns the status string.
CANCEL = _PRELUDE + r"""
local id = ARGV[1]
local now = now_ms()
expired(id, now)
local st = redis.call('HGET', J, id)
if not st then return 'not_found' end
if starts(st, 'queued:') or starts(st, 'failing:') then
  purge(id)
  ev('cancelled', id)
  flush()
  return 'cancelled'
end
return string.sub(st, 1, string.find(st, ':', 1, true) - 1)
"""

# ARGV: id. Returns false or {state, created_ms, attempts, max_attempts, result, error}.
GET_JOB = _PRELUDE + r"""
local id = ARGV[1]
expired(id, now_ms())
local st = redis.call('HGET', J, id)
if not st then return false end
local h = redis.call('HMGET', jk(id), 'c', 'a', 'm')
return {st, h[1] or '0', h[2] or '0', h[3] or '0',
        redis.call('GET', B .. ':result:' .. id), redis.call('GET', B .. ':error:' .. id)}
"""

# ARGV: id, ttl_ms.
UPDATE_TTL = _PRELUDE + r"""
local id, ttl = ARGV[1], tonumber(ARGV[2])
local now = now_ms()
expired(id, now)
local st = redis.call('HGET', J, id)
if not st then return 'not_found' end
local key
if starts(st, 'completed:') then key = B .. ':result:' .. id
elseif starts(st, 'failed:') then key = B .. ':error:' .. id
else return 'not_terminal' end
if redis.call('EXISTS', key) == 0 then return 'missing_payload' end
if ttl <= 0 then purge(id) return 'updated' end
redis.call('PEXPIRE', key, ttl)
redis.call('PEXPIRE', jk(id), ttl)
redis.call('ZADD', X, now + ttl, id)
return 'updated'
"""

# ARGV: worker, ttl_ms, lease_ms, ids...
HEARTBEAT = _PRELUDE + r"""
local W, ttl, lease = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
local now = now_ms()
redis.call('ZADD', B .. ':workers', now + ttl, W)
for i = 4, #ARGV do
  local id = ARGV[i]
  if starts(redis.call('HGET', J, id), 'processing:') and redis.call('HGET', jk(id), 'w') == W then
    redis.call('ZADD', L, 'XX', now + lease, id)
  end
end
return 1
"""

# ARGV: worker
UNREGISTER = _PRELUDE + r"""
local W = ARGV[1]
redis.call('ZREM', B .. ':workers', W)
if redis.call('LLEN', pk(W)) == 0 then redis.call('SREM', B .. ':procs', W) end
return 1
"""

# Returns {worker, expiry_ms, ...} of live workers.
WORKERS = _PRELUDE + r"""
return redis.call('ZRANGEBYSCORE', B .. ':workers', '(' .. now_ms(), '+inf', 'WITHSCORES')
"""

# Returns {{id, 'requeued'|'failed'}..., next deadline ms or false}.
RECOVER = _PRELUDE + r"""
local now = now_ms()
sweep(now)
local rec = {}
local WK = B .. ':workers'
local function recover(id, W)
  redis.call('ZREM', L, id)
  ev('stalled', id, W)
  local h = redis.call('HMGET', jk(id), 'a', 'm', 't', 'k')
  redis.call('HDEL', jk(id), 'w')
  local a = tonumber(h[1]) or 0
  if a < (tonumber(h[2]) or 1) then
    redis.call('HSET', J, id, 'queued:' .. now)
    redis.call('RPUSH', Q, h[4] .. ':' .. id)
    ev('requeued', id, W)
    rec[#rec + 1] = {id, 'requeued'}
  else
    local ttl = tonumber(h[3]) or 0
    local err = cjson.encode({type = 'StalledJobError', traceback = '',
      message = "job '" .. id .. "' stalled on worker '" .. W ..
        "' (lease expired or worker died) and has used all " .. a .. " attempts"})
    setpx(B .. ':error:' .. id, err, ttl)
    redis.call('HSET', J, id, 'failed:' .. now)
    ev('failed', id, W, nil, small(err))
    terminal(id, now, ttl)
    rec[#rec + 1] = {id, 'failed'}
  end
end
-- 1. expired leases
for _, id in ipairs(redis.call('ZRANGEBYSCORE', L, '-inf', now, 'LIMIT', 0, 1000)) do
  local st = redis.call('HGET', J, id)
  local h = redis.call('HMGET', jk(id), 'w', 'k')
  if starts(st, 'processing:') and h[1] then
    redis.call('LREM', pk(h[1]), 1, h[2] .. ':' .. id)
    recover(id, h[1])
  else
    redis.call('ZREM', L, id)
  end
end
-- 2. processing lists of dead workers (including entries moved but never claimed)
local nd = nil
for _, W in ipairs(redis.call('SMEMBERS', B .. ':procs')) do
  local alive = redis.call('ZSCORE', WK, W)
  local P = pk(W)
  if not alive or tonumber(alive) <= now then
    local entries = redis.call('LRANGE', P, 0, -1)
    redis.call('DEL', P)
    redis.call('SREM', B .. ':procs', W)
    local back = {}
    for _, e in ipairs(entries) do
      local tok, id = split(e)
      if id then
        local st = redis.call('HGET', J, id)
        local h = redis.call('HMGET', jk(id), 'k', 'w')
        if st and h[1] == tok then
          if starts(st, 'processing:') and h[2] == W then recover(id, W)
          elseif starts(st, 'queued:') then back[#back + 1] = e end
        end
      end
    end
    for i = #back, 1, -1 do redis.call('LPUSH', Q, back[i]) end
  elseif redis.call('LLEN', P) > 0 then
    local t = tonumber(alive)
    if not nd or t < nd then nd = t end
  end
end
local first = redis.call('ZRANGE', L, 0, 0, 'WITHSCORES')
if first[2] then
  local t = tonumber(first[2])
  if not nd or t < nd then nd = t end
end
flush()
return {rec, nd or false}
"""

# KEYS[1] = lock key; ARGV: owner, ttl_ms
LOCK_ACQUIRE = r"""
local h = redis.call('GET', KEYS[1])
if not h or h == ARGV[1] then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', tonumber(ARGV[2]))
  return 1
end
return 0
"""

LOCK_RELEASE = r"""
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('DEL', KEYS[1])
  return 1
end
return 0
"""

SCRIPTS = {
    "enqueue": ENQUEUE,
    "claim": CLAIM,
    "settle": SETTLE,
    "release": RELEASE,
    "cancel": CANCEL,
    "get_job": GET_JOB,
    "update_ttl": UPDATE_TTL,
    "heartbeat": HEARTBEAT,
    "unregister": UNREGISTER,
    "workers": WORKERS,
    "recover": RECOVER,
    "lock_acquire": LOCK_ACQUIRE,
    "lock_release": LOCK_RELEASE,
}
