-- Jobs ready now (or of a group) written in one statement, autocommit, with their events
-- and the claims' wake-up: the inserts (and replacements of cancelled/expired
-- incarnations) as in enqueue_rows, each written job's 'enqueued' event packed in SQL,
-- several to a NOTIFY payload (at most about 7.8 KB each), in the batch's order, then one
-- wake-up; nothing sent if nothing was written. Returns the ids not written (beside a row
-- of NULL), so that a batch written whole sends back one row. $9 (the groups): NULL when
-- no job has one (unnest pads it with NULLs).
WITH ins AS (
                    INSERT INTO {s}.jobs AS j (queue, id, state, state_ms, created_ms, priority, seq,
                        token, envelope, max_attempts, result_ttl, grp)
                    SELECT $1, u.id, 'queued', $2, $2, u.priority, nextval('{schema}.job_seq'), u.token, u.env, u.max, u.ttl, u.grp
                    FROM unnest($3::text[], $4::int2[], $5::text[], $6::bytea[], $7::int4[], $8::float8[], $9::text[])
                        WITH ORDINALITY AS u(id, priority, token, env, max, ttl, grp, ord)
                    ORDER BY u.ord  -- (seq in the batch's order: nextval runs after the sort)
                    ON CONFLICT (queue, id) DO UPDATE SET state = EXCLUDED.state, state_ms = $2, created_ms = $2, priority = EXCLUDED.priority, grp = EXCLUDED.grp, seq = EXCLUDED.seq, run_at_ms = EXCLUDED.run_at_ms, token = EXCLUDED.token, envelope = EXCLUDED.envelope, attempts = 0, max_attempts = EXCLUDED.max_attempts, result_ttl = EXCLUDED.result_ttl, worker = NULL, claim = NULL, claims = 0, started = false, lease_ms = NULL, cancel_requested = false, result = NULL, error = NULL, progress = NULL, steps = NULL, expires_ms = NULL, parent_queue = NULL, parent_id = NULL, parent_token = NULL, child_seq = NULL, policy = NULL, pending = NULL, nchildren = 0, failed_ids = NULL, failed_errors = NULL
                    WHERE j.state = 'cancelled' OR j.expires_ms <= $2
                    RETURNING j.id, j.token, j.seq),
                events AS (  -- (an entry past NOTIFY's limit: a resync)
                    SELECT ins.seq AS ord, CASE WHEN octet_length(e.entry) < 7900 THEN e.entry
                                                ELSE '["resync","",null,null,null,null]' END AS entry
                    FROM ins, LATERAL (SELECT json_build_array('enqueued', ins.id, NULL, NULL, NULL, ins.token)::text AS entry) e),
                packed AS (  -- consecutive entries, up to 6,000 bytes of them (3,800 if one is long), or one a payload
                    SELECT ord, entry, CASE WHEN m.longest > 3800 THEN ord
                        WHEN m.longest > 800 THEN sum(octet_length(entry)) OVER (ORDER BY ord) / 3800
                        ELSE sum(octet_length(entry)) OVER (ORDER BY ord) / 6000 END AS chunk
                    FROM events, (SELECT max(octet_length(entry)) AS longest FROM events) m),
                notes AS (
                    SELECT min(ord) AS first, '{"n":"' || $10 || '.' || min(ord) || '","e":['
                        || string_agg(entry, ',' ORDER BY ord) || ']}' AS payload
                    FROM packed GROUP BY chunk),
                sent AS (  -- (volatile: materialized, so evaluated, in order)
                    SELECT pg_notify($11, n.payload) FROM (SELECT * FROM notes ORDER BY first) n),
                woke AS (SELECT pg_notify($12, '') FROM (SELECT 1 FROM ins LIMIT 1) x),
                missed AS (  -- the ids not written (a NULL row first: the NOTIFYs go with it)
                    SELECT NULL::text AS id UNION ALL
                    SELECT u.id FROM unnest($3::text[]) AS u(id) WHERE NOT EXISTS (SELECT 1 FROM ins WHERE ins.id = u.id))
                SELECT id, (SELECT count(*) FROM sent) + (SELECT count(*) FROM woke) FROM missed
