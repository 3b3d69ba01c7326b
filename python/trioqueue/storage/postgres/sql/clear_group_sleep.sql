DELETE FROM {s}.group_sleep WHERE queue = $1
