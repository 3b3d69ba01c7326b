INSERT INTO {s}.jobs AS j (queue, id, state, state_ms, created_ms, priority, seq, run_at_ms,
                        token, envelope, max_attempts, result_ttl, parent_queue, parent_id, parent_token, child_seq,
                        policy, pending, nchildren, grp)
                    VALUES ($1, $2, $3, $4, $4, $5, nextval('{schema}.job_seq'), $6, $7, $8, $9, $10, $11, $12,
                        $13, CASE WHEN $12::text IS NULL THEN NULL ELSE nextval('{schema}.job_seq') END,
                        $14, $15, coalesce($17, 0), $16)
                    ON CONFLICT (queue, id) DO UPDATE SET state = EXCLUDED.state, state_ms = $4, created_ms = $4, priority = EXCLUDED.priority, grp = EXCLUDED.grp, seq = EXCLUDED.seq, run_at_ms = EXCLUDED.run_at_ms, token = EXCLUDED.token, envelope = EXCLUDED.envelope, attempts = 0, max_attempts = EXCLUDED.max_attempts, result_ttl = EXCLUDED.result_ttl, worker = NULL, claim = NULL, claims = 0, started = false, lease_ms = NULL, cancel_requested = false, result = NULL, error = NULL, progress = NULL, steps = NULL, signals = NULL, wait_name = NULL, wait_count = NULL, expires_ms = NULL, parent_queue = EXCLUDED.parent_queue, parent_id = EXCLUDED.parent_id, parent_token = EXCLUDED.parent_token, child_seq = EXCLUDED.child_seq, policy = EXCLUDED.policy, pending = EXCLUDED.pending, nchildren = EXCLUDED.nchildren, failed_ids = NULL, failed_errors = NULL, depended = false
                    WHERE j.state = 'cancelled' OR j.expires_ms <= $4
                    RETURNING true
