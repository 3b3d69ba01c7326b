SELECT token FROM {s}.jobs WHERE queue = $1 AND id = $2 AND state = 'processing' AND worker = $3 AND claim = $4 AND NOT cancel_requested FOR UPDATE
