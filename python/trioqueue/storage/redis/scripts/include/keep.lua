-- Count-based retention (Settlement.keep): ``keeps`` maps a terminal kind to how many of
-- its jobs to keep; the jobs of the kind past the newest that many in STATES order (when
-- they are forgotten: when they ended, for jobs that share a TTL) are forgotten as if
-- expired. Jobs of trees stay until their tree is done with them (their TTL then).
local function keep_newest(keeps)
  for k, keep in pairs(keeps) do
    local lo = KIND[k] * K44
    local over = redis.call('ZCOUNT', STATES, istr(lo), istr(lo + K44 - 1)) - keep
    if over > 0 then
      for _, id in ipairs(redis.call('ZRANGEBYSCORE', STATES, istr(lo), istr(lo + K44 - 1), 'LIMIT', 0, over)) do
        if redis.call('HEXISTS', TREE, id) == 0 then purge(id) end
      end
    end
  end
end
