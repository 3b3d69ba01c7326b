-- The steps of durable jobs (Job.step): the stored form of a job's steps (storage._steps:
-- one entry per step, appended by save_step in one UPDATE fenced by the claim), kept with
-- the job's row. A new incarnation written over the row starts with none (the enqueues and
-- the trees' inserts set it to NULL, as they do its progress); retry_job keeps it unless
-- told to reset it; deleting the row forgets it.
ALTER TABLE {s}.jobs ADD COLUMN IF NOT EXISTS steps bytea;
