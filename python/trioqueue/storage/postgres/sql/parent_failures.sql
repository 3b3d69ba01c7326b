SELECT failed_ids, failed_errors, token FROM {s}.jobs WHERE queue = $1 AND id = $2
