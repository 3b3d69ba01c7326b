SELECT queue, id FROM {s}.jobs WHERE (queue, id) IN (SELECT * FROM unnest($1::text[], $2::text[])) AND (expires_ms IS NULL OR expires_ms > $3) AND state <> 'cancelled'
