-- The dependencies named by a tree being written ($1 queues, $2 ids; alive at $3), locked
-- in one order without waiting (NOWAIT: the writer retries; see PgTrees.lock_deps).
SELECT queue, id, state, token, error FROM {s}.jobs WHERE (queue, id) IN (SELECT * FROM unnest($1::text[], $2::text[])) AND (expires_ms IS NULL OR expires_ms > $3) ORDER BY queue, id FOR UPDATE NOWAIT
