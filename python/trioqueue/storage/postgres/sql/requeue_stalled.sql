-- j.id = ANY ($3) makes the batch's keys an index condition (see settle_jobs.sql).
UPDATE {s}.jobs j SET state = 'queued', state_ms = $2, worker = NULL, lease_ms = NULL,
                            claim = NULL, started = false, seq = nextval('{schema}.job_seq')
                        FROM unnest($3::text[]) AS u(id) WHERE j.queue = $1 AND j.id = ANY ($3::text[]) AND j.id = u.id
