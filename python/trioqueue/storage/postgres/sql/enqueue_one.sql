WITH ins AS (
                        INSERT INTO {s}.jobs AS j (queue, id, state, state_ms, created_ms, priority, seq,
                            token, envelope, max_attempts, result_ttl)
                        VALUES ($1, $3, 'queued', $2, $2, $4, nextval('{schema}.job_seq'), $5, $6, $7, $8)
                        ON CONFLICT (queue, id) DO UPDATE SET state = EXCLUDED.state, state_ms = $2, created_ms = $2, priority = EXCLUDED.priority, grp = EXCLUDED.grp, seq = EXCLUDED.seq, run_at_ms = EXCLUDED.run_at_ms, token = EXCLUDED.token, envelope = EXCLUDED.envelope, attempts = 0, max_attempts = EXCLUDED.max_attempts, result_ttl = EXCLUDED.result_ttl, worker = NULL, claim = NULL, claims = 0, started = false, lease_ms = NULL, cancel_requested = false, result = NULL, error = NULL, progress = NULL, steps = NULL, signals = NULL, wait_name = NULL, wait_count = NULL, expires_ms = NULL, parent_queue = NULL, parent_id = NULL, parent_token = NULL, child_seq = NULL, policy = NULL, pending = NULL, nchildren = 0, failed_ids = NULL, failed_errors = NULL
                        WHERE j.state = 'cancelled' OR j.expires_ms <= $2
                        RETURNING id),
                    sent AS (SELECT {notify} FROM ins)  -- (volatile: materialized, so evaluated)
                    SELECT (SELECT count(*) FROM ins) + 0 * (SELECT count(*) FROM sent)
