-- A job of a group entering 'queued' holds its group's ring entry until its transaction
-- ends. The trigger inserted the entry with ON CONFLICT DO NOTHING, which does nothing
-- (and waits for nothing) when the entry is there; a claim that had just taken the
-- group's last visible job (group_pick, on a snapshot without this job, not committed
-- yet) then removed the entry, and the job stayed 'queued' with its group out of the
-- rings: never claimed. Now an entry found there is locked FOR KEY SHARE: a claim holding
-- it (FOR UPDATE) is waited for, and if it removed the entry the entry is written again;
-- a claim coming after passes the group over (SKIP LOCKED) until this transaction ends.
-- Shared locks: settlements and enqueues of one group never wait for each other.
CREATE OR REPLACE FUNCTION {s}.group_moved() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.state = 'queued' THEN
        LOOP
            INSERT INTO {s}.group_ring (queue, priority, grp, turn)
                VALUES (NEW.queue, NEW.priority, NEW.grp, nextval('{s}.job_seq')) ON CONFLICT DO NOTHING;
            EXIT WHEN FOUND;
            PERFORM 1 FROM {s}.group_ring r WHERE r.queue = NEW.queue AND r.priority = NEW.priority AND r.grp = NEW.grp
                FOR KEY SHARE;
            EXIT WHEN FOUND;  -- (not found: a claim removed it meanwhile; write it again)
        END LOOP;
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
