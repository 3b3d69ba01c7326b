"""The PostgresStorage schema: versioned migrations, run under an advisory lock.

Every table lives in one PostgreSQL schema (``trioqueue`` by default; the ``schema=``
option of :class:`~trioqueue.storage.postgres.PostgresStorage` and of
:func:`migrate`), so that several independent deployments share a database without
sharing jobs. ``<schema>.version`` records the migrations applied (one row each).

:func:`migrate` takes a session-level advisory lock (keyed by the schema name) for its
whole run: two processes starting together (two workers, a worker and ``trioqueue
migrate``) serialize, the second finds the work done. Each migration runs in its own
transaction together with the row recording it, so a failed migration leaves nothing
half-applied.
"""

from __future__ import annotations

import re

import trio

from ..._drivers.libpq import Connection, PostgresError

__all__ = ["MIGRATIONS", "SCHEMA_VERSION", "check_schema_name", "migrate", "schema_version"]

_NAME = re.compile(r"[a-z_][a-z0-9_]{0,62}")

# (version, SQL) in order; ``{s}`` is the quoted schema name. Never edit a released
# migration: add the next one.
MIGRATIONS: list[tuple[int, str]] = [
    (
        1,
        """
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
""",
    ),
    (
        2,
        """
-- Trees of jobs (flows). A child names its parent (queue, id) and the parent's incarnation
-- token (a parent replaced by a new incarnation has no children), child_seq orders the
-- children. A parent has its on_child_failure policy, how many children have not ended
-- (pending), how many it has (nchildren), and the failed/cancelled children so far.
ALTER TABLE {s}.jobs DROP CONSTRAINT jobs_state_check;
ALTER TABLE {s}.jobs ADD CONSTRAINT jobs_state_check CHECK (state IN ('queued', 'delayed', 'processing', 'failing',
    'completed', 'failed', 'cancelled', 'waiting_children'));
ALTER TABLE {s}.jobs ADD COLUMN parent_queue text, ADD COLUMN parent_id text, ADD COLUMN parent_token text,
    ADD COLUMN child_seq bigint, ADD COLUMN policy text, ADD COLUMN pending integer,
    ADD COLUMN nchildren integer NOT NULL DEFAULT 0, ADD COLUMN failed_ids text[], ADD COLUMN failed_errors bytea[];
CREATE INDEX jobs_children ON {s}.jobs (parent_queue, parent_id, child_seq) WHERE parent_id IS NOT NULL;
""",
    ),
    (
        3,
        """
-- Groups (fair queuing). A job's group (NULL: none). The ring: per queue and priority, the
-- groups with ready jobs, served in turn order (a claim takes the first and gives it a new
-- turn, the last; '' is the jobs without a group, in the ring while groups are); a job of
-- a group entering 'queued' puts its group in the ring (trigger). A group passed over for
-- its group_concurrency is in full_groups until one of its jobs leaves processing, which
-- puts it back in the rings (trigger). A claim counts a group's slots, and the trigger
-- looks for its mark, under one advisory transaction lock per (queue, group), so that a
-- settlement never misses a mark made by a claim that counted its job. group_rate: a
-- group's claims of the last window are rows of group_claims; a group over its rate
-- rests in group_sleep, out of the rings, until the claims put it back.
ALTER TABLE {s}.jobs ADD COLUMN grp text;
CREATE INDEX jobs_ready_plain ON {s}.jobs (queue, priority, seq) WHERE state = 'queued' AND grp IS NULL;
CREATE INDEX jobs_ready_group ON {s}.jobs (queue, priority, grp, seq) WHERE state = 'queued' AND grp IS NOT NULL;
CREATE INDEX jobs_held_group ON {s}.jobs (queue, grp) WHERE state = 'processing' AND grp IS NOT NULL;
CREATE TABLE {s}.group_ring (
    queue text NOT NULL,
    priority smallint NOT NULL,
    grp text NOT NULL,
    turn bigint NOT NULL,
    PRIMARY KEY (queue, priority, grp)
);
CREATE INDEX group_ring_turn ON {s}.group_ring (queue, priority, turn);
CREATE TABLE {s}.paused_groups (queue text NOT NULL, grp text NOT NULL, PRIMARY KEY (queue, grp));
CREATE TABLE {s}.full_groups (queue text NOT NULL, grp text NOT NULL, PRIMARY KEY (queue, grp));
CREATE TABLE {s}.group_claims (queue text NOT NULL, grp text NOT NULL, at_ms bigint NOT NULL);
CREATE INDEX group_claims_at ON {s}.group_claims (queue, grp, at_ms);
CREATE TABLE {s}.group_sleep (queue text NOT NULL, grp text NOT NULL, due_ms bigint NOT NULL, PRIMARY KEY (queue, grp));
CREATE INDEX group_sleep_due ON {s}.group_sleep (queue, due_ms);
CREATE FUNCTION {s}.group_requeue(q text, g text) RETURNS void LANGUAGE sql AS $$
    INSERT INTO {s}.group_ring (queue, priority, grp, turn)
        SELECT q, p, g, nextval('{s}.job_seq') FROM generate_series(0, 9) AS p
        WHERE EXISTS (SELECT 1 FROM {s}.jobs j WHERE j.queue = q AND j.state = 'queued' AND j.priority = p AND j.grp = g)
        ON CONFLICT DO NOTHING
$$;
CREATE FUNCTION {s}.group_over_rate(q text, g text, grate integer, gper bigint, now_ms bigint) RETURNS boolean
    LANGUAGE plpgsql AS $$
DECLARE
    first bigint;
BEGIN
    DELETE FROM {s}.group_claims c WHERE c.queue = q AND c.grp = g AND c.at_ms <= now_ms - gper;
    IF (SELECT count(*) FROM {s}.group_claims c WHERE c.queue = q AND c.grp = g) < grate THEN
        RETURN false;
    END IF;
    SELECT min(c.at_ms) INTO first FROM {s}.group_claims c WHERE c.queue = q AND c.grp = g;
    INSERT INTO {s}.group_sleep VALUES (q, g, first + gper)
        ON CONFLICT (queue, grp) DO UPDATE SET due_ms = least({s}.group_sleep.due_ms, EXCLUDED.due_ms);
    RETURN true;
END
$$;
CREATE FUNCTION {s}.group_moved() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.state = 'queued' THEN
        INSERT INTO {s}.group_ring (queue, priority, grp, turn)
            VALUES (NEW.queue, NEW.priority, NEW.grp, nextval('{s}.job_seq')) ON CONFLICT DO NOTHING;
    END IF;
    IF TG_OP = 'UPDATE' AND OLD.state = 'processing' AND NEW.state <> 'processing' THEN
        -- (the lock a claim counting the group's slots holds: a group it marks full is seen here)
        PERFORM pg_advisory_xact_lock(hashtextextended('trioqueue.group:' || OLD.queue || chr(10) || OLD.grp, 0));
        DELETE FROM {s}.full_groups WHERE queue = OLD.queue AND grp = OLD.grp;
        IF FOUND THEN
            PERFORM {s}.group_requeue(OLD.queue, OLD.grp);
        END IF;
    END IF;
    RETURN NULL;
END
$$;
CREATE TRIGGER jobs_group_moved AFTER INSERT OR UPDATE OF state ON {s}.jobs
    FOR EACH ROW WHEN (NEW.grp IS NOT NULL) EXECUTE FUNCTION {s}.group_moved();
-- Up to ``want`` ready jobs of queue q in claim order (ids, with their order): priority
-- first; within a priority whose ring has groups, one job per turn of the ring, passing
-- over paused groups, groups at glimit claimed jobs and groups with grate claims in the
-- last gper ms (they leave the ring), then the rest of the jobs without a group. The
-- caller claims them (in the same transaction).
CREATE FUNCTION {s}.group_pick(q text, want integer, glimit integer, grate integer, gper bigint, now_ms bigint)
    RETURNS TABLE (pick_id text, pick_ord integer) LANGUAGE plpgsql ROWS 10 AS $$
DECLARE
    p integer;
    g text;
    jid text;
    picked text[] := '{{}}';
    groups text[] := '{{}}';
    spins integer;
    more boolean;
BEGIN
    IF want > 0 THEN  -- groups whose rest (group_rate) is over go back in the rings
        FOR g IN DELETE FROM {s}.group_sleep x WHERE x.queue = q AND x.due_ms <= now_ms RETURNING x.grp LOOP
            PERFORM {s}.group_requeue(q, g);
        END LOOP;
    END IF;
    FOR p IN 0..9 LOOP
        EXIT WHEN cardinality(picked) >= want;
        IF EXISTS (SELECT 1 FROM {s}.group_ring r WHERE r.queue = q AND r.priority = p) THEN
            IF EXISTS (SELECT 1 FROM {s}.jobs j WHERE j.queue = q AND j.state = 'queued' AND j.priority = p AND j.grp IS NULL) THEN
                INSERT INTO {s}.group_ring VALUES (q, p, '', nextval('{s}.job_seq')) ON CONFLICT DO NOTHING;
            END IF;
            spins := 0;
            LOOP
                EXIT WHEN cardinality(picked) >= want OR spins > want + 16;
                spins := spins + 1;
                SELECT r.grp INTO g FROM {s}.group_ring r WHERE r.queue = q AND r.priority = p
                    ORDER BY r.turn LIMIT 1 FOR UPDATE SKIP LOCKED;
                EXIT WHEN NOT FOUND;
                jid := NULL;
                IF g = '' THEN
                    SELECT j.id INTO jid FROM {s}.jobs j
                        WHERE j.queue = q AND j.state = 'queued' AND j.priority = p AND j.grp IS NULL AND j.id <> ALL (picked)
                        ORDER BY j.seq LIMIT 1 FOR UPDATE SKIP LOCKED;
                ELSIF EXISTS (SELECT 1 FROM {s}.paused_groups x WHERE x.queue = q AND x.grp = g) THEN
                    NULL;  -- paused: out of the ring until resumed
                ELSIF (glimit > 0 OR grate > 0) AND NOT pg_try_advisory_xact_lock(hashtextextended('trioqueue.group:' || q || chr(10) || g, 0)) THEN
                    -- another claim is counting this group's slots: its turn passes
                    UPDATE {s}.group_ring r SET turn = nextval('{s}.job_seq') WHERE r.queue = q AND r.priority = p AND r.grp = g;
                    CONTINUE;
                ELSIF glimit > 0 AND (SELECT count(*) FROM {s}.jobs j WHERE j.queue = q AND j.grp = g AND j.state = 'processing')
                        + cardinality(array_positions(groups, g)) >= glimit THEN
                    -- full: out of the ring until a job of it leaves processing
                    INSERT INTO {s}.full_groups VALUES (q, g) ON CONFLICT DO NOTHING;
                ELSIF grate > 0 AND {s}.group_over_rate(q, g, grate, gper, now_ms) THEN
                    NULL;  -- over its rate: rests in group_sleep, out of the ring
                ELSE
                    SELECT j.id INTO jid FROM {s}.jobs j
                        WHERE j.queue = q AND j.state = 'queued' AND j.priority = p AND j.grp = g AND j.id <> ALL (picked)
                        ORDER BY j.seq LIMIT 1 FOR UPDATE SKIP LOCKED;
                END IF;
                IF jid IS NOT NULL THEN
                    IF grate > 0 AND g <> '' THEN
                        INSERT INTO {s}.group_claims VALUES (q, g, now_ms);
                    END IF;
                    picked := picked || jid;
                    groups := groups || g;
                    pick_id := jid;
                    pick_ord := cardinality(picked);
                    RETURN NEXT;
                END IF;
                more := false;
                IF jid IS NOT NULL AND g = '' THEN  -- (two queries, each on its own index)
                    more := EXISTS (SELECT 1 FROM {s}.jobs j WHERE j.queue = q AND j.state = 'queued' AND j.priority = p
                        AND j.grp IS NULL AND j.id <> ALL (picked));
                ELSIF jid IS NOT NULL THEN
                    more := EXISTS (SELECT 1 FROM {s}.jobs j WHERE j.queue = q AND j.state = 'queued' AND j.priority = p
                        AND j.grp = g AND j.id <> ALL (picked));
                END IF;
                IF more THEN
                    UPDATE {s}.group_ring r SET turn = nextval('{s}.job_seq') WHERE r.queue = q AND r.priority = p AND r.grp = g;
                ELSE
                    DELETE FROM {s}.group_ring r WHERE r.queue = q AND r.priority = p AND r.grp = g;
                END IF;
            END LOOP;
        END IF;
        IF cardinality(picked) < want THEN
            FOR jid IN SELECT j.id FROM {s}.jobs j
                    WHERE j.queue = q AND j.state = 'queued' AND j.priority = p AND j.grp IS NULL AND j.id <> ALL (picked)
                    ORDER BY j.seq LIMIT want - cardinality(picked) FOR UPDATE SKIP LOCKED LOOP
                picked := picked || jid;
                pick_id := jid;
                pick_ord := cardinality(picked);
                RETURN NEXT;
            END LOOP;
        END IF;
    END LOOP;
END
$$;
-- Claim what group_pick picks, for worker w (the claim's writes of the one-statement
-- claims). Two statements: the UPDATE's snapshot is taken after the picks, so it sees
-- every row they locked (one statement's snapshot predates its functions' queries, and
-- misses a row committed meanwhile).
CREATE FUNCTION {s}.group_claim(
    q text, want integer, glimit integer, now_ms bigint, w text, lease_at bigint, start integer, grate integer, gper bigint)
    RETURNS TABLE (rn integer, id text, envelope bytea, attempts integer, claim text, started boolean)
    LANGUAGE plpgsql ROWS 10 AS $$
DECLARE
    ids text[];
BEGIN
    SELECT coalesce(array_agg(p.pick_id ORDER BY p.pick_ord), '{{}}') INTO ids
        FROM {s}.group_pick(q, want, glimit, grate, gper, now_ms) p;
    RETURN QUERY
        UPDATE {s}.jobs j SET state = 'processing', state_ms = now_ms, worker = w, lease_ms = lease_at,
            claims = j.claims + 1, claim = j.token || '.' || (j.claims + 1),
            started = u.ord <= start, attempts = j.attempts + (u.ord <= start)::int
        FROM unnest(ids) WITH ORDINALITY AS u(id, ord) WHERE j.queue = q AND j.id = u.id
        RETURNING u.ord::integer, j.id, j.envelope, j.attempts, j.claim, j.started;
END
$$;
""",
    ),
    (
        4,
        """
-- group_pick, the same turns at a cost that does not grow with the number of groups.
-- Version 3 moved a group to the end of its ring (or out of it) by (queue, priority, grp);
-- while the statistics do not know the queue (a new table, a new queue: every index on
-- queue then looks like one row) the planner ran that on group_ring_turn (queue, priority)
-- filtering on grp, a scan of the whole ring kept in the session's plan: 270 buffers a
-- claim with 10,000 groups, 9 with 10. The same trap ran the lookup of a group's next job
-- on jobs_ready (queue, priority, seq) filtering on grp. Now: the ring row a turn took is
-- changed through its ctid (locked FOR UPDATE by this transaction, so it stays put); the
-- statements plan generically (estimates from the number of queues, not from a queue
-- value); jobs_ready, which no query uses since jobs_ready_plain and jobs_ready_group, is
-- dropped; a claim goes straight to the next priority with groups in the ring (asked in
-- primary-key order, which group_ring_turn cannot give: its front is the dead entries the
-- turns left since the last VACUUM) or with jobs without a group, instead of two queries
-- for each priority from 0.
DROP INDEX {s}.jobs_ready;
CREATE OR REPLACE FUNCTION {s}.group_pick(q text, want integer, glimit integer, grate integer, gper bigint, now_ms bigint)
    RETURNS TABLE (pick_id text, pick_ord integer) LANGUAGE plpgsql ROWS 10 SET plan_cache_mode = force_generic_plan AS $$
DECLARE
    p integer := -1;
    rp integer;  -- the next priority with groups in the ring
    pp integer;  -- the next with jobs without a group
    g text;
    rid tid;
    jid text;
    picked text[] := '{{}}';
    groups text[] := '{{}}';
    spins integer;
    more boolean;
BEGIN
    IF want > 0 THEN  -- groups whose rest (group_rate) is over go back in the rings
        FOR g IN DELETE FROM {s}.group_sleep x WHERE x.queue = q AND x.due_ms <= now_ms RETURNING x.grp LOOP
            PERFORM {s}.group_requeue(q, g);
        END LOOP;
    END IF;
    LOOP
        EXIT WHEN cardinality(picked) >= want;
        -- the next priority with groups in its ring or jobs without a group (in claim order)
        rp := (SELECT r.priority FROM {s}.group_ring r WHERE r.queue = q AND r.priority > p
            ORDER BY r.queue, r.priority, r.grp LIMIT 1);  -- (the primary key: see above)
        pp := (SELECT min(j.priority) FROM {s}.jobs j WHERE j.queue = q AND j.state = 'queued' AND j.grp IS NULL AND j.priority > p);
        p := least(rp, pp);
        EXIT WHEN p IS NULL OR p > 9;
        IF rp = p THEN
            IF pp = p THEN
                INSERT INTO {s}.group_ring VALUES (q, p, '', nextval('{s}.job_seq')) ON CONFLICT DO NOTHING;
            END IF;
            spins := 0;
            LOOP
                EXIT WHEN cardinality(picked) >= want OR spins > want + 16;
                spins := spins + 1;
                SELECT r.ctid, r.grp INTO rid, g FROM {s}.group_ring r WHERE r.queue = q AND r.priority = p
                    ORDER BY r.turn LIMIT 1 FOR UPDATE SKIP LOCKED;
                EXIT WHEN NOT FOUND;
                jid := NULL;
                IF g = '' THEN
                    SELECT j.id INTO jid FROM {s}.jobs j
                        WHERE j.queue = q AND j.state = 'queued' AND j.priority = p AND j.grp IS NULL AND j.id <> ALL (picked)
                        ORDER BY j.seq LIMIT 1 FOR UPDATE SKIP LOCKED;
                ELSIF EXISTS (SELECT 1 FROM {s}.paused_groups x WHERE x.queue = q AND x.grp = g) THEN
                    NULL;  -- paused: out of the ring until resumed
                ELSIF (glimit > 0 OR grate > 0) AND NOT pg_try_advisory_xact_lock(hashtextextended('trioqueue.group:' || q || chr(10) || g, 0)) THEN
                    -- another claim is counting this group's slots: its turn passes
                    UPDATE {s}.group_ring r SET turn = nextval('{s}.job_seq')
                        WHERE r.ctid = rid AND r.queue = q AND r.priority = p AND r.grp = g;
                    CONTINUE;
                ELSIF glimit > 0 AND (SELECT count(*) FROM {s}.jobs j WHERE j.queue = q AND j.grp = g AND j.state = 'processing')
                        + cardinality(array_positions(groups, g)) >= glimit THEN
                    -- full: out of the ring until a job of it leaves processing
                    INSERT INTO {s}.full_groups VALUES (q, g) ON CONFLICT DO NOTHING;
                ELSIF grate > 0 AND {s}.group_over_rate(q, g, grate, gper, now_ms) THEN
                    NULL;  -- over its rate: rests in group_sleep, out of the ring
                ELSE
                    SELECT j.id INTO jid FROM {s}.jobs j
                        WHERE j.queue = q AND j.state = 'queued' AND j.priority = p AND j.grp = g AND j.id <> ALL (picked)
                        ORDER BY j.seq LIMIT 1 FOR UPDATE SKIP LOCKED;
                END IF;
                IF jid IS NOT NULL THEN
                    IF grate > 0 AND g <> '' THEN
                        INSERT INTO {s}.group_claims VALUES (q, g, now_ms);
                    END IF;
                    picked := picked || jid;
                    groups := groups || g;
                    pick_id := jid;
                    pick_ord := cardinality(picked);
                    RETURN NEXT;
                END IF;
                more := false;
                IF jid IS NOT NULL AND g = '' THEN  -- (two queries, each on its own index)
                    more := EXISTS (SELECT 1 FROM {s}.jobs j WHERE j.queue = q AND j.state = 'queued' AND j.priority = p
                        AND j.grp IS NULL AND j.id <> ALL (picked));
                ELSIF jid IS NOT NULL THEN
                    more := EXISTS (SELECT 1 FROM {s}.jobs j WHERE j.queue = q AND j.state = 'queued' AND j.priority = p
                        AND j.grp = g AND j.id <> ALL (picked));
                END IF;
                IF more THEN
                    UPDATE {s}.group_ring r SET turn = nextval('{s}.job_seq')
                        WHERE r.ctid = rid AND r.queue = q AND r.priority = p AND r.grp = g;
                ELSE
                    DELETE FROM {s}.group_ring r WHERE r.ctid = rid AND r.queue = q AND r.priority = p AND r.grp = g;
                END IF;
            END LOOP;
        END IF;
        IF cardinality(picked) < want THEN
            FOR jid IN SELECT j.id FROM {s}.jobs j
                    WHERE j.queue = q AND j.state = 'queued' AND j.priority = p AND j.grp IS NULL AND j.id <> ALL (picked)
                    ORDER BY j.seq LIMIT want - cardinality(picked) FOR UPDATE SKIP LOCKED LOOP
                picked := picked || jid;
                pick_id := jid;
                pick_ord := cardinality(picked);
                RETURN NEXT;
            END LOOP;
        END IF;
    END LOOP;
END
$$;
""",
    ),
    (
        5,
        """
-- A job enqueued in an application's transaction holds up nothing of its group. Its
-- insert's trigger (group_moved) put its group in the ring at once: an uncommitted entry
-- of group_ring's primary key, which every other insert of that entry waited on until the
-- application's transaction ended (another producer's enqueue of a job of the group, a
-- settlement putting a full group back in the rings). The trigger is now a constraint
-- trigger, deferrable: a transactional enqueue of a job with a group defers it to the
-- COMMIT (SET CONSTRAINTS ... DEFERRED, for that transaction only), where the entry is
-- written just as the job becomes visible; every other statement still runs it at once.
DROP TRIGGER jobs_group_moved ON {s}.jobs;
CREATE CONSTRAINT TRIGGER jobs_group_moved AFTER INSERT OR UPDATE OF state ON {s}.jobs
    DEFERRABLE INITIALLY IMMEDIATE
    FOR EACH ROW WHEN (NEW.grp IS NOT NULL) EXECUTE FUNCTION {s}.group_moved();
""",
    ),
]

