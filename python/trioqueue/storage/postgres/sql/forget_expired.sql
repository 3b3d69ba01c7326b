DELETE FROM {s}.jobs WHERE (queue, id) IN (SELECT queue, id FROM {s}.jobs WHERE queue = $1 AND expires_ms <= $2 LIMIT 5000 FOR UPDATE SKIP LOCKED)
