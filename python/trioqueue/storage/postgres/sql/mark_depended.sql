UPDATE {s}.jobs SET depended = true WHERE (queue, id) IN (SELECT * FROM unnest($1::text[], $2::text[]))
