-- ARGV: worker, ttl_ms, lease_ms, then (id, claim token) pairs.
-- Renews the leases of the claims the worker still holds. Returns {requested, lost}:
-- requested, the ids among the held claims that have a cancel request; lost, flat
-- (id, claim token, why) triples for the claims it no longer holds (see lost_why in
-- storage/_records.py): 'fenced' (processing under another claim), 'cancelled' (the job
-- ended cancelled), 'recovered' (anything else). A claim that settled the job is neither.
--@include prelude
local W, ttl, lease = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
local now = now_ms()
redis.call('ZADD', WK, now + ttl, W)
local requested, lost = {}, {}
for i = 4, #ARGV, 2 do
  local id, claim = ARGV[i], ARGV[i + 1]
  local st = redis.call('HGET', JOBS, id)
  local m = st and meta_of(redis.call('HGET', META, id), st) or nil
  if starts(st, 'processing:') then
    if m and m.w == W and m.l == claim then
      redis.call('ZADD', L, 'XX', now + lease, id)
      if m.x == 1 then requested[#requested + 1] = id end
    else
      lost[#lost + 1] = id; lost[#lost + 1] = claim; lost[#lost + 1] = 'fenced'
    end
  elseif not (m and m.l == claim) then
    lost[#lost + 1] = id; lost[#lost + 1] = claim
    lost[#lost + 1] = (st and starts(stpart(st), 'cancelled:')) and 'cancelled' or 'recovered'
  end
end
return {requested, lost}
