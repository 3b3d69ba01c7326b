-- A held job settles waiting for a signal ($3: 'waiting_signal', due at $6 if a deadline;
-- 'queued': its messages had arrived, at the back of its lane), its attempt not counted.
UPDATE {s}.jobs SET state = $3, state_ms = $4, attempts = attempts + $5, run_at_ms = $6, wait_name = $7, wait_count = $8,
                        worker = NULL, lease_ms = NULL, seq = CASE WHEN $3 = 'queued' THEN nextval('{schema}.job_seq') ELSE seq END
                    WHERE queue = $1 AND id = $2
