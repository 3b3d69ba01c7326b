-- After a short claim of the general path (in its transaction, whose claimed rows are no
-- longer queued): a ready job it skipped (SKIP LOCKED: another transaction holds it), or
-- one enqueued since; none when every ready job was claimed.
SELECT id FROM {s}.jobs WHERE queue = $1 AND state = 'queued' AND grp IS NULL ORDER BY priority, seq LIMIT 1
