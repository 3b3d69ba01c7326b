-- A grouped claim names a ready job it skipped for being held by another transaction
-- (SKIP LOCKED), as the plain claim does: its holder may end without a wake-up (a
-- rollback), and the waiting claim waits for that row's lock. group_pick returns it with
-- pick_ord 0 when it picked fewer than wanted; group_claim, as a row with rn 0 and only
-- the id (nothing claimed). The rest of both functions is as before (0009, 0011).
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
    emptied boolean;
    skipped text;  -- a ready job passed over for being held by another transaction
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
                    ORDER BY r.turn LIMIT 1 FOR NO KEY UPDATE SKIP LOCKED;
                EXIT WHEN NOT FOUND;
                jid := NULL;
                emptied := false;  -- (true: it is left out of the ring for having no ready job)
                IF g = '' THEN
                    emptied := true;
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
                    emptied := true;
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
                IF NOT more AND emptied THEN
                    -- No other ready job seen: wait for the transactions queueing one of
                    -- the group's jobs now (their trigger holds this entry FOR KEY SHARE),
                    -- then look again, on a snapshot that sees what they committed.
                    PERFORM 1 FROM {s}.group_ring r WHERE r.ctid = rid AND r.queue = q AND r.priority = p AND r.grp = g FOR UPDATE;
                    IF g = '' THEN
                        more := EXISTS (SELECT 1 FROM {s}.jobs j WHERE j.queue = q AND j.state = 'queued' AND j.priority = p
                            AND j.grp IS NULL AND j.id <> ALL (picked));
                    ELSE
                        more := EXISTS (SELECT 1 FROM {s}.jobs j WHERE j.queue = q AND j.state = 'queued' AND j.priority = p
                            AND j.grp = g AND j.id <> ALL (picked));
                    END IF;
                END IF;
                IF jid IS NULL AND more AND skipped IS NULL THEN
                    -- (the group's turn found a ready job but took none: it was held)
                    skipped := (SELECT j.id FROM {s}.jobs j WHERE j.queue = q AND j.state = 'queued' AND j.priority = p
                        AND (j.grp = g OR (g = '' AND j.grp IS NULL)) AND j.id <> ALL (picked) ORDER BY j.seq LIMIT 1);
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
            IF cardinality(picked) < want AND skipped IS NULL THEN
                skipped := (SELECT j.id FROM {s}.jobs j WHERE j.queue = q AND j.state = 'queued' AND j.priority = p
                    AND j.grp IS NULL AND j.id <> ALL (picked) ORDER BY j.seq LIMIT 1);
            END IF;
        END IF;
    END LOOP;
    IF skipped IS NOT NULL AND cardinality(picked) < want THEN
        pick_id := skipped;
        pick_ord := 0;
        RETURN NEXT;
    END IF;
END
$$;
CREATE OR REPLACE FUNCTION {s}.group_claim(
    q text, want integer, glimit integer, now_ms bigint, w text, lease_at bigint, start integer, grate integer, gper bigint)
    RETURNS TABLE (rn integer, id text, envelope bytea, attempts integer, claim text, started boolean)
    LANGUAGE plpgsql ROWS 10 AS $$
DECLARE
    ids text[];
    skipped text;
BEGIN
    SELECT coalesce(array_agg(p.pick_id ORDER BY p.pick_ord) FILTER (WHERE p.pick_ord > 0), '{{}}'),
            min(p.pick_id) FILTER (WHERE p.pick_ord = 0) INTO ids, skipped
        FROM {s}.group_pick(q, want, glimit, grate, gper, now_ms) p;
    RETURN QUERY
        UPDATE {s}.jobs j SET state = 'processing', state_ms = now_ms, worker = w, lease_ms = lease_at,
            claims = j.claims + 1, claim = j.token || '.' || (j.claims + 1),
            started = u.ord <= start, attempts = j.attempts + (u.ord <= start)::int
        FROM unnest(ids) WITH ORDINALITY AS u(id, ord) WHERE j.queue = q AND j.id = ANY (ids) AND j.id = u.id
        RETURNING u.ord::integer, j.id, j.envelope, j.attempts, j.claim, j.started;
    IF skipped IS NOT NULL THEN
        rn := 0;
        id := skipped;
        envelope := NULL;
        attempts := NULL;
        claim := NULL;
        started := NULL;
        RETURN NEXT;
    END IF;
END
$$;
