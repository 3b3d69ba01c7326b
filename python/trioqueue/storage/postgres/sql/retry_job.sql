UPDATE {s}.jobs SET state = 'queued', state_ms = $2, token = $4, attempts = 0,
                        seq = nextval('{schema}.job_seq'), claim = NULL, claims = 0, started = false,
                        cancel_requested = false, result = NULL, error = NULL, progress = NULL, steps = CASE WHEN $5 THEN NULL ELSE steps END, expires_ms = NULL,
                        run_at_ms = NULL, worker = NULL, lease_ms = NULL, parent_queue = NULL, parent_id = NULL, parent_token = NULL, child_seq = NULL, policy = NULL, pending = NULL, nchildren = 0, failed_ids = NULL, failed_errors = NULL
                    WHERE queue = $1 AND id = $3 AND state IN ('failed', 'cancelled') AND (expires_ms IS NULL OR expires_ms > $2) RETURNING true
