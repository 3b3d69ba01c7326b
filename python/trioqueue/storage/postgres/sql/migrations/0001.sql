CREATE SEQUENCE {s}.job_seq;
-- One row per job id and queue while the id is known (until its TTL runs out). The ready
-- list is the rows in state 'queued', ordered by (priority, seq); a job put back in front
-- gets a negative seq. The delayed set is the rows in state 'delayed'/'failing' by run_at_ms.
CREATE TABLE {s}.jobs (
    queue text NOT NULL,
    id text NOT NULL,
    state text NOT NULL CHECK (state IN ('queued', 'delayed', 'processing', 'failing', 'completed', 'failed', 'cancelled')),
    state_ms bigint NOT NULL,
    created_ms bigint NOT NULL,
    priority smallint NOT NULL,
    seq bigint NOT NULL,
    run_at_ms bigint,
    token text NOT NULL,
    envelope bytea NOT NULL,
    attempts integer NOT NULL DEFAULT 0,
    max_attempts integer NOT NULL,
    result_ttl double precision NOT NULL,
    worker text,
    claim text,
    claims integer NOT NULL DEFAULT 0,
    started boolean NOT NULL DEFAULT false,
    lease_ms bigint,
    cancel_requested boolean NOT NULL DEFAULT false,
    result bytea,
    error bytea,
    progress bytea,
    expires_ms bigint,
    PRIMARY KEY (queue, id)
);
CREATE INDEX jobs_ready ON {s}.jobs (queue, priority, seq) WHERE state = 'queued';
CREATE INDEX jobs_due ON {s}.jobs (queue, run_at_ms) WHERE state IN ('delayed', 'failing');
CREATE INDEX jobs_held ON {s}.jobs (queue, worker) WHERE state = 'processing';
CREATE INDEX jobs_lease ON {s}.jobs (queue, lease_ms) WHERE state = 'processing';
CREATE INDEX jobs_by_state ON {s}.jobs (queue, state, state_ms DESC, id DESC);
CREATE INDEX jobs_expiry ON {s}.jobs (expires_ms) WHERE expires_ms IS NOT NULL;
CREATE TABLE {s}.queues (
    queue text PRIMARY KEY,
    paused boolean NOT NULL DEFAULT false,
    flow bytea  -- the rate-limit log and RateLimited hold (FlowState, JSON)
);
CREATE TABLE {s}.workers (
    queue text NOT NULL,
    worker text NOT NULL,
    expires_ms bigint NOT NULL,
    PRIMARY KEY (queue, worker)
);
CREATE TABLE {s}.locks (
    name text PRIMARY KEY,
    owner text NOT NULL,
    expires_ms bigint NOT NULL
);
CREATE TABLE {s}.schedules (
    queue text NOT NULL,
    name text NOT NULL,
    spec bytea NOT NULL,
    last_tick double precision,
    PRIMARY KEY (queue, name)
);
