SELECT j.id FROM {s}.jobs j LEFT JOIN {s}.workers w ON w.queue = j.queue AND w.worker = j.worker
                    WHERE j.queue = $1 AND j.state = 'processing'
                      AND (j.lease_ms <= $2 OR w.expires_ms IS NULL OR w.expires_ms <= $2)
