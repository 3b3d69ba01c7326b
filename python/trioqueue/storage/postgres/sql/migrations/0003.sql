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
