-- The first time after $2 (the scan's time) when a job comes due or a claim stalls. A
-- time not after it is a job the scan skipped (SKIP LOCKED: another transaction holds
-- it): not a deadline (the reaper would scan again at once, for as long as it is held).
SELECT least(
                        (SELECT min(run_at_ms) FROM {s}.jobs
                         WHERE queue = $1 AND state IN ('delayed', 'failing', 'waiting_signal') AND run_at_ms > $2),
                        (SELECT min(least(j.lease_ms, coalesce(w.expires_ms, 0))) FROM {s}.jobs j
                         LEFT JOIN {s}.workers w ON w.queue = j.queue AND w.worker = j.worker
                         WHERE j.queue = $1 AND j.state = 'processing' AND least(j.lease_ms, coalesce(w.expires_ms, 0)) > $2))
