-- (expires_ms NULL: kept for a parent or dependent that waits, no TTL runs: spared)
DELETE FROM {s}.jobs WHERE queue = $1 AND state = $2 AND state <> 'processing' AND state_ms <= $3 AND expires_ms IS NOT NULL
