SELECT coalesce(grp, ''), state, count(*) FROM {s}.jobs
                    WHERE queue = $1 AND state IN ('queued', 'processing') GROUP BY 1, 2
