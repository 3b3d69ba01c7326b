-- Whether queue $1's ring has groups goes through group_ring's primary key (ORDER BY
-- queue, priority, grp LIMIT 1): EXISTS may be planned as a sequential scan (through
-- other queues' rows) or on group_ring_turn, whose front is the dead entries the turns
-- left since the last VACUUM (many pages with thousands of groups); no other index gives
-- this order.
SELECT (SELECT true FROM {s}.group_ring WHERE queue = $1 ORDER BY queue, priority, grp LIMIT 1) IS NOT NULL
                    OR EXISTS (SELECT 1 FROM {s}.group_sleep WHERE queue = $1 AND due_ms <= $2)
