-- Dependencies between jobs (depends_on). A dependent lists what it waits for in job_deps,
-- one row per dependency (in order: ord), both sides named with their incarnation tokens
-- (a row whose job was enqueued again under its id no longer applies); its own row is a
-- parent's (policy, pending, failed_ids/failed_errors: its dependencies are counted with
-- its children; nchildren counts the children only). A row goes with its dependent's job
-- row (ON DELETE CASCADE). jobs.depended marks a job some job depends on (or did, under
-- an earlier incarnation of its id: a hint only, read with job_deps): its end goes the
-- way of a tree's jobs (not the one-statement settlement), telling its dependents, and
-- count-based retention leaves it to its TTL.
ALTER TABLE {s}.jobs ADD COLUMN IF NOT EXISTS depended boolean NOT NULL DEFAULT false;
CREATE TABLE IF NOT EXISTS {s}.job_deps (
    queue text NOT NULL,
    id text NOT NULL,
    token text NOT NULL,
    ord integer NOT NULL,
    dep_queue text NOT NULL,
    dep_id text NOT NULL,
    dep_token text NOT NULL,
    PRIMARY KEY (queue, id, token, ord),
    FOREIGN KEY (queue, id) REFERENCES {s}.jobs (queue, id) ON DELETE CASCADE
);
CREATE INDEX IF NOT EXISTS job_deps_dep ON {s}.job_deps (dep_queue, dep_id, dep_token);
