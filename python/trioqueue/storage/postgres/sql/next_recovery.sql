SELECT least(
                        (SELECT min(run_at_ms) FROM {s}.jobs WHERE queue = $1 AND state IN ('delayed', 'failing', 'waiting_signal')),
                        (SELECT min(least(j.lease_ms, coalesce(w.expires_ms, 0))) FROM {s}.jobs j
                         LEFT JOIN {s}.workers w ON w.queue = j.queue AND w.worker = j.worker
                         WHERE j.queue = $1 AND j.state = 'processing'))
