SELECT grp FROM {s}.paused_groups WHERE queue = $1 ORDER BY grp
