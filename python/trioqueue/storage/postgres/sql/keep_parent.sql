UPDATE {s}.jobs SET expires_ms = NULL WHERE queue = $1 AND id = $2
