SELECT rn, 0, id, envelope, attempts, claim, started
                    FROM {s}.group_claim($1, $3::int, $7::int, $2, $4, $5, $6::int, $8::int, $9::int8)
