SELECT envelope FROM {s}.jobs WHERE queue = $1 AND id = $3 AND (expires_ms IS NULL OR expires_ms > $2)
