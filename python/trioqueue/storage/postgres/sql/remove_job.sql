DELETE FROM {s}.jobs WHERE queue = $1 AND id = $3 AND (expires_ms IS NULL OR expires_ms > $2) AND state <> 'processing' RETURNING id, state, parent_queue, parent_id, parent_token, policy, token
