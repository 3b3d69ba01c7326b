UPDATE {s}.jobs SET state = 'cancelled', state_ms = $2, run_at_ms = NULL, expires_ms = $2 + ($4 * 1000)::bigint WHERE queue = $1 AND id = $3
