SET CONSTRAINTS {s}.jobs_group_moved DEFERRED
