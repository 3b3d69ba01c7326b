SELECT min(due_ms) FROM {s}.group_sleep WHERE queue = $1
