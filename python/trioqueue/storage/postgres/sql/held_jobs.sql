SELECT id FROM {s}.jobs WHERE queue = $1 AND state = 'processing' AND worker = $2
