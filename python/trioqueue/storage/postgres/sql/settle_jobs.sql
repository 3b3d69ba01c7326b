-- j.id = ANY ($3) makes the batch's keys an index condition: a queue the statistics have
-- not seen is estimated at one row, and joined on u.id alone the planner hashed every job
-- of the queue (read through jobs_pkey on queue only) to settle the batch.
UPDATE {s}.jobs j SET state = u.state, state_ms = $2, attempts = j.attempts + u.delta,
                            result = CASE WHEN u.set_result THEN u.data ELSE j.result END,
                            error = CASE WHEN u.set_error THEN u.data ELSE j.error END,
                            expires_ms = u.expires, run_at_ms = u.run_at, worker = NULL, lease_ms = NULL
                        FROM unnest($3::text[], $4::text[], $5::int4[], $6::bool[], $7::bool[], $8::bytea[],
                                    $9::int8[], $10::int8[]) AS u(id, state, delta, set_result, set_error, data,
                                    expires, run_at)
                        WHERE j.queue = $1 AND j.id = ANY ($3::text[]) AND j.id = u.id
