-- The mailbox $3 stored; woken ($4): the waiting job queued again at the back of its lane.
UPDATE {s}.jobs SET signals = $3, state = CASE WHEN $4 THEN 'queued' ELSE state END,
                        state_ms = CASE WHEN $4 THEN $5 ELSE state_ms END, run_at_ms = CASE WHEN $4 THEN NULL ELSE run_at_ms END,
                        wait_name = CASE WHEN $4 THEN NULL ELSE wait_name END, wait_count = CASE WHEN $4 THEN NULL ELSE wait_count END,
                        seq = CASE WHEN $4 THEN nextval('{schema}.job_seq') ELSE seq END
                    WHERE queue = $1 AND id = $2
