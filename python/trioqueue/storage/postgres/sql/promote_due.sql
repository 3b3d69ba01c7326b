WITH due AS (
                    SELECT id, state, run_at_ms FROM {s}.jobs
                    WHERE queue = $1 AND state IN ('delayed', 'failing', 'waiting_signal') AND run_at_ms <= $2
                    ORDER BY run_at_ms, seq LIMIT 1000 FOR UPDATE SKIP LOCKED)
                UPDATE {s}.jobs j SET state = 'queued', state_ms = $2, run_at_ms = NULL, wait_name = NULL, wait_count = NULL,
                    seq = nextval('{schema}.job_seq')
                FROM due WHERE j.queue = $1 AND j.id = due.id
                RETURNING j.id, due.state, j.token, due.run_at_ms
