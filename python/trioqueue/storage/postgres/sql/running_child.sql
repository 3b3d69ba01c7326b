SELECT token, worker, cancel_requested FROM {s}.jobs WHERE queue = $1 AND id = $2 AND state = 'processing'
