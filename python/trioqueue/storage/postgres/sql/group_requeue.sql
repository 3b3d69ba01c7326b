SELECT {s}.group_requeue($1, $2)
