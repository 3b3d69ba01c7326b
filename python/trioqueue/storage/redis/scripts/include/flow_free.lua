-- A script that frees concurrency slots (settle, release, recover: their last KEY is the
-- flow hash) wakes the claimers waiting for one through the control stream.
local FLOW = KEYS[#KEYS]
local function slot_freed()
  if redis.call('HDEL', FLOW, 'w') == 1 then
    redis.call('XADD', CTL, 'MAXLEN', '~', '100', '*', 'slot', '1')
  end
end
