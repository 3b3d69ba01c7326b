UPDATE {s}.jobs SET started = true, attempts = attempts + 1 WHERE queue = $1 AND id = ANY($2::text[])
