SELECT parent_queue, parent_id, parent_token FROM {s}.jobs WHERE queue = $1 AND id = $2
