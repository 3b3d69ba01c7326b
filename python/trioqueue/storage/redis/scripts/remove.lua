-- ARGV: id. Forgets a job that is not processing (its ready-list entry no longer matches
-- any metadata: dropped when met). Returns 1, 2 (forgotten, and it was a child of a tree
-- of jobs, a parent, a dependency or a dependent: its parent, children, dependents or dependencies are noted
-- in TNOTES, the caller runs tree_act), or 0 (unknown or processing).
--@include prelude
local id = ARGV[1]
local now = now_ms()
if expired(id, now) then return 0 end
local st = redis.call('HGET', JOBS, id)
if not st or starts(st, 'processing:') then return 0 end
local m = getm(id) or {}
local raw = (m.tr or isrec(st)) and redis.call('HGET', TREE, id)  -- (an ended job's record has no META)
local t = raw and cjson.decode(raw)
purge(id)
ev('removed', id, nil, nil, nil, m.i)
flush()
-- a removed child counts as cancelled for its parent, a removed dependency for its
-- dependents ('u'); one that had completed no longer counts at all ('d': its outcome was
-- counted when it ended; the note drops it from their lists, and until then tree_eval
-- finds the note and counts it completed)
local noted = false
local u = starts(stpart(st), 'completed:') and 'd' or 'u'
if t and t.pa then
  redis.call('SADD', TNOTES, u .. cjson.encode(u == 'd' and {t.pq or '', t.pa, id} or {t.pq or '', t.pa}))
  noted = true
end
for k, d in ipairs(t and t.ds or {}) do
  redis.call('SADD', TNOTES, u .. cjson.encode(u == 'd' and {t.dsq[k], d, id} or {t.dsq[k], d}))
  noted = true
end
-- a removed dependent no longer needs its dependencies kept, a removed parent its children
for k, d in ipairs(t and t.dp or {}) do
  redis.call('SADD', TNOTES, 'r' .. cjson.encode({t.dq[k], d}))
  noted = true
end
for k, c in ipairs(t and t.ch or {}) do
  redis.call('SADD', TNOTES, 'r' .. cjson.encode({t.cq and t.cq[k] or '', c}))
  noted = true
end
if noted then return 2 end
return 1
