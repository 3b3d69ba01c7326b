UPDATE {s}.schedules SET spec = $3 WHERE queue = $1 AND name = $2 AND spec = $4 RETURNING true
