UPDATE {s}.queues SET flow = $2 WHERE queue = $1
