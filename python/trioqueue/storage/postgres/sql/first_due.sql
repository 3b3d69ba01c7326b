SELECT min(run_at_ms) FROM {s}.jobs WHERE queue = $1 AND state IN ('delayed', 'failing', 'waiting_signal')
