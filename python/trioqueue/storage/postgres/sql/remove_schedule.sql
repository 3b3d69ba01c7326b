DELETE FROM {s}.schedules WHERE queue = $1 AND name = $2 RETURNING true
