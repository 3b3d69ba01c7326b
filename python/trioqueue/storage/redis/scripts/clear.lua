-- KEYS[QK + 1..]: the processing lists of the workers named in ARGV[2..] (the members of
-- PROCS the caller read just before); the last two KEYS: the rate log and the flow hash.
-- ARGV[1]: '1' to remove the schedules too. Forgets every job of the queue, in every
-- state, at once (UNLINK: the memory is freed in the background), and the flow-control
-- state (the groups' too: ready entries, rings, claimed slots, group_rate logs); keeps the
-- pause flag, the paused groups, the workers, the entry counter and (unless asked) the
-- schedules. Returns how many jobs it forgot ({n, 'tree'}: notes for the trees its jobs
-- were of are in TNOTES, the caller runs tree_act), or -1 (nothing changed) when PROCS names a
-- worker the caller did not pass: it reads PROCS again and retries.
--@include prelude
local lists = {}
for i = 2, #ARGV do lists[ARGV[i]] = KEYS[QK + i - 1] end
for _, w in ipairs(redis.call('SMEMBERS', PROCS)) do
  if not lists[w] then return -1 end
end
local RATE_LOG, FLOW = KEYS[#KEYS - 1], KEYS[#KEYS]
local n = redis.call('HLEN', JOBS)
-- its jobs' parents and dependents (on other queues: those of this one go too) count them
-- as remove.lua has them count a removed job ('u': one that had not ended, as cancelled;
-- 'd': a completed one, dropped from their lists), and its parents and dependents no
-- longer keep their children and dependencies ('r'); noted again once the keys are gone
local notes = {}
local tree = redis.call('HGETALL', TREE)
for i = 1, #tree, 2 do
  local id, t = tree[i], cjson.decode(tree[i + 1])
  local v = redis.call('HGET', JOBS, id)
  local u = nil  -- (nil: it failed or was cancelled, and was counted then)
  if v and starts(stpart(v), 'completed:') then u = 'd' elseif v and not isrec(v) then u = 'u' end
  if u and t.pa then notes[#notes + 1] = u .. cjson.encode(u == 'd' and {t.pq or '', t.pa, id} or {t.pq or '', t.pa}) end
  for k, d in ipairs(u and t.ds or {}) do
    notes[#notes + 1] = u .. cjson.encode(u == 'd' and {t.dsq[k], d, id} or {t.dsq[k], d})
  end
  for k, d in ipairs(t.dp or {}) do notes[#notes + 1] = 'r' .. cjson.encode({t.dq[k], d}) end
  for k, c in ipairs(t.ch or {}) do notes[#notes + 1] = 'r' .. cjson.encode({t.cq and t.cq[k] or '', c}) end
end
redis.call('UNLINK', JOBS, META, ENV, ERRORS, PROGRESS, D, L, SWEEP_AT, STATES, TREE, TNOTES, PROCS)
if #notes == 0 then redis.call('UNLINK', TQS) end  -- (else kept: tree_act declares those queues)
redis.call('UNLINK', unpack(LANES))
redis.call('UNLINK', RATE_LOG, FLOW)
-- the groups' ready entries, rings, claimed slots and group_rate logs (not GPAUSED)
redis.call('UNLINK', GREADY, RING, GRUN, GRATE, GSLEEP)
for _, P in pairs(lists) do redis.call('UNLINK', P) end
if ARGV[1] == '1' then redis.call('UNLINK', SCHED, SCHED_LAST) end
ev('cleared', '', nil, nil, nil, nil)
WAKE = 1  -- claims waiting for a concurrency slot look again
flush()
if #notes > 0 then
  for j = 1, #notes, 1000 do redis.call('SADD', TNOTES, unpack(notes, j, math.min(j + 999, #notes))) end
  return {n, 'tree'}  -- the caller runs tree_act
end
return n
