UPDATE {s}.jobs j SET state = 'failed', state_ms = $2, worker = NULL, lease_ms = NULL,
                            claim = NULL, error = u.error, expires_ms = $2 + (j.result_ttl * 1000)::bigint
                        FROM unnest($3::text[], $4::bytea[]) AS u(id, error) WHERE j.queue = $1 AND j.id = u.id
