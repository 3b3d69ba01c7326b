DELETE FROM {s}.jobs WHERE queue = $1
