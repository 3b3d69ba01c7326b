UPDATE {s}.jobs SET pending = pending - 1, failed_ids = array_append(failed_ids, $3), failed_errors = array_append(failed_errors, $4) WHERE queue = $1 AND id = $2 RETURNING pending
