UPDATE {s}.jobs SET envelope = $3, max_attempts = $4, result_ttl = $5,
                            run_at_ms = CASE WHEN state = 'delayed'
                                THEN LEAST($6::int8, COALESCE(created_ms + $7::int8, $6::int8)) ELSE run_at_ms END
                        WHERE queue = $1 AND id = $2 RETURNING state, state_ms, run_at_ms, token
