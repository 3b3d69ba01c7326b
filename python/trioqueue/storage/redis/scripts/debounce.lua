-- ARGV: the debounce (ms), max_wait (ms, or ''), then the call token and one job as
-- enqueue.lua takes it (id, envelope, '<max_attempts>:<result_ttl_ms>[:<priority>]',
-- incarnation token, ''). A waiting job of that id (delayed, or queued: never claimed in
-- this incarnation; one that ran, asleep or rate limited, is in the middle of its run)
-- takes the envelope, max attempts and result TTL, keeping its incarnation, priority
-- and creation time; a delayed one is due at now + debounce, never later than created +
-- max_wait. Returns {{'b', state, token}}; for any other id, what enqueue.lua returns,
-- the job due at now + debounce (server time).
--@include prelude
--@include groups
--@include delay
local A = 3  -- the call token's position in ARGV
do
  local now = now_ms()
  local id = ARGV[A + 1]
  local raw = redis.call('HGET', JOBS, id)
  if raw and expired(id, now) then raw = false end
  local st = raw and not isrec(raw) and raw or nil
  local m = st and (starts(st, 'delayed:') or starts(st, 'queued:')) and getm(id)
  if m and (m.n or 0) == 0 then
    local mx, ttl = split(ARGV[A + 3])
    local ttl2, prio = split(ttl)
    if prio then ttl = ttl2 end
    m.m, m.t = tonumber(mx), tonumber(ttl)
    setm(id, m)
    redis.call('HSET', ENV, id, ARGV[A + 2])
    if starts(st, 'delayed:') then
      local run_at = now + tonumber(ARGV[1])
      if ARGV[2] ~= '' then run_at = math.min(run_at, tonumber(m.c) + tonumber(ARGV[2])) end
      st = 'delayed:' .. string.match(st, '^delayed:(%d+):') .. ':' .. istr(run_at)
      setst(id, st)
      to_delayed(id, run_at)
      due_flush()
      flush()
    end
    return {{'b', st, m.i or false}}
  end
  local first = tonumber(ARGV[1])
  if ARGV[2] ~= '' then first = math.min(first, tonumber(ARGV[2])) end
  ARGV[A + 5] = istr(now + first)
end
--@include enqueue
return out
