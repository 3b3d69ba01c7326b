-- ARGV: state kind, limit, cursor ms ('' for the first page), cursor id.
-- Returns {records, next cursor ms or false, next cursor id or false}; each record is
-- {id, state, created_ms, attempts, max_attempts, result, error, token, progress}.
-- Newest first (terminal kinds: the last to be forgotten first, which is the newest
-- first when the jobs share a result TTL): the kind's score range of STATES in reverse,
-- paged by rank. The cursor is
-- the (ms, id) of the last job of the previous page; its rank is found by putting it in
-- place for a moment (restoring the member's own score, if it has one), so the next page
-- starts right after it even if that job has left the state since.
--@include prelude
sweep(now_ms(), 1000)
local k = KIND[ARGV[1]]
local limit = tonumber(ARGV[2])
local lo = k * K44
local start
if ARGV[3] == '' then
  start = redis.call('ZCOUNT', STATES, '(' .. istr(lo + K44 - 1), '+inf')
else
  local sc = lo + tonumber(ARGV[3])
  local cid = ARGV[4]
  local old = redis.call('ZSCORE', STATES, cid)
  redis.call('ZADD', STATES, istr(sc), cid)
  start = redis.call('ZREVRANK', STATES, cid)
  if old then
    redis.call('ZADD', STATES, old, cid)
    if tonumber(old) >= sc then start = start + 1 end
  else
    redis.call('ZREM', STATES, cid)
  end
end
local got = redis.call('ZRANGE', STATES, start, start + limit, 'REV', 'WITHSCORES')
local recs = {}
local nxt_ms, nxt_id = false, false
for i = 1, #got, 2 do
  local id, score = got[i], tonumber(got[i + 1])
  if score < lo then break end
  if #recs == limit then
    local last = recs[#recs]
    nxt_ms, nxt_id = last[12], last[1]
    break
  end
  local r = report(id) or {'', '0', '0', '0', false, false, false, false, DEFAULT_PRIORITY, false}
  recs[#recs + 1] = {id, r[1], r[2], r[3], r[4], r[5], r[6], r[7], r[8], tostring(r[9]), r[10], istr(score - lo)}
end
for _, r in ipairs(recs) do r[12] = nil end
return {recs, nxt_ms, nxt_id}
