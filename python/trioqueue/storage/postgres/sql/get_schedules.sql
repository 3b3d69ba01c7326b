SELECT name, spec, last_tick FROM {s}.schedules WHERE queue = $1
