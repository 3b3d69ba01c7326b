DELETE FROM {s}.workers w WHERE w.queue = $1 AND w.expires_ms <= $2 AND NOT EXISTS (
                        SELECT 1 FROM {s}.jobs j WHERE j.queue = $1 AND j.state = 'processing'
                        AND j.worker = w.worker)
