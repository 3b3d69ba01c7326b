UPDATE {s}.schedules SET last_tick = $3 WHERE queue = $1 AND name = $2
