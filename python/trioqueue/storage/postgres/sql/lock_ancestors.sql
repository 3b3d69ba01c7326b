WITH RECURSIVE up(seed_queue, seed_id, queue, id, level) AS (
                    SELECT q, i, q, i, 0 FROM unnest($1::text[], $2::text[]) AS s(q, i)
                  UNION
                    SELECT up.seed_queue, up.seed_id, j.parent_queue, j.parent_id, up.level + 1 FROM up
                    JOIN {s}.jobs j ON j.queue = up.queue AND j.id = up.id
                    WHERE j.parent_id IS NOT NULL AND up.level < 64),
                top AS (SELECT seed_queue, seed_id, max(level) AS level FROM up GROUP BY seed_queue, seed_id),
                tree AS (SELECT up.queue, up.id, max(top.level - up.level) AS depth FROM up
                    JOIN top ON top.seed_queue = up.seed_queue AND top.seed_id = up.seed_id
                    GROUP BY up.queue, up.id)
                SELECT 1 FROM {s}.jobs j JOIN tree ON j.queue = tree.queue AND j.id = tree.id
                ORDER BY tree.depth, j.queue, j.id FOR UPDATE OF j
