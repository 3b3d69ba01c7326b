-- group_claim's UPDATE finds the picked jobs by key (j.id = ANY (ids), an index condition
-- on the primary key): joined on u.id alone, a queue the planner's statistics had not
-- seen (estimated at one row) was read whole into a hash to claim the batch. The rest
-- of the function is as before.
CREATE OR REPLACE FUNCTION {s}.group_claim(
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
        FROM unnest(ids) WITH ORDINALITY AS u(id, ord) WHERE j.queue = q AND j.id = ANY (ids) AND j.id = u.id
        RETURNING u.ord::integer, j.id, j.envelope, j.attempts, j.claim, j.started;
END
$$;
