WITH picked AS (
                            SELECT id, priority, seq FROM {s}.jobs WHERE queue = $1 AND state = 'queued' AND grp IS NULL
                            ORDER BY priority, seq LIMIT $3 FOR UPDATE SKIP LOCKED),
                        numbered AS (SELECT id, priority, seq, row_number() OVER (ORDER BY priority, seq) AS rn FROM picked)
                        UPDATE {s}.jobs j SET state = 'processing', state_ms = $2, worker = $4, lease_ms = $5,
                            claims = j.claims + 1, claim = j.token || '.' || (j.claims + 1),
                            started = n.rn <= $6, attempts = j.attempts + (n.rn <= $6)::int
                        FROM numbered n WHERE j.queue = $1 AND j.id = n.id
                        RETURNING n.rn, n.seq, j.id, j.envelope, j.attempts, j.claim, j.started
