DELETE FROM {s}.group_ring WHERE queue = $1
