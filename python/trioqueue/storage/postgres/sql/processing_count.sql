SELECT count(*) FROM {s}.jobs WHERE queue = $1 AND state = 'processing'
