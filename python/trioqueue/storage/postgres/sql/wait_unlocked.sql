-- Wait (autocommit: the lock is let go at once) until no other transaction holds job $2
-- of queue $1, a ready or due job a claim skipped: its holder may end without a wake-up
-- (a rollback, or a commit that left the job as it was). FOR UPDATE, as the claims' (and
-- the promotion's) own lock: it waits for every lock that makes a claim skip the row.
SELECT 1 FROM {s}.jobs WHERE queue = $1 AND id = $2 AND state IN ('queued', 'delayed', 'failing', 'waiting_signal')
    FOR UPDATE
