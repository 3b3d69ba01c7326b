SELECT queue, id, state, state_ms, created_ms, attempts, max_attempts, result, error, token, progress, priority, worker, run_at_ms, parent_queue, parent_id, nchildren, grp FROM {s}.jobs WHERE parent_queue = $1 AND parent_id = $3
                        AND parent_token = (SELECT token FROM {s}.jobs WHERE queue = $1 AND id = $3 AND (expires_ms IS NULL OR expires_ms > $2))
                        AND (expires_ms IS NULL OR expires_ms > $2) ORDER BY child_seq