SCHEMA_VERSION = MIGRATIONS[-1][0]


def check_schema_name(schema: str) -> str:
    """``schema`` if it is a plain lower-case identifier (``ValueError`` naming it
    otherwise): it is spliced into SQL and into channel names."""
    if not isinstance(schema, str) or not _NAME.fullmatch(schema):
        raise ValueError(f"schema must be a lower-case SQL identifier ([a-z_][a-z0-9_]*, at most 63), got {schema!r}")
    return schema


async def schema_version(conn: Connection, schema: str) -> int:
    """The latest migration applied to ``schema`` (0: none, or no such schema)."""
    check_schema_name(schema)
    exists = await conn.fetchval("SELECT to_regclass($1) IS NOT NULL", f'"{schema}".version')
    if not exists:
        return 0
    return int(await conn.fetchval(f'SELECT coalesce(max(version), 0) FROM "{schema}".version'))


async def migrate(conn: Connection, schema: str = "trioqueue") -> list[int]:
    """Apply the migrations ``schema`` lacks, under the schema's advisory lock; returns
    the versions applied (``[]``: it was up to date). Raises :class:`PostgresError` when
    the database has a newer schema than this trioqueue knows (upgrade trioqueue).

    Cancellation: a migration interrupted by a cancel is rolled back as a whole (its
    transaction never commits); the lock is released (shielded) on the way out."""
    check_schema_name(schema)
    quoted = f'"{schema}"'
    await conn.execute("SELECT pg_advisory_lock(hashtextextended($1, 0))", f"trioqueue.migrate:{schema}")
    applied: list[int] = []
    try:
        current = await schema_version(conn, schema)
        if current > SCHEMA_VERSION:
            raise PostgresError(
                f"schema {schema!r} is at version {current}, newer than this trioqueue knows ({SCHEMA_VERSION}): upgrade trioqueue"
            )
        for version, sql in MIGRATIONS:
            if version <= current:
                continue
            await conn.execute("BEGIN")
            try:
                if version == 1:
                    await conn.execute_script(
                        f"CREATE SCHEMA IF NOT EXISTS {quoted};"
                        f"CREATE TABLE {quoted}.version (version integer PRIMARY KEY,"
                        " applied_at timestamptz NOT NULL DEFAULT now())"
                    )
                await conn.execute_script(sql.format(s=quoted))
                await conn.execute(f"INSERT INTO {quoted}.version (version) VALUES ($1)", version)
                await conn.execute("COMMIT")
            except BaseException:
                with trio.CancelScope(shield=True):
                    if not conn.closed:
                        await conn.execute("ROLLBACK")
                raise
            applied.append(version)
    finally:
        with trio.CancelScope(shield=True):
            if not conn.closed:
                await conn.execute("SELECT pg_advisory_unlock(hashtextextended($1, 0))", f"trioqueue.migrate:{schema}")
    return applied
