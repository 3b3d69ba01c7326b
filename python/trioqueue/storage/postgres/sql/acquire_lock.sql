INSERT INTO {s}.locks AS l (name, owner, expires_ms) VALUES ($1, $2, $3)
                    ON CONFLICT (name) DO UPDATE SET owner = EXCLUDED.owner, expires_ms = EXCLUDED.expires_ms
                    WHERE l.owner = EXCLUDED.owner OR l.expires_ms <= $4 RETURNING true
