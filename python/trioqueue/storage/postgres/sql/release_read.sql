SELECT id, cancel_requested, token, started AND attempts >= max_attempts, attempts FROM {s}.jobs WHERE queue = $1 AND id = ANY($4::text[]) AND state = 'processing' AND worker = $3 FOR UPDATE
