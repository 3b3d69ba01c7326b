-- Scripts acting on several queues of the storage (trees of jobs across queues; include
-- it after prelude and delay): KEYS holds the same keys of each queue in turn (QK a
-- queue, in the order of the names given to set_queues), and use_queue(name) points the
-- key variables at that queue's, after publishing what the queue in use had pending
-- (events, wake-ups, 'due'). On Redis Cluster such queues share a slot (a hash tag).
local TK = KEYS
local QN = {}  -- the queues' names, in KEYS order
local QAT = {}  -- name -> offset of its keys in KEYS
local CURQ = ''  -- the queue the key variables are of
local function set_queues(names)
  for j, q in ipairs(names) do
    QN[j] = q
    QAT[q] = (j - 1) * QK
  end
  CURQ = names[1]
end
local function use_queue(q)
  if q == CURQ then return end
  local K, o = TK, QAT[q]
  if not o then error('trioqueue: queue ' .. tostring(q) .. ' is not among the keys of this call') end
  --@due
  flush()
  --@rekey
  LISTEN = nil
  CURQ = q
end
-- the queues that trees with a job on a declared queue span and that are not declared
-- (nil if none): the caller declares them too and calls again
local function undeclared()
  local missing = nil
  for _, q in ipairs(QN) do
    use_queue(q)
    for _, x in ipairs(redis.call('SMEMBERS', TQS)) do
      if not QAT[x] then
        missing = missing or {}
        missing[#missing + 1] = x
      end
    end
  end
  use_queue(QN[1])
  return missing
end
-- the jobs of a tree written by this call span queues qs (more than one): each of them
-- learns them all (undeclared() finds the rest of them from any one)
local function link_queues(qs)
  for _, q in ipairs(qs) do
    use_queue(q)
    redis.call('SADD', TQS, unpack(qs))
  end
end
-- the jobs of a tree, by the index of their queue: each queue's as one enqueue call's ARGV
-- (the call token, then the five fields of each job; the tree's jobs follow argv[first])
local function tree_argv(tree, argv, token, first)
  local groups = {}
  for j, job in ipairs(tree) do
    local g = groups[job.q]
    if not g then
      g = {token}
      groups[job.q] = g
    end
    for k = 1, 5 do g[#g + 1] = argv[first + (j - 1) * 5 + k] end
  end
  return groups
end
