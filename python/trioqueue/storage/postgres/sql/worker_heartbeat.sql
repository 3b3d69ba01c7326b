INSERT INTO {s}.workers (queue, worker, expires_ms) VALUES ($1, $2, $3) ON CONFLICT (queue, worker) DO UPDATE SET expires_ms = EXCLUDED.expires_ms
