UPDATE {s}.jobs j SET steps = coalesce(j.steps, '\x'::bytea) || b.entry
                FROM unnest($2::text[], $3::text[], $4::text[], $5::bytea[]) AS b(id, claim, worker, entry)
                WHERE j.queue = $1 AND j.id = b.id AND j.state = 'processing' AND j.worker = b.worker AND j.claim = b.claim
                RETURNING j.id
