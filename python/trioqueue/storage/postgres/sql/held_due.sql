-- After the promotion of due jobs (in its transaction, whose promoted rows are no longer
-- delayed) left one due: a due job it skipped (SKIP LOCKED: another transaction holds
-- it), first in its order (or one past its LIMIT); and the first time after $2 when
-- another job comes due, or NULL.
SELECT (SELECT id FROM {s}.jobs WHERE queue = $1 AND state IN ('delayed', 'failing', 'waiting_signal') AND run_at_ms <= $2
            ORDER BY run_at_ms, seq LIMIT 1),
    (SELECT min(run_at_ms) FROM {s}.jobs WHERE queue = $1 AND state IN ('delayed', 'failing', 'waiting_signal') AND run_at_ms > $2)
