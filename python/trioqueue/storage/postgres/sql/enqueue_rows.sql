INSERT INTO {s}.jobs AS j (queue, id, state, state_ms, created_ms, priority, seq, run_at_ms,
                        token, envelope, max_attempts, result_ttl, grp)
                    SELECT $1, u.id, CASE WHEN u.run_at IS NULL THEN 'queued' ELSE 'delayed' END, $2, $2, u.priority,
                        nextval('{schema}.job_seq'), u.run_at, u.token, u.env, u.max, u.ttl, u.grp
                    FROM unnest($3::text[], $4::int2[], $5::int8[], $6::text[], $7::bytea[], $8::int4[],
                                $9::float8[], $10::text[]) WITH ORDINALITY AS u(id, priority, run_at, token, env, max, ttl, grp, ord)
                    ORDER BY u.ord  -- (seq in the batch's order: nextval runs after the sort)
                    ON CONFLICT (queue, id) DO UPDATE SET state = EXCLUDED.state, state_ms = $2, created_ms = $2, priority = EXCLUDED.priority, grp = EXCLUDED.grp, seq = EXCLUDED.seq, run_at_ms = EXCLUDED.run_at_ms, token = EXCLUDED.token, envelope = EXCLUDED.envelope, attempts = 0, max_attempts = EXCLUDED.max_attempts, result_ttl = EXCLUDED.result_ttl, worker = NULL, claim = NULL, claims = 0, started = false, lease_ms = NULL, cancel_requested = false, result = NULL, error = NULL, progress = NULL, steps = NULL, signals = NULL, wait_name = NULL, wait_count = NULL, expires_ms = NULL, parent_queue = NULL, parent_id = NULL, parent_token = NULL, child_seq = NULL, policy = NULL, pending = NULL, nchildren = 0, failed_ids = NULL, failed_errors = NULL
                    WHERE j.state = 'cancelled' OR j.expires_ms <= $2
                    RETURNING id
