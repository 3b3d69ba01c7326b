-- (jobs_by_state leaves out the processing jobs: the branch of the other states says so
-- in a constant, so that a generic plan may use it; the other branch is the processing
-- jobs, sorted, through jobs_held; only the branch of $3 returns rows)
(SELECT id, state, state_ms, created_ms, attempts, max_attempts, result, error, token, progress, priority, worker, run_at_ms, parent_queue, parent_id, nchildren, grp FROM {s}.jobs WHERE queue = $1 AND (expires_ms IS NULL OR expires_ms > $2) AND state = $3 AND (state_ms, id) < ($5, $6) AND state <> 'processing' ORDER BY state_ms DESC, id DESC LIMIT $4)
UNION ALL
(SELECT id, state, state_ms, created_ms, attempts, max_attempts, result, error, token, progress, priority, worker, run_at_ms, parent_queue, parent_id, nchildren, grp FROM {s}.jobs WHERE queue = $1 AND (expires_ms IS NULL OR expires_ms > $2) AND state = $3 AND (state_ms, id) < ($5, $6) AND state = 'processing' ORDER BY state_ms DESC, id DESC LIMIT $4)
