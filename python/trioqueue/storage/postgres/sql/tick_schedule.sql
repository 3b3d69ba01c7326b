SELECT last_tick FROM {s}.schedules WHERE queue = $1 AND name = $2 FOR UPDATE
