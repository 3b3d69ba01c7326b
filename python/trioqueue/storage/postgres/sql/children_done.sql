UPDATE {s}.jobs SET state = 'queued', state_ms = $3, run_at_ms = NULL, seq = nextval('{schema}.job_seq') WHERE queue = $1 AND id = $2 RETURNING token
