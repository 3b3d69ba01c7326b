-- Signals to durable jobs (Job.wait_for_signal): a job's mailbox (the messages sent to it,
-- in the steps' stored form: storage._steps.encode_step, one entry a message, appended by
-- signal in the transaction that checks the job is live), kept with the job's row; and what
-- a job in the new state waiting_signal waits for (wait_name, and wait_count: how many
-- messages on it it needs), due at run_at_ms when its wait has a deadline. A new
-- incarnation written over the row starts with an empty mailbox (the enqueues and the
-- trees' inserts set it to NULL); retry_job keeps it; deleting the row forgets it.
ALTER TABLE {s}.jobs DROP CONSTRAINT IF EXISTS jobs_state_check;
ALTER TABLE {s}.jobs ADD CONSTRAINT jobs_state_check CHECK (state IN ('queued', 'delayed', 'processing', 'failing',
    'completed', 'failed', 'cancelled', 'waiting_children', 'waiting_signal'));
ALTER TABLE {s}.jobs ADD COLUMN IF NOT EXISTS signals bytea, ADD COLUMN IF NOT EXISTS wait_name text,
    ADD COLUMN IF NOT EXISTS wait_count integer;
-- the delayed set: a waiting job's deadline is due there too
DROP INDEX IF EXISTS {s}.jobs_due;
CREATE INDEX jobs_due ON {s}.jobs (queue, run_at_ms) WHERE state IN ('delayed', 'failing', 'waiting_signal');
