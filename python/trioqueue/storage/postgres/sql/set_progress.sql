UPDATE {s}.jobs SET progress = $5 WHERE queue = $1 AND id = $4 AND state = 'processing' AND worker = $3 AND claim = $2 RETURNING token
