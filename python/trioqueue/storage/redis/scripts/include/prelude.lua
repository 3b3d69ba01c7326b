-- Shared by every queue script (spliced in at load time by _lua.py).
-- Every key a script touches is declared in KEYS (one hash tag: one cluster slot). The
-- generated key variables number them in the full layout (_lua.QUEUE_KEYS); a script is
-- sent only the keys it uses, and _lua.source renumbers its KEYS[n] to match (an EVALSHA
-- costs the server about 1,100 instructions per key). QK: how many queue keys the script
-- gets (its processing lists and flow keys come after them).
-- The key variables (JOBS, META, ..., Q the default priority's ready list, D, L, ...,
-- NOTICES) and LANES, the ready list in lanes by priority (0 first; the default priority,
-- DEFAULT_PRIORITY, keeps Q): generated from _lua.QUEUE_KEYS. FIFO within a lane; a job
-- keeps its lane for life (m.p). NOTICES is a second pub/sub channel carrying only the
-- events a waiter or a job's holder acts on (NOTICE below); EVENTS carries every event.
--@layout
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
-- whether any lane holds entries (an empty list does not exist: one EXISTS for all)
local function ready_any()
  if redis.call('EXISTS', unpack(LANES)) > 0 then return 1 end
  return 0
end
-- whether any of the lanes first..last holds entries
local function lanes_hold(first, last)
  return redis.call('EXISTS', unpack(LANES, first, last)) > 0
end
--@small
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
-- An integral number as text. Lua turns a number into text with '%.14g' (concatenation,
-- tostring, '%s', a redis.call argument), which like '%.0f' goes through glibc's
-- floating-point printf: ~2,000 instructions a number. '%d' takes the integer path (a
-- fifth of that). The numbers a script writes per job go through istr.
-- Kept per call: a batch writes the same few numbers over and over (lengths, counts, now).
local ISTR = {}
local function istr(x)
  local s = ISTR[x]
  if not s then
    s = string.format('%d', x)
    ISTR[x] = s
  end
  return s
