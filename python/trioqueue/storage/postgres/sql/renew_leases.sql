UPDATE {s}.jobs j SET lease_ms = $2 FROM (
                            SELECT j.id FROM {s}.jobs j JOIN unnest($4::text[], $5::text[]) AS u(id, claim)
                                ON j.queue = $1 AND j.id = u.id AND j.claim = u.claim
                            WHERE j.state = 'processing' AND j.worker = $3 FOR NO KEY UPDATE OF j SKIP LOCKED) mine
                        WHERE j.queue = $1 AND j.id = mine.id RETURNING j.id, j.claim, j.cancel_requested
