-- j.id = ANY ($3) makes the batch's keys an index condition (see settle_jobs.sql).
UPDATE {s}.jobs j SET state = 'failed', state_ms = $2, worker = NULL, lease_ms = NULL,
                            claim = NULL, error = u.error, expires_ms = $2 + (j.result_ttl * 1000)::bigint
                        FROM unnest($3::text[], $4::bytea[]) AS u(id, error) WHERE j.queue = $1 AND j.id = ANY ($3::text[]) AND j.id = u.id
