SELECT DISTINCT parent_queue, parent_id FROM {s}.jobs WHERE queue = $1 AND id = ANY($2::text[]) AND parent_id IS NOT NULL
