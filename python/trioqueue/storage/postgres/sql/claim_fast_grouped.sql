-- Whether queue $1's ring has groups goes through group_ring's primary key (ORDER BY
-- queue, priority, grp LIMIT 1): EXISTS may be planned as a sequential scan (through
-- other queues' rows) or on group_ring_turn, whose front is the dead entries the turns
-- left since the last VACUUM (many pages with thousands of groups); no other index gives
-- this order. group_claim's row with rn 0 names a ready job it skipped (held by another
-- transaction): the last column, or NULL.
WITH q AS (
                    SELECT paused, coalesce((convert_from(flow, 'UTF8')::json ->> 'hold')::float8, 0) AS hold
                    FROM {s}.queues WHERE queue = $1),
                due AS (SELECT min(run_at_ms) AS at FROM {s}.jobs
                        WHERE queue = $1 AND state IN ('delayed', 'failing', 'waiting_signal')),
                ring AS (SELECT (SELECT true FROM {s}.group_ring WHERE queue = $1 ORDER BY queue, priority, grp LIMIT 1) IS NOT NULL
                    OR EXISTS (SELECT 1 FROM {s}.group_sleep WHERE queue = $1 AND due_ms <= $2) AS grouped),
                gate AS (SELECT NOT coalesce((SELECT paused FROM q), false)
                            AND coalesce((SELECT hold FROM q), 0) * 1000 <= $2
                            AND coalesce((SELECT at FROM due), 9e18) > $2 AS open),
                claimed AS (
                    SELECT g.rn, 0::bigint AS seq, g.id, g.envelope, g.attempts, g.claim, g.started
                    FROM {s}.group_claim($1, CASE WHEN (SELECT open FROM gate) THEN $3::int ELSE 0 END, $7::int,
                        $2, $4, $5, $6::int, $8::int, $9::int8) g)
                SELECT rn, seq, id, envelope, attempts, claim, started, NULL, NULL, NULL, NULL, NULL, NULL FROM claimed WHERE rn > 0
                UNION ALL
                SELECT NULL, NULL, NULL, NULL, NULL, NULL, NULL, (SELECT at FROM due), (SELECT hold FROM q),
                    (SELECT paused FROM q), (SELECT grouped FROM ring),
                    (SELECT min(due_ms) FROM {s}.group_sleep WHERE queue = $1),
                    (SELECT id FROM claimed WHERE rn = 0)
