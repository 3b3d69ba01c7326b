SELECT j.queue, j.id, j.state, j.state_ms, j.created_ms, j.attempts, j.max_attempts, j.result, j.error, j.token, j.progress, j.priority, j.worker, j.run_at_ms, j.parent_queue, j.parent_id, j.nchildren, j.grp FROM {s}.job_deps d JOIN {s}.jobs j ON j.queue = d.dep_queue AND j.id = d.dep_id AND j.token = d.dep_token
                        WHERE d.queue = $1 AND d.id = $3
                        AND d.token = (SELECT token FROM {s}.jobs WHERE queue = $1 AND id = $3 AND (expires_ms IS NULL OR expires_ms > $2))
                        AND (j.expires_ms IS NULL OR j.expires_ms > $2) ORDER BY d.ord
