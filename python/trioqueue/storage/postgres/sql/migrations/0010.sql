-- Fewer index entries a job, and the updates that change no indexed column HOT. Every
-- change of state wrote a new row version into every index whose condition it met: a
-- claim into the primary key, jobs_by_state, jobs_held and jobs_lease; the start of a
-- reserved claim (started, attempts) into the same four again, the row's page being full.
-- Now: jobs_lease is gone (the reaper's queries read every processing job of a queue, a
-- lease or its worker's heartbeat run out, which jobs_held's prefix gives as well), so a
-- lease renewal changes no indexed column; jobs_by_state leaves out the processing jobs
-- (their list and oldest go through jobs_held, bounded by the claims in flight), so a
-- claim writes two index entries (the primary key, jobs_held) instead of four; and the
-- table keeps a tenth of each new page free, so that the start of a reserved claim, a
-- lease renewal, a step saved or a progress report (no indexed column changed) is written
-- beside the row as a heap-only tuple, with no index entry at all.
DROP INDEX IF EXISTS {s}.jobs_lease;
DROP INDEX IF EXISTS {s}.jobs_by_state;
CREATE INDEX jobs_by_state ON {s}.jobs (queue, state, state_ms DESC, id DESC) WHERE state <> 'processing';
ALTER TABLE {s}.jobs SET (fillfactor = 90);
