WITH s AS (
                    SELECT * FROM unnest($3::text[], $4::text[], $5::bytea[], $6::float8[], $7::text[])
                        WITH ORDINALITY AS u(id, claim, data, ttl, kind, ord)),
                upd AS (
                    UPDATE {s}.jobs j SET state = s.kind, state_ms = $2,
                        attempts = j.attempts + (NOT j.started)::int,
                        result = CASE WHEN s.kind = 'completed' THEN s.data ELSE j.result END,
                        error = CASE WHEN s.kind = 'failed' THEN s.data ELSE j.error END,
                        expires_ms = $2 + (s.ttl * 1000)::bigint, worker = NULL, lease_ms = NULL
                    FROM s WHERE j.queue = $1 AND j.id = s.id AND j.state = 'processing' AND j.worker = $8
                        AND j.claim = s.claim AND j.parent_id IS NULL AND j.policy IS NULL AND NOT j.depended  -- (trees, dependencies: the general path)
                    RETURNING j.id, j.token, s.kind, s.data, s.ord),
                events AS (  -- each event's entry: with its result/error if it fits, else without, else a resync
                    SELECT e.ord, CASE WHEN octet_length(e.full) < 7900 THEN e.full
                                       WHEN octet_length(e.slim) < 7900 THEN e.slim
                                       ELSE '["resync","",null,null,null,null]' END AS entry
                    FROM (SELECT upd.ord,
                            CASE WHEN length(upd.data) <= 6000 THEN json_build_array(upd.kind, upd.id, $8,
                                CASE WHEN upd.kind = 'completed' THEN encode(upd.data, 'base64') END,
                                CASE WHEN upd.kind = 'failed' THEN encode(upd.data, 'base64') END,
                                upd.token)::text END AS full,
                            json_build_array(upd.kind, upd.id, $8, NULL, NULL, upd.token)::text AS slim
                          FROM upd) e),
                packed AS (  -- consecutive entries, up to 3,800 bytes of them from the first on
                    SELECT ord, entry, CASE WHEN (SELECT max(octet_length(entry)) FROM events) > 3800 THEN ord
                        ELSE sum(octet_length(entry)) OVER (ORDER BY ord) / 3800 END AS chunk
                    FROM events),
                notes AS (
                    SELECT min(ord) AS first, '{"n":"' || $9 || '.' || min(ord) || '","e":['
                        || string_agg(entry, ',' ORDER BY ord) || ']}' AS payload
                    FROM packed GROUP BY chunk),
                sent AS (  -- (volatile: materialized, so evaluated, in order)
                    SELECT pg_notify($10, n.payload) FROM (SELECT * FROM notes ORDER BY first) n),
                woke AS (SELECT pg_notify($11, 's') FROM (SELECT 1 FROM upd LIMIT 1) x)  -- 's': slots freed
                SELECT id, (SELECT count(*) FROM sent) + (SELECT count(*) FROM woke) FROM upd
