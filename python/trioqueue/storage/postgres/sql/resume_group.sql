DELETE FROM {s}.paused_groups WHERE queue = $1 AND grp = $2 RETURNING true
