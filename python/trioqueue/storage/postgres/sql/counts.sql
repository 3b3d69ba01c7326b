SELECT state, count(*) FROM {s}.jobs WHERE queue = $1 AND (expires_ms IS NULL OR expires_ms > $2) GROUP BY state
