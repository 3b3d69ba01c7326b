SELECT paused, flow FROM {s}.queues WHERE queue = $1 FOR UPDATE
