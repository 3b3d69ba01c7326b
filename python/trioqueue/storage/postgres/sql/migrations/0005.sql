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
