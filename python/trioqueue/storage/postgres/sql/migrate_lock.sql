SELECT pg_advisory_lock(hashtextextended($1, 0))
