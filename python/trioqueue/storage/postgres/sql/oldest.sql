SELECT min(state_ms) FROM {s}.jobs WHERE queue = $1 AND state = $2
