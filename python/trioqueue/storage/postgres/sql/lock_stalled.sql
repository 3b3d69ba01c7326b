SELECT j.id, j.worker, j.started, j.attempts, j.max_attempts, j.cancel_requested, j.token
                    FROM {s}.jobs j LEFT JOIN {s}.workers w ON w.queue = j.queue AND w.worker = j.worker
                    WHERE j.queue = $1 AND j.state = 'processing'
                      AND (j.lease_ms <= $2 OR w.expires_ms IS NULL OR w.expires_ms <= $2) ORDER BY j.lease_ms FOR UPDATE OF j SKIP LOCKED
