SELECT queue, id, policy FROM {s}.jobs WHERE parent_queue = $1 AND parent_id = $2 AND parent_token = $3 AND state NOT IN ('completed', 'failed', 'cancelled') ORDER BY child_seq FOR UPDATE
