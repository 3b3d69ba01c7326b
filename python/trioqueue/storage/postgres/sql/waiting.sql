SELECT state, run_at_ms, claims > 0 FROM {s}.jobs WHERE queue = $1 AND id = $2 FOR UPDATE
