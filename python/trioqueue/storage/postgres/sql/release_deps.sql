-- A dependent ($1 queue, $2 id, $3 token) ended or is being removed: its ended
-- dependencies that no parent or other dependent waits for any longer go by their own
-- TTLs (from $4), locked in one order.
WITH free AS (
    SELECT j.queue, j.id FROM {s}.job_deps d JOIN {s}.jobs j ON j.queue = d.dep_queue AND j.id = d.dep_id AND j.token = d.dep_token
    WHERE d.queue = $1 AND d.id = $2 AND d.token = $3 AND j.expires_ms IS NULL AND j.state IN ('completed', 'failed', 'cancelled')
        AND NOT EXISTS (SELECT 1 FROM {s}.job_deps o JOIN {s}.jobs w ON w.queue = o.queue AND w.id = o.id AND w.token = o.token
            WHERE o.dep_queue = j.queue AND o.dep_id = j.id AND o.dep_token = j.token AND w.state NOT IN ('completed', 'failed', 'cancelled')
            AND NOT (o.queue = $1 AND o.id = $2))
        AND NOT EXISTS (SELECT 1 FROM {s}.jobs p WHERE p.queue = j.parent_queue AND p.id = j.parent_id AND p.token = j.parent_token
            AND p.state NOT IN ('completed', 'failed', 'cancelled'))
    ORDER BY j.queue, j.id FOR UPDATE OF j)
UPDATE {s}.jobs j SET expires_ms = $4 + (j.result_ttl * 1000)::bigint FROM free WHERE j.queue = free.queue AND j.id = free.id
