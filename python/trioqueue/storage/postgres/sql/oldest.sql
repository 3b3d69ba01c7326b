-- (jobs_by_state leaves out the processing jobs: the branch of the other states says so
-- in a constant, so that a generic plan may use it; a CASE's subqueries run only if taken)
SELECT CASE WHEN $2 = 'processing'
            THEN (SELECT min(state_ms) FROM {s}.jobs WHERE queue = $1 AND state = 'processing')
            ELSE (SELECT min(state_ms) FROM {s}.jobs WHERE queue = $1 AND state = $2 AND state <> 'processing') END
