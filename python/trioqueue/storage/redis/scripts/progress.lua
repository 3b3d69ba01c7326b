-- ARGV: worker, id, claim token, progress. Returns 1 if stored, 0 if the claim is not held.
--@include prelude
local W, id, claim, value = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
local st = redis.call('HGET', JOBS, id)
local m = st and getm(id) or nil
if not (m and starts(st, 'processing:') and m.w == W and m.l == claim) then return 0 end
redis.call('HSET', PROGRESS, id, value)
ev('progress', id, W, value, nil, m.i)
flush()
return 1
