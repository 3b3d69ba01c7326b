-- The jobs of a queue being cleared that are of trees (a child, a parent, a dependency or a
-- dependent): their trees are told, as remove_job tells them
SELECT id FROM {s}.jobs WHERE queue = $1 AND (parent_id IS NOT NULL OR depended OR policy IS NOT NULL) ORDER BY id
