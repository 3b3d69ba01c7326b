UPDATE {s}.jobs SET policy = coalesce(policy, $3), pending = coalesce(pending, 0) + $4, nchildren = nchildren + $4 WHERE queue = $1 AND id = $2
