-- The job a signal goes to, locked: its state, what it waits for, its mailbox, its token.
SELECT state, wait_name, wait_count, signals, token FROM {s}.jobs WHERE queue = $1 AND id = $3 AND (expires_ms IS NULL OR expires_ms > $2) FOR UPDATE
