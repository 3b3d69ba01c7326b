-- KEYS[QK + 1..]: the processing lists of the workers named in ARGV[2..] (the members of
-- PROCS the caller read just before); the last two KEYS: the rate log and the flow hash.
-- ARGV[1]: '1' to remove the schedules too. Forgets every job of the queue, in every
-- state, at once (UNLINK: the memory is freed in the background), and the flow-control
-- state (the groups' too: ready entries, rings, claimed slots, group_rate logs); keeps the
-- pause flag, the paused groups, the workers, the entry counter and (unless asked) the
-- schedules. Returns how many jobs it forgot, or -1 (nothing changed) when PROCS names a
-- worker the caller did not pass: it reads PROCS again and retries.
--@include prelude
local lists = {}
for i = 2, #ARGV do lists[ARGV[i]] = KEYS[QK + i - 1] end
for _, w in ipairs(redis.call('SMEMBERS', PROCS)) do
  if not lists[w] then return -1 end
end
local RATE_LOG, FLOW = KEYS[#KEYS - 1], KEYS[#KEYS]
local n = redis.call('HLEN', JOBS)
redis.call('UNLINK', JOBS, META, ENV, ERRORS, PROGRESS, D, L, SWEEP_AT, STATES, TREE, TNOTES, TQS, PROCS)
redis.call('UNLINK', unpack(LANES))
redis.call('UNLINK', RATE_LOG, FLOW)
-- the groups' ready entries, rings, claimed slots and group_rate logs (not GPAUSED)
redis.call('UNLINK', GREADY, RING, GRUN, GRATE, GSLEEP)
for _, P in pairs(lists) do redis.call('UNLINK', P) end
if ARGV[1] == '1' then redis.call('UNLINK', SCHED, SCHED_LAST) end
ev('cleared', '', nil, nil, nil, nil)
WAKE = 1  -- claims waiting for a concurrency slot look again
flush()
return n
