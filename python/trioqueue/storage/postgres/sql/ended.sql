SELECT id, state, error, parent_queue, parent_id, parent_token, policy, token FROM {s}.jobs WHERE queue = $1 AND id = ANY($2::text[]) AND (parent_id IS NOT NULL OR policy IS NOT NULL)
