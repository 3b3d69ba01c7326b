SELECT state, policy, pending, coalesce(cardinality(failed_ids), 0) FROM {s}.jobs WHERE queue = $1 AND id = $2
