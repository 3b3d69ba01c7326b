-- ARGV: call token, then (id, envelope, '<max_attempts>:<result_ttl_ms>', incarnation
-- token, run-at ms or '') per job.
-- Returns per job {'q'} | {'d', state, token} | {'c', state, result, token}.
--@include _prelude
local now = now_ms()
sweep(now, 100)
local call = ARGV[1]
local n = (#ARGV - 1) / 5
local out = {}
local seen = {}
local fresh = {}
local delayed = false
-- One INCRBY reserves an entry token per job of the batch (unused ones are skipped).
local tok = redis.call('INCRBY', SEQ, n) - n
for i = 2, #ARGV, 5 do
  local id = ARGV[i]
  local st = redis.call('HGET', JOBS, id)
  if st and expired(id, now) then st = false end
  local m = st and getm(id) or nil
  if seen[id] then
    out[#out + 1] = {'d', st, m and m.i or false}
  elseif not st or starts(st, 'cancelled:') then
    if st then purge(id) end  -- what the cancelled incarnation left
    tok = tok + 1
    local mx, ttl = split(ARGV[i + 2])
    local run_at = tonumber(ARGV[i + 4])
    redis.call('HSET', ENV, id, ARGV[i + 1])
    setm(id, {a = 0, m = tonumber(mx), t = tonumber(ttl), k = tok, c = now, q = call,
              i = ARGV[i + 3], n = 0, s = 0, x = 0})
    if run_at and run_at > now then
      st = 'delayed:' .. now .. ':' .. run_at
      redis.call('ZADD', D, run_at, id)
      delayed = true
    else
      st = 'queued:' .. now
      fresh[#fresh + 1] = tok .. ':' .. id
    end
    redis.call('HSET', JOBS, id, st)
    ev('enqueued', id, nil, nil, nil, ARGV[i + 3])
    out[#out + 1] = {'q'}
  elseif m and m.q == call then
    out[#out + 1] = {'q'}  -- a retry of this very call after a lost reply
  elseif starts(st, 'completed:') then
    local r = redis.call('HGET', RESULTS, id)
    if r then out[#out + 1] = {'c', st, r, m and m.i or false} else out[#out + 1] = {'d', st, m and m.i or false} end
  else
    out[#out + 1] = {'d', st, m and m.i or false}
  end
  seen[id] = true
end
for i = 1, #fresh, 1000 do  -- RPUSH in chunks (Lua's unpack has a stack limit)
  redis.call('RPUSH', Q, unpack(fresh, i, math.min(i + 999, #fresh)))
end
-- a delayed job: wake a blocked claimer so that it recomputes when to wake up
if delayed and #fresh == 0 then redis.call('RPUSH', Q, '~') end
flush()
return out
