DELETE FROM {s}.schedules WHERE queue = $1
