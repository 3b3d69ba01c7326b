DELETE FROM {s}.workers WHERE queue = $1 AND worker = $2
