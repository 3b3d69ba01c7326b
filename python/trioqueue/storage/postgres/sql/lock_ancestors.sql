WITH RECURSIVE up(queue, id, depth) AS (
                    SELECT *, 1 FROM unnest($1::text[], $2::text[])
                  UNION
                    SELECT j.parent_queue, j.parent_id, up.depth + 1 FROM up
                    JOIN {s}.jobs j ON j.queue = up.queue AND j.id = up.id
                    WHERE j.parent_id IS NOT NULL AND up.depth < 64),
                anc AS (SELECT queue, id, max(depth) AS depth FROM up GROUP BY queue, id)
                SELECT 1 FROM {s}.jobs j JOIN anc ON j.queue = anc.queue AND j.id = anc.id
                ORDER BY anc.depth DESC, j.queue, j.id FOR UPDATE OF j
