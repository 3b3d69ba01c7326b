UPDATE {s}.jobs SET pending = pending - 1 WHERE queue = $1 AND id = $2 RETURNING pending
