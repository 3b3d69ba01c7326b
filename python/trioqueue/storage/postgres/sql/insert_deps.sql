INSERT INTO {s}.job_deps (queue, id, token, ord, dep_queue, dep_id, dep_token) SELECT $1, $2, $3, o, q, i, t FROM unnest($4::text[], $5::text[], $6::text[]) WITH ORDINALITY AS u(q, i, t, o)
