UPDATE {s}.jobs SET cancel_requested = true WHERE queue = $1 AND id = $2
