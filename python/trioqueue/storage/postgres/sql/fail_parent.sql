UPDATE {s}.jobs SET state = 'failed', state_ms = $3, worker = NULL, lease_ms = NULL, run_at_ms = NULL, error = $4, expires_ms = $3 + (result_ttl * 1000)::bigint WHERE queue = $1 AND id = $2
