SELECT queue FROM {s}.queues ORDER BY queue
