DELETE FROM {s}.jobs WHERE queue = $1 AND state = $2 AND state <> 'processing' AND state_ms <= $3
