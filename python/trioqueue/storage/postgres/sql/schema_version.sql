SELECT coalesce(max(version), 0) FROM {s}.version
