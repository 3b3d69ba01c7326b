-- Whether queue $1's ring has groups goes through group_ring's primary key (ORDER BY
-- queue, priority, grp LIMIT 1): EXISTS may be planned as a sequential scan (through
-- other queues' rows) or on group_ring_turn, whose front is the dead entries the turns
-- left since the last VACUUM (many pages with thousands of groups); no other index gives
-- this order. The last column, when the claim came back short: the first ready job it
-- skipped (SKIP LOCKED: another transaction held it; this statement's snapshot, read
-- without locks, still shows it queued), or NULL.
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
                picked AS (
                    SELECT id, priority, seq FROM {s}.jobs WHERE queue = $1 AND state = 'queued'
                        AND grp IS NULL AND (SELECT open FROM gate) AND NOT (SELECT grouped FROM ring)
                    ORDER BY priority, seq LIMIT $3 FOR UPDATE SKIP LOCKED),
                ordered AS (SELECT array_agg(id ORDER BY priority, seq) AS ids FROM picked),
                claimed AS (
                    UPDATE {s}.jobs j SET state = 'processing', state_ms = $2, worker = $4, lease_ms = $5,
                        claims = j.claims + 1, claim = j.token || '.' || (j.claims + 1),
                        started = array_position((SELECT ids FROM ordered), j.id) <= $6,
                        attempts = j.attempts + (array_position((SELECT ids FROM ordered), j.id) <= $6)::int
                    WHERE j.queue = $1 AND j.id = ANY ((SELECT ids FROM ordered)::text[])
                    RETURNING array_position((SELECT ids FROM ordered), j.id) AS rn, j.seq, j.id, j.envelope, j.attempts, j.claim, j.started)
                SELECT rn, seq, id, envelope, attempts, claim, started, NULL, NULL, NULL, NULL, NULL, NULL FROM claimed
                UNION ALL
                SELECT NULL, NULL, NULL, NULL, NULL, NULL, NULL, (SELECT at FROM due), (SELECT hold FROM q),
                    (SELECT paused FROM q), (SELECT grouped FROM ring),
                    (SELECT min(due_ms) FROM {s}.group_sleep WHERE queue = $1),
                    CASE WHEN (SELECT count(*) FROM picked) < $3 THEN (
                        SELECT k.id FROM {s}.jobs k WHERE k.queue = $1 AND k.state = 'queued' AND k.grp IS NULL
                            AND (SELECT open FROM gate) AND NOT (SELECT grouped FROM ring)
                            AND k.id <> ALL (coalesce((SELECT ids FROM ordered), '{}')::text[])
                        ORDER BY k.priority, k.seq LIMIT 1) END
