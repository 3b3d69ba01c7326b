-- The dependents of a job ($1 queue, $2 id, $3 token), in one order (the order they are locked in).
SELECT queue, id, token FROM {s}.job_deps WHERE dep_queue = $1 AND dep_id = $2 AND dep_token = $3 ORDER BY queue, id
