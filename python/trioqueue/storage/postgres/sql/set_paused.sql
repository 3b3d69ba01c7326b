UPDATE {s}.queues SET paused = $2 WHERE queue = $1 AND paused <> $2 RETURNING true
