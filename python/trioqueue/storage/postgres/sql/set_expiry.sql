UPDATE {s}.jobs SET expires_ms = $2 + ($4 * 1000)::bigint WHERE queue = $1 AND id = $3