end
local EV = {}
-- NOTICE: the kinds also published on NOTICES, generated from ``NOTICE_KINDS``
-- (storage/_records.py): terminal outcomes for waiters, cancel requests and fenced
-- settlements for the holder, pause and resume for every worker, 'due' for the reaper.
--@notices
local NV = {}
-- Events are built and published on EVENTS only while someone listens there: every
-- subscriber to all events keeps LISTENING alive (RedisStorage.subscribe sets it with a
-- TTL and refreshes it, and tells its reader to resync if it ever found it gone). The
-- notice kinds always go to NOTICES. Looked up once a call, at the first event.
local LISTEN = nil
local EVN = 0  -- events this call emitted, published or not
local function ns(s)
  if s == nil or s == false then return '-' end
  return istr(#s) .. ':' .. s
end
local function small(s)
  if s and #s <= SMALL then return s end
  return nil
end
-- an event: kind, job id, worker, result, error, incarnation token
local NSK = {}
local function ev(kind, id, worker, result, err, token)
  EVN = EVN + 1
  if LISTEN == nil then LISTEN = redis.call('EXISTS', LISTENING) == 1 end
  local notice = NOTICE[kind]
  if not (LISTEN or notice) then return end
  -- one concatenation, no intermediate strings; a call's kinds and worker repeat (NSK)
  local k = NSK[kind]
  if not k then k = ns(kind); NSK[kind] = k end
  local w = worker and NSK[worker]
  if worker and not w then w = ns(worker); NSK[worker] = w end
  local e = k ..
    (id and istr(#id) or '-') .. (id and ':' or '') .. (id or '') ..
    (w or '-') ..
    (result and istr(#result) or '-') .. (result and ':' or '') .. (result or '') ..
    (err and istr(#err) or '-') .. (err and ':' or '') .. (err or '') ..
    (token and istr(#token) or '-') .. (token and ':' or '') .. (token or '')
  if LISTEN then EV[#EV + 1] = e end
  if notice then NV[#NV + 1] = e end
end
local function flush()
  if WAKE > 0 and redis.call('LLEN', Q) == 0 then
    for _ = 1, math.min(WAKE, 16) do redis.call('RPUSH', Q, '~') end
  end
  WAKE = 0
  if #EV > 0 then
    redis.call('PUBLISH', EVENTS, table.concat(EV))
    EV = {}
  end
  if #NV > 0 then
    redis.call('PUBLISH', NOTICES, table.concat(NV))
    NV = {}
  end
end
local function split(entry)
  local c = string.find(entry, ':', 1, true)
  if not c then return nil, nil end
  return string.sub(entry, 1, c - 1), string.sub(entry, c + 1)
end
local function starts(s, p) return s and string.sub(s, 1, #p) == p end
-- a job's metadata: a attempts, m max_attempts, t result TTL (ms), k ready-list entry
-- token, c created (ms), w worker holding it, q enqueue-call token, i incarnation token,
-- l claim token (i .. '.' .. n, or absent), n claims, s started (1: attempt counted),
-- x cancel requested (1), p priority (absent: the default), g group (absent: none; a
-- terminal record keeps it after its call token, see record). n, s and x are left out
-- while 0 (older versions wrote them: both read the same): every number costs cjson a
-- '%.14g' printf to write and a strtod to read. k and c are kept as JSON
-- strings of digits (older entries: numbers; both read the same through tostring and
-- arithmetic): cjson writes a number with '%.14g' and reads it with strtod, and the
-- token is also concatenated into list entries, on every claim and settle (see istr).
--
-- A terminal job (completed, failed, cancelled) has no META entry: its registry field is
-- one record, '<C|F|X><ms>a,m,t,created-before-state,n,p,q,<#i>:<i><payload>' (C
-- completed, F failed, X cancelled, at <ms>: 11 hex digits, as K44 = 16^11; t: only
-- where retry_job may need it, not for a completed job; n: negative if the job holds no
-- claim token (l is nil or i .. '.' .. n: claim sets it, recover and release clear it);
-- payload: a completed job's result), and its STATES score says when it is forgotten
-- (see below): one hash field and one zset member per kept job. Read a registry value
-- through stpart (the state string) or unrec, never with starts() on the raw value.
-- Written for every finished job: one string.format for the fields (cheaper than the
-- cjson.encode of the metadata it replaces).
local CODE = {completed = 'C', failed = 'F', cancelled = 'X'}
local UNCODE = {C = 'completed:', F = 'failed:', X = 'cancelled:'}
-- whether a registry value is a terminal record (active state strings are lowercase)
local function isrec(v)
  return v and UNCODE[string.sub(v, 1, 1)] ~= nil or false
end
local function rec_ms(v) return tonumber(string.sub(v, 2, 12), 16) end
local function unrec(rec)
  local ms = rec_ms(rec)
  local st = UNCODE[string.sub(rec, 1, 1)] .. istr(ms)
  local f, pos = {}, 13
  for k = 1, 7 do
    local e = string.find(rec, ',', pos, true)
    f[k] = string.sub(rec, pos, e - 1)
    pos = e + 1
  end
  local c = string.find(rec, ':', pos, true)
  local ilen = tonumber(string.sub(rec, pos, c - 1))
  local i = string.sub(rec, c + 1, c + ilen)
  local n = tonumber(f[5])
  local m = {a = tonumber(f[1]), m = tonumber(f[2]), t = tonumber(f[3]), c = ms - tonumber(f[4]),
    n = math.abs(n), p = tonumber(f[6]), i = i}
  if n > 0 then m.l = i .. '.' .. istr(n) end
  if f[7] ~= '' then
    local bar = string.find(f[7], '|', 1, true)  -- '<call token>|<group as hex>' (groups)
    if bar then
      m.g = string.gsub(string.sub(f[7], bar + 1), '%x%x', function(h) return string.char(tonumber(h, 16)) end)
      f[7] = string.sub(f[7], 1, bar - 1)
    end
    if f[7] ~= '' then m.q = f[7] end
  end
  return st, m, string.sub(rec, c + ilen + 1)
end
-- a registry value as the state string callers see
local function stpart(v)
  if isrec(v) then return UNCODE[string.sub(v, 1, 1)] .. istr(rec_ms(v)) end
  return v
end
-- per call: a batch's records share their state string and so their time
local RECMS = {}
local function record(st, m, payload)
  local head = RECMS[st]
  if not head then
    local c = string.find(st, ':', 1, true)
    local kind = string.sub(st, 1, c - 1)
    local ms = tonumber(string.sub(st, c + 1))
    head = {CODE[kind] .. string.format('%011x', ms), ms, kind == 'completed'}
    RECMS[st] = head
  end
  local ms = head[2]
  local i = m.i or ''
  local n = m.n or 0
  -- concatenated, not string.format: its '%d' and '%s' each cost a sprintf call
  return head[1] .. istr(m.a or 0) .. ',' .. istr(m.m or 1) .. ',' .. (head[3] and '' or istr(m.t or 0)) .. ',' ..
    istr(ms - (m.c or ms)) .. ',' .. istr((m.l and n > 0) and n or -n) .. ',' .. (m.p and istr(m.p) or '') .. ',' ..
    (m.q or '') .. (m.g and ('|' .. string.gsub(m.g, '.', function(ch) return string.format('%02x', string.byte(ch)) end)) or '') ..
    ',' .. istr(#i) .. ':' .. i .. (payload or '')
end
-- metadata from a META value or, failing that, from a terminal record
local function meta_of(raw, v)
  if raw then return cjson.decode(raw) end
  if isrec(v) then local _, m = unrec(v) return m end
  return nil
end
local function getm(id)
  local raw = redis.call('HGET', META, id)
  if raw then return cjson.decode(raw) end
  return meta_of(nil, redis.call('HGET', JOBS, id))
end
local function setm(id, m) redis.call('HSET', META, id, cjson.encode(m)) end
local function purge(id)
  redis.call('HDEL', JOBS, id)
  redis.call('ZREM', STATES, id)
  redis.call('HDEL', META, id)
  redis.call('HDEL', ENV, id)
  redis.call('HDEL', ERRORS, id)
  redis.call('HDEL', PROGRESS, id, '\255' .. id, '\254' .. id)  -- its progress, its steps (step.lua), its mailbox (signal.lua)
  redis.call('ZREM', D, id)
  redis.call('ZREM', L, id)
  redis.call('HDEL', TREE, id)
end
-- The per-state index STATES: one zset, id -> kind * 2^44 + the ms the job entered its
-- state (a terminal job: the ms it is forgotten, so that the same member is the expiry
-- index), so each state is a score range, counted by ZCOUNT and paged by rank. Every
-- write of an active state string goes through setst/setsts; of a terminal one, terminal.
local K44 = 17592186044416
-- (waiting_children, a parent of a tree, and waiting_signal came last: the terminal kinds are 4..6)
local KIND = {queued = 0, delayed = 1, processing = 2, failing = 3, completed = 4, failed = 5, cancelled = 6,
  waiting_children = 7, waiting_signal = 8}
local function sidx(st)
  local c = string.find(st, ':', 1, true)
  local rest = string.sub(st, c + 1)
  local c2 = string.find(rest, ':', 1, true)
  return istr(KIND[string.sub(st, 1, c - 1)] * K44 + tonumber(c2 and string.sub(rest, 1, c2 - 1) or rest))
end
-- a terminal job's STATES score: its kind's range, at the ms it is forgotten
local function xidx(st, at)
  return istr(KIND[string.sub(st, 1, string.find(st, ':', 1, true) - 1)] * K44 + math.min(at, K44 - 1))
end
local function setst(id, st)
  redis.call('HSET', JOBS, id, st)
  redis.call('ZADD', STATES, sidx(st), id)
end
-- w: id, state, id, state...
local function setsts(w)
  local z = {}
  local last, score = nil, nil  -- a batch's jobs mostly share one state string
  for i = 1, #w, 2 do
    if w[i + 1] ~= last then last = w[i + 1]; score = sidx(last) end
    z[#z + 1] = score; z[#z + 1] = w[i]
  end
  for i = 1, #w, 1000 do
    redis.call('HSET', JOBS, unpack(w, i, math.min(i + 999, #w)))
    redis.call('ZADD', STATES, unpack(z, i, math.min(i + 999, #z)))
  end
end
-- forget the job if it is terminal and due (its STATES score); true if forgotten
local function expired(id, now)
  local s = redis.call('ZSCORE', STATES, id)
  if not s then return false end
  s = tonumber(s)
  local k = math.floor(s / K44)
  if k >= KIND.completed and k <= KIND.cancelled and s - k * K44 <= now then purge(id) return true end
  return false
end
-- SWEEP_AT (KEYS[10]): a lower bound of the ms at which the next kept terminal job is
-- due, so that a sweep with nothing due costs one GET (enqueue sweeps on every call).
-- Every write of a terminal STATES score lowers it (lower_sweep_at); absent means
-- unknown: the next sweep looks (and sets it).
local function lower_sweep_at(at)
  local cur = redis.call('GET', SWEEP_AT)
  if cur and at < tonumber(cur) then redis.call('SET', SWEEP_AT, istr(at)) end
end
-- forget up to n expired terminal jobs (the due ends of the terminal kinds' ranges);
-- returns how many. The same ranged reads find the next due time (the first entry of
-- each kind not forgotten), so a sweep costs what it did before SWEEP_AT existed.
local function sweep(now, n)
  local at = redis.call('GET', SWEEP_AT)
  if at and tonumber(at) > now then return 0 end
  local done, nxt = 0, K44 - 1
  for k = KIND.completed, KIND.cancelled do
    local base = k * K44
    local got = redis.call('ZRANGEBYSCORE', STATES, istr(base), istr(base + K44 - 1), 'WITHSCORES', 'LIMIT', 0, n - done + 1)
    for j = 1, #got, 2 do
      local ms = tonumber(got[j + 1]) - base
      if ms > now or done >= n then
        if ms < nxt then nxt = ms end
        break
      end
      purge(got[j])
      done = done + 1
    end
  end
  redis.call('SET', SWEEP_AT, istr(nxt))
  return done
end
-- the job enters terminal state st (payload: a completed job's result) and is kept as a
-- record for ttl ms (ttl <= 0: forgotten at once)
local TREED = false  -- a job of a tree ended: the caller runs tree_act (include tree)
local function terminal(id, m, now, ttl, st, payload)
  if m.tr then
    -- a job of a tree of jobs (m.tr: 1 a parent, 2 a child, 3 a dependency only): noted for tree_settle
    -- (include tree, which tree_act runs after the script); a child is kept (its STATES
    -- score at the end of time) until its parent has ended
    redis.call('SADD', TNOTES, 'e' .. id)
    TREED = true
    if m.tr == 2 or m.dd then ttl = K44 end  -- (m.dd: a dependency, kept for its dependents)
  end
  redis.call('ZREM', L, id)
  if ttl <= 0 then purge(id) return end
  redis.call('HSET', JOBS, id, record(st, m, payload))
  redis.call('HDEL', META, id)
  redis.call('ZADD', STATES, xidx(st, now + ttl), id)
  lower_sweep_at(now + ttl)
end
-- a started claim of worker W that used its last attempt ends failed (StalledJobError,
-- the message of storage._rules.stalled_error): the reaper's recovery, and a release
-- without refund
local function fail_stalled(id, m, now, W)
  local ttl = m.t or 0
  local err = cjson.encode({type = 'StalledJobError', traceback = '',
    message = "job '" .. id .. "' stalled on worker '" .. W ..
      "' (lease expired or worker died) and has used all " .. m.a .. " attempts"})
  if ttl > 0 then redis.call('HSET', ERRORS, id, err) end
  ev('failed', id, W, nil, small(err), m.i)
  terminal(id, m, now, ttl, 'failed:' .. now, '')
end
-- what get_job and list_jobs report of a job: false, or {state, created_ms, attempts,
-- max_attempts, result, error, token, progress, priority, group or false}
local function report(id)
  local v = redis.call('HGET', JOBS, id)
  if not v then return false end
  local st, m, result = v, nil, false
  if isrec(v) then
    st, m, result = unrec(v)
    if not starts(st, 'completed:') then result = false end
  else
    m = getm(id) or {}
  end
  return {st, tostring(m.c or 0), tostring(m.a or 0), tostring(m.m or 0), result,
    redis.call('HGET', ERRORS, id), m.i or false, redis.call('HGET', PROGRESS, id), m.p or DEFAULT_PRIORITY, m.g or false}
end
local function state_kind(st) return string.sub(st, 1, (string.find(st, ':', 1, true) or 0) - 1) end
