SELECT paused FROM {s}.queues WHERE queue = $1
