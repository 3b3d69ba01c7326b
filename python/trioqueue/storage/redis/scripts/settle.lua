-- KEYS[QK + 1]: the worker's processing list; the last KEY: the flow hash.
-- ARGV: worker, call token, then (id, data, '<kind c|f|r|x|l|w|s|g>:<ttl_ms>:<delay_ms>:<keep>',
-- claim token) per settlement (keep: '' or Settlement.keep, count-based retention: the
-- completed/failed jobs past the newest <keep> are forgotten at the end of this call).
-- Returns a list of 1 (settled, or already settled by this claim) / 0 (fenced: the claim
-- is not the job's current one in this worker's list), then 'tree' if a job of a tree
-- ended, then the groups to put back in the rings if any.
-- Reads the registry in one HMGET per hash and writes each hash once for the whole
-- batch; only the processing-list removal is per job.
--@include prelude
--@include delay
--@include cancel
--@include flow_free
--@include keep
--@include groups
--@include signal
local W, CALL = ARGV[1], ARGV[2]
local ids = {}
for i = 3, #ARGV, 4 do ids[#ids + 1] = ARGV[i] end
-- (after the first statement: locals of the Function's body, not its upvalues, which Lua
-- caps at 60; see _lua.library)
local P = KEYS[QK + 1]
local now = now_ms()
local nows = istr(now)
local out = {}
local wake = false
local hold = 0  -- RateLimited: no claim before this (ms)
local freed = false
local regroup = {}  -- groups whose slot this call freed while they were full (include groups)
local sts, metas = {}, {}
for i = 1, #ids, 1000 do
  local s = redis.call('HMGET', JOBS, unpack(ids, i, math.min(i + 999, #ids)))
  local m = redis.call('HMGET', META, unpack(ids, i, math.min(i + 999, #ids)))
  for k = 1, #s do sts[#sts + 1] = s[k]; metas[#metas + 1] = m[k] end
end
local cur_st, cur_m = {}, {}  -- what this batch changed (an id twice in one batch)
local w_meta, w_jobs, w_err, l_rem, env_del = {}, {}, {}, {}, {}
local w_rec, z_rec, m_del = {}, {}, {}  -- terminal records, their STATES scores, META fields gone
local first_due = nil  -- the earliest due time among z_rec (SWEEP_AT)
local specs = {}
local keeps = {}  -- terminal kind -> the least Settlement.keep of this call's settlements
local trees = false  -- a job of a tree of jobs ended or waits: tree_act follows
local function put(list, a, b) list[#list + 1] = a; list[#list + 1] = b end
local function whole(s) return s end
for j, id in ipairs(ids) do
  local i = 3 + (j - 1) * 4
  local data, meta, claim = ARGV[i + 1], ARGV[i + 2], ARGV[i + 3]
  local spec = specs[meta]
  if not spec then
    local kind_s, rest = split(meta)
    local ttl_s, rest2 = split(rest)
    local delay_s, keep_s = split(rest2)
    spec = {kind_s, tonumber(ttl_s), tonumber(delay_s), tonumber(keep_s)}
    specs[meta] = spec  -- a batch's settlements mostly share one
  end
  local kind, ttl, delay = spec[1], spec[2], spec[3]
  -- A job that count-based retention may forget (Settlement.keep) cannot be read back
  -- once another settlement counted it out: its result or error rides along whole.
  local carried = spec[4] and whole or small
  local st = cur_st[id] or sts[j]
  local m = cur_m[id] or meta_of(metas[j], sts[j])
  local held = m and starts(st, 'processing:') and m.w == W and m.l == claim
  if held and redis.call('LREM', P, '1', m.k .. ':' .. id) == 0 then held = false end
  if not held then
    if m and m.l == claim and not starts(st, 'processing:') then
      out[#out + 1] = 1  -- settled by this very claim already: a retried call
    else
      ev('fenced', id, W, nil, nil, m and m.i or nil)
      out[#out + 1] = 0
    end
  else
    out[#out + 1] = 1
    freed = true
    if spec[4] and (kind == 'c' or kind == 'f') then
      local k = kind == 'c' and 'completed' or 'failed'
      if not keeps[k] or spec[4] < keeps[k] then keeps[k] = spec[4] end
    end
    if m.g and redis.call('HDEL', FLOW, 'b:' .. m.g) == 1 then regroup[#regroup + 1] = m.g end
    if kind == 'l' or kind == 'w' or kind == 's' or kind == 'g' then
      if m.s == 1 then m.a = m.a - 1 end  -- rate limited, waiting or asleep: the attempt did not happen
    elseif m.s ~= 1 and kind ~= 'x' then
      m.a = m.a + 1  -- settled without start()
    end
    if m.cf == 1 and (kind == 'c' or kind == 'r' or kind == 'l' or kind == 's' or kind == 'g') then
      -- a child failed under 'cancel' (include tree): whatever this run ends with (but a
      -- failure of its own, or a cancel) fails it, as waiting for its children does; a
      -- run cut short after add_children runs again once they ended: it must not complete
      kind = 'w'
    end
    if kind == 'x' or kind == 'l' or kind == 'w' or kind == 's' or kind == 'g' or m.tr or (kind == 'r' and m.x == 1) or ((kind == 'c' or kind == 'f') and ttl <= 0) then
      -- the rare paths, one call at a time
      if m.tr then trees = true end
      redis.call('ZREM', L, id)
      if kind == 'c' then
        ev('completed', id, W, carried(data), nil, m.i)
        terminal(id, m, now, ttl, 'completed:' .. nows, data)
        redis.call('HDEL', ENV, id)
      elseif kind == 'f' then
        ev('failed', id, W, nil, carried(data), m.i)
        redis.call('HSET', ERRORS, id, data)  -- (a tree's job: kept; ttl <= 0: purged below)
        terminal(id, m, now, ttl, 'failed:' .. nows, '')
      elseif (kind == 'l' or kind == 's') and m.x ~= 1 then
        -- RateLimited: back as delayed, and the whole queue holds off as long; asleep
        -- (Job.sleep): back as delayed, and the queue goes on
        m.w = nil
        setm(id, m)
        setst(id, 'delayed:' .. nows .. ':' .. istr(now + delay))
        to_delayed(id, now + delay)
        if kind == 'l' then
          ev('rate_limited', id, W, nil, nil, m.i)
          if now + delay > hold then hold = now + delay end
        else
          ev('sleeping', id, W, nil, nil, m.i)
        end
        if delay <= 0 then wake = true end
      elseif kind == 'w' and m.x ~= 1 then
        -- WaitForChildren: waits (no slot, no lease) until its children are terminal
        m.w = nil
        m.s = nil
        m.tr = m.tr or 1
        setm(id, m)
        setst(id, 'waiting_children:' .. nows)
        redis.call('SADD', TNOTES, 'w' .. id)
        trees = true
      elseif kind == 'g' and m.x ~= 1 then
        park_signal(id, m, now, W, data)  -- waits for a signal (include signal)
      elseif kind == 'r' and m.x ~= 1 then
        -- a tree's job failed an attempt: as the common path below does, one at a time
        m.w = nil
        setm(id, m)
        setst(id, 'failing:' .. nows .. ':' .. istr(m.a))
        redis.call('HSET', ERRORS, id, data)
        to_delayed(id, now + delay)
        ev('failing', id, W, nil, small(data), m.i)
        if delay <= 0 then wake = true end
      else
        cancel_claimed(id, m, now, W)
      end
      cur_st[id] = stpart(redis.call('HGET', JOBS, id)) or 'gone:0'
      cur_m[id] = m  -- written (or purged) by terminal() already
    elseif kind == 'c' or kind == 'f' then
      st = (kind == 'c' and 'completed:' or 'failed:') .. nows
      m.w = nil
      if kind == 'c' then
        put(w_rec, id, record(st, m, data))
        ev('completed', id, W, carried(data), nil, m.i)
      else
        put(w_rec, id, record(st, m, ''))
        put(w_err, id, data)
        ev('failed', id, W, nil, carried(data), m.i)
      end
      put(z_rec, xidx(st, now + ttl), id)
      if not first_due or now + ttl < first_due then first_due = now + ttl end
      m_del[#m_del + 1] = id
      l_rem[#l_rem + 1] = id
      -- a completed job's envelope is not needed any more (a failed one's is: retry)
      if kind == 'c' then env_del[#env_del + 1] = id end
      cur_st[id] = st
    else
      m.w = nil
      st = 'failing:' .. nows .. ':' .. istr(m.a)
      put(w_jobs, id, st)
      put(w_err, id, data)
      l_rem[#l_rem + 1] = id
      to_delayed(id, now + delay)
      ev('failing', id, W, nil, small(data), m.i)
      if delay <= 0 then wake = true end
      cur_st[id] = st
    end
    if cur_m[id] ~= m then
      if m_del[#m_del] ~= id then put(w_meta, id, cjson.encode(m)) end
      cur_m[id] = m
    end
  end
end
for i = 1, #w_meta, 1000 do redis.call('HSET', META, unpack(w_meta, i, math.min(i + 999, #w_meta))) end
setsts(w_jobs)
for i = 1, #w_rec, 1000 do
  redis.call('HSET', JOBS, unpack(w_rec, i, math.min(i + 999, #w_rec)))
  redis.call('ZADD', STATES, unpack(z_rec, i, math.min(i + 999, #z_rec)))
end
if first_due then lower_sweep_at(first_due) end
for i = 1, #m_del, 1000 do redis.call('HDEL', META, unpack(m_del, i, math.min(i + 999, #m_del))) end
for i = 1, #w_err, 1000 do redis.call('HSET', ERRORS, unpack(w_err, i, math.min(i + 999, #w_err))) end
for i = 1, #l_rem, 1000 do redis.call('ZREM', L, unpack(l_rem, i, math.min(i + 999, #l_rem))) end
for i = 1, #env_del, 1000 do redis.call('HDEL', ENV, unpack(env_del, i, math.min(i + 999, #env_del))) end
-- a retry due now: wake a blocked claimer (the claim script drops this entry)
if wake then redis.call('RPUSH', Q, '~') end
if hold > 0 and hold > tonumber(redis.call('HGET', FLOW, 'h') or '0') then
  redis.call('HSET', FLOW, 'h', hold)
end
keep_newest(keeps)  -- count-based retention, in this atomic step (include keep)
if freed then slot_freed() end
due_flush()
flush()
if trees then out[#out + 1] = 'tree' end  -- (the caller runs tree_act)
if #regroup > 0 then out[#out + 1] = regroup end  -- (the caller runs group_requeue)
return out
