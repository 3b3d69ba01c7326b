-- A job some job depends on stays out of count-based retention (its TTL only, as a tree's
-- jobs): depended, and linked by job_deps to this incarnation (an id enqueued again keeps
-- the flag, a hint, but no dependent names its new token).
WITH past AS (
                                SELECT id, state_ms, coalesce(octet_length(
                                    CASE WHEN state = 'completed' THEN result ELSE error END), 0) AS size
                                FROM {s}.jobs WHERE queue = $1 AND state = $2 AND state <> 'processing'  -- (a terminal state: see jobs_by_state)
                                ORDER BY state_ms DESC, id DESC OFFSET $3),
                            gone AS (
                                DELETE FROM {s}.jobs j USING past p
                                WHERE j.queue = $1 AND j.id = p.id AND j.parent_id IS NULL AND j.nchildren = 0 AND j.policy IS NULL AND NOT (j.depended AND EXISTS (SELECT 1 FROM {s}.job_deps o WHERE o.dep_queue = j.queue AND o.dep_id = j.id AND o.dep_token = j.token))
                                    AND (p.size <= $4 OR p.state_ms <= $5 - $6))
                            UPDATE {s}.jobs j SET expires_ms = least(j.expires_ms, p.state_ms + $6)
                            FROM past p WHERE j.queue = $1 AND j.id = p.id AND j.parent_id IS NULL
                                AND j.nchildren = 0 AND j.policy IS NULL AND NOT (j.depended AND EXISTS (SELECT 1 FROM {s}.job_deps o WHERE o.dep_queue = j.queue AND o.dep_id = j.id AND o.dep_token = j.token)) AND p.size > $4 AND p.state_ms > $5 - $6
