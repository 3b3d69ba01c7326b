UPDATE {s}.jobs j SET state = 'queued', state_ms = $2, worker = NULL, lease_ms = NULL,
                            claim = NULL, started = false, seq = nextval('{schema}.job_seq')
                        FROM unnest($3::text[]) AS u(id) WHERE j.queue = $1 AND j.id = u.id
