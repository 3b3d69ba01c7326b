WITH picked AS (
                            SELECT id, priority, seq FROM {s}.jobs WHERE queue = $1 AND state = 'queued' AND grp IS NULL
                            ORDER BY priority, seq LIMIT $3 FOR UPDATE SKIP LOCKED),
                        ordered AS (SELECT array_agg(id ORDER BY priority, seq) AS ids FROM picked)
                        UPDATE {s}.jobs j SET state = 'processing', state_ms = $2, worker = $4, lease_ms = $5,
                            claims = j.claims + 1, claim = j.token || '.' || (j.claims + 1),
                            started = array_position((SELECT ids FROM ordered), j.id) <= $6,
                            attempts = j.attempts + (array_position((SELECT ids FROM ordered), j.id) <= $6)::int
                        WHERE j.queue = $1 AND j.id = ANY ((SELECT ids FROM ordered)::text[])
                        RETURNING array_position((SELECT ids FROM ordered), j.id) AS rn, j.seq, j.id, j.envelope, j.attempts, j.claim, j.started
