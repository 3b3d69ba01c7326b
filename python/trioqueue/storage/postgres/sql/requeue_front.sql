-- j.id = ANY ($3) makes the batch's keys an index condition (see settle_jobs.sql).
UPDATE {s}.jobs j SET state = 'queued', state_ms = $2, worker = NULL, lease_ms = NULL,
                    claim = NULL, attempts = j.attempts - CASE WHEN $5 AND j.started THEN 1 ELSE 0 END,
                    started = false, seq = $4 + u.ord
                FROM unnest($3::text[]) WITH ORDINALITY AS u(id, ord)
                WHERE j.queue = $1 AND j.id = ANY ($3::text[]) AND j.id = u.id
