SELECT worker, expires_ms FROM {s}.workers WHERE queue = $1 AND ($2 OR expires_ms > $3)
