INSERT INTO {s}.queues (queue) SELECT unnest($1::text[]) ON CONFLICT DO NOTHING
