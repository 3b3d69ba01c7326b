SELECT signals FROM {s}.jobs WHERE queue = $1 AND id = $2
