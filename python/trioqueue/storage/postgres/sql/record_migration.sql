INSERT INTO {s}.version (version) VALUES ($1)
