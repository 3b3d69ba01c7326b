-- The body of enqueue.lua, shared with schedule_tick.lua (include delay first) (a tick's job is enqueued
-- exactly as an enqueue call's). Needs A: the position in ARGV of the call token,
-- followed by (id, envelope, '<max_attempts>:<result_ttl_ms>[:<priority>[:<group>]]',
-- incarnation token, run-at ms or '') per job. Leaves the outcomes in out (see
-- enqueue.lua). Reads the registry in one HMGET and writes each hash in one HSET per
-- 500 jobs: a redis.call per job and hash would cost more than the work itself.
local now = now_ms()
local nows = istr(now)
sweep(now, 100)
local call = ARGV[A]
local n = (#ARGV - A) / 5
local ids = {}
for i = A + 1, #ARGV, 5 do ids[#ids + 1] = ARGV[i] end
local states = redis.call('HMGET', JOBS, unpack(ids))
local out = {}
local seen = {}
local fresh = {}  -- entries for Q (the default priority)
local lanes = {}  -- priority -> entries for the other lanes
local grouped = {}  -- {metadata, entry} of the jobs of groups
local w_env, w_meta, w_jobs = {}, {}, {}
local call_json = cjson.encode(call)
-- One INCRBY reserves an entry token per job of the batch (unused ones are skipped).
local tok = redis.call('INCRBY', SEQ, n) - n
for j = 1, n do
  local i = A + 1 + (j - 1) * 5
  local id = ids[j]
  local raw = states[j]
  if raw and not seen[id] and expired(id, now) then raw = false end
  local st = stpart(raw)
  if seen[id] then
    st = seen[id]
    out[#out + 1] = {'d', st, false}
  elseif not st or starts(st, 'cancelled:') then
    if st then purge(id) end  -- what the cancelled incarnation left
    tok = tok + 1
    local tokstr = istr(tok)
    local mx, ttl = split(ARGV[i + 2])
    local ttl2, prio = split(ttl)
    if prio then ttl = ttl2 end
    local grp = nil
    if prio then
      local p2, g2 = split(prio)
      if p2 then prio, grp = p2, g2 end
    end
    prio = tonumber(prio) or DEFAULT_PRIORITY
    local run_at = tonumber(ARGV[i + 4])
    w_env[#w_env + 1] = id
    w_env[#w_env + 1] = ARGV[i + 1]
    w_meta[#w_meta + 1] = id
    w_meta[#w_meta + 1] = '{"a":0,"m":' .. mx .. ',"t":' .. ttl .. ',"k":"' .. tokstr .. '","c":"' .. nows .. '"' ..
      ',"q":' .. call_json .. ',"i":' .. cjson.encode(ARGV[i + 3]) ..
      (prio ~= DEFAULT_PRIORITY and (',"p":' .. istr(prio)) or '') ..
      (grp and (',"g":' .. cjson.encode(grp) .. '}') or '}')
    if run_at and run_at > now then
      st = 'delayed:' .. nows .. ':' .. istr(run_at)
      to_delayed(id, run_at)
    else
      st = 'queued:' .. nows
      if grp then
        grouped[#grouped + 1] = {{p = prio, g = grp}, tokstr .. ':' .. id}
      elseif prio == DEFAULT_PRIORITY then
        fresh[#fresh + 1] = tokstr .. ':' .. id
      else
        if not lanes[prio] then lanes[prio] = {} end
        table.insert(lanes[prio], tokstr .. ':' .. id)
        WAKE = WAKE + 1
      end
    end
    w_jobs[#w_jobs + 1] = id
    w_jobs[#w_jobs + 1] = st
    ev('enqueued', id, nil, nil, nil, ARGV[i + 3])
    out[#out + 1] = {'q'}
  else
    local m, r = nil, nil
    if isrec(raw) then
      local _
      _, m, r = unrec(raw)
      if not starts(st, 'completed:') then r = nil end
    else
      m = getm(id)
    end
    if m and m.q == call then
      out[#out + 1] = {'q'}  -- a retry of this very call after a lost reply
    elseif r then
      out[#out + 1] = {'c', st, r, m.i or false}
    else
      out[#out + 1] = {'d', st, m and m.i or false}
    end
  end
  seen[id] = st
end
for i = 1, #w_jobs, 1000 do  -- 500 fields a call (Lua's unpack has a stack limit)
  redis.call('HSET', ENV, unpack(w_env, i, math.min(i + 999, #w_env)))
  redis.call('HSET', META, unpack(w_meta, i, math.min(i + 999, #w_meta)))
end
setsts(w_jobs)
for i = 1, #fresh, 1000 do  -- RPUSH in chunks
  redis.call('RPUSH', Q, unpack(fresh, i, math.min(i + 999, #fresh)))
end
for p, entries in pairs(lanes) do
  local LANE = LANES[p + 1]
  for i = 1, #entries, 1000 do
    redis.call('RPUSH', LANE, unpack(entries, i, math.min(i + 999, #entries)))
  end
end
push_grouped(grouped)
due_flush()
flush()
