-- ARGV: '1' pause, '0' resume. Returns 1 if the flag changed. Resuming adds an entry to
-- the control stream, which waiting claimers block on (XREAD): they wake at once.
--@include prelude
local was = redis.call('EXISTS', PAUSED) == 1
local want = ARGV[1] == '1'
if was == want then return 0 end
if want then
  redis.call('SET', PAUSED, '1')
  ev('paused', '', nil, nil, nil, nil)
else
  redis.call('DEL', PAUSED)
  redis.call('XADD', CTL, 'MAXLEN', '~', '100', '*', 'resumed', '1')
  ev('resumed', '', nil, nil, nil, nil)
end
flush()
return 1
