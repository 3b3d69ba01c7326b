-- A job about to be removed ($1 queue, $3 id; alive at $2): its token if it depends on jobs (and is not processing).
SELECT j.token FROM {s}.jobs j WHERE j.queue = $1 AND j.id = $3 AND (j.expires_ms IS NULL OR j.expires_ms > $2) AND j.state <> 'processing'
    AND EXISTS (SELECT 1 FROM {s}.job_deps d WHERE d.queue = j.queue AND d.id = j.id AND d.token = j.token)
