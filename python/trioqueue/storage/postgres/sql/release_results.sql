UPDATE {s}.jobs c SET expires_ms = $4 + (c.result_ttl * 1000)::bigint WHERE c.parent_queue = $1 AND c.parent_id = $2 AND c.parent_token = $3 AND c.expires_ms IS NULL AND c.state IN ('completed', 'failed', 'cancelled')
    AND NOT (c.depended AND EXISTS (SELECT 1 FROM {s}.job_deps o JOIN {s}.jobs w ON w.queue = o.queue AND w.id = o.id AND w.token = o.token
        WHERE o.dep_queue = c.queue AND o.dep_id = c.id AND o.dep_token = c.token AND w.state NOT IN ('completed', 'failed', 'cancelled')))
