INSERT INTO {s}.schedules (queue, name, spec) VALUES ($1, $2, $3) ON CONFLICT DO NOTHING RETURNING true
