UPDATE {s}.jobs SET steps = coalesce(steps, '\x'::bytea) || $5 WHERE queue = $1 AND id = $4 AND state = 'processing' AND worker = $3 AND claim = $2 RETURNING true
