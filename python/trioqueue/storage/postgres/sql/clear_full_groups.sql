DELETE FROM {s}.full_groups WHERE queue = $1
