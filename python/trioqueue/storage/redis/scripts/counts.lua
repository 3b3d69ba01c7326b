-- Returns the number of jobs in each state kind, in the order of KIND (queued, delayed,
-- processing, failing, completed, failed, cancelled, waiting_children, waiting_signal). Expired entries are swept first.
--@include prelude
sweep(now_ms(), 1000)
local out = {}
for k = 0, 8 do
  out[k + 1] = redis.call('ZCOUNT', STATES, istr(k * K44), istr(k * K44 + K44 - 1))
end
return out
