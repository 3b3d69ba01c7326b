DELETE FROM {s}.group_claims WHERE queue = $1
