UPDATE {s}.jobs j SET started = true, attempts = j.attempts + 1
                FROM unnest($2::text[], $3::text[]) AS c(id, claim)
                WHERE j.queue = $1 AND j.id = c.id AND j.claim = c.claim AND j.state = 'processing'
                    AND j.worker = $4 AND NOT j.started AND NOT j.cancel_requested AND j.parent_id IS NULL
                    AND NOT coalesce((SELECT paused FROM {s}.queues WHERE queue = $1), false)
                RETURNING j.id
