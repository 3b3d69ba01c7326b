UPDATE {s}.jobs SET lease_ms = $2 WHERE queue = $1 AND id = $4 AND state = 'processing' AND worker = $3 AND claim = $5 RETURNING cancel_requested
