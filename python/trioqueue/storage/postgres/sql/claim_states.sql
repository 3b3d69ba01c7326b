SELECT id, state, claim FROM {s}.jobs WHERE queue = $1 AND id = ANY($3::text[]) AND (expires_ms IS NULL OR expires_ms > $2)
