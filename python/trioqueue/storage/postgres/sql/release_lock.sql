DELETE FROM {s}.locks WHERE name = $1 AND owner = $2 AND expires_ms > $3 RETURNING true
