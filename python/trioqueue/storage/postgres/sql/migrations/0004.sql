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
