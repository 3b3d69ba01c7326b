SELECT pg_advisory_unlock(hashtextextended($1, 0))
