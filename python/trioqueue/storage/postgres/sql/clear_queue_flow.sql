UPDATE {s}.queues SET flow = NULL WHERE queue = $1
