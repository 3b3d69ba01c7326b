SELECT id, claim, started, cancel_requested, token FROM {s}.jobs WHERE queue = $1 AND id = ANY($4::text[]) AND state = 'processing' AND worker = $3 ORDER BY child_seq NULLS FIRST, id FOR UPDATE
