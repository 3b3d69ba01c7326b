-- Flow control of a claim (see ClaimLimits), spliced in after `paused` is known: the
-- RateLimited hold, the rate limit's sliding log of claims (zset claim token -> ms) and
-- the free concurrency slots (slots taken = processing jobs = leases) shrink MX; a claim
-- allowed nothing is refused as a paused one is (moved entries go back, the caller waits
-- on the control stream until flow_due() or a freed slot, announced by slot_freed()).
local RATE_LOG, FLOW = KEYS[#KEYS - 1], KEYS[#KEYS]
local F_RATE, F_PER, F_CONC = tonumber(ARGV[7] or '0'), tonumber(ARGV[8] or '0'), tonumber(ARGV[9] or '0')
local flow_wake = false
if not paused then
  local hold = tonumber(redis.call('HGET', FLOW, 'h') or '0')
  if hold > now then
    paused = true
    flow_wake = hold
  end
end
if not paused and F_RATE > 0 then
  redis.call('ZREMRANGEBYSCORE', RATE_LOG, '-inf', now - F_PER)
  local free = F_RATE - redis.call('ZCARD', RATE_LOG)
  if free <= 0 then
    paused = true
    local first = redis.call('ZRANGE', RATE_LOG, '0', '0', 'WITHSCORES')
    flow_wake = tonumber(first[2]) + F_PER
  elseif free < MX then
    MX = free
  end
end
if not paused and F_CONC > 0 then
  local free = F_CONC - redis.call('ZCARD', L)
  if free <= 0 then
    paused = true
    redis.call('HSET', FLOW, 'w', '1')
  elseif free < MX then
    MX = free
  end
end
-- count the claims made (each under its claim token, unique) against the rate
local function flow_claimed(claims, n)  -- claims: flat, five entries a claim (claim.lua)
  if F_RATE > 0 and n > 0 then
    local adds = {}
    local nows = istr(now)
    for k = 0, n - 1 do
      adds[#adds + 1] = nows
      adds[#adds + 1] = claims[k * 5 + 4]
    end
    for i = 1, #adds, 1000 do redis.call('ZADD', RATE_LOG, unpack(adds, i, math.min(i + 999, #adds))) end
    redis.call('PEXPIRE', RATE_LOG, F_PER + 1000)
  end
end
local function flow_due(nd)
  if flow_wake and (not nd or flow_wake < tonumber(nd)) then return flow_wake end
  return nd
end
