-- j.id = ANY ($4), in both reads of jobs, makes the batch's keys an index condition
-- (see settle_jobs.sql).
UPDATE {s}.jobs j SET lease_ms = $2 FROM (
                            SELECT j.id FROM {s}.jobs j JOIN unnest($4::text[], $5::text[]) AS u(id, claim)
                                ON j.queue = $1 AND j.id = u.id AND j.claim = u.claim AND j.id = ANY ($4::text[])
                            WHERE j.state = 'processing' AND j.worker = $3 FOR NO KEY UPDATE OF j SKIP LOCKED) mine
                        WHERE j.queue = $1 AND j.id = ANY ($4::text[]) AND j.id = mine.id RETURNING j.id, j.claim, j.cancel_requested
