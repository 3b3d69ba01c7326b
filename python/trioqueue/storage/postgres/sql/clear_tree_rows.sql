-- clear: the jobs of trees go first, returned as remove_job returns one (tree_removed)
DELETE FROM {s}.jobs WHERE queue = $1 AND id = ANY($2::text[]) RETURNING id, state, parent_queue, parent_id, parent_token, policy, token, depended
