-- Trees of jobs (flows). A child names its parent (queue, id) and the parent's incarnation
-- token (a parent replaced by a new incarnation has no children), child_seq orders the
-- children. A parent has its on_child_failure policy, how many children have not ended
-- (pending), how many it has (nchildren), and the failed/cancelled children so far.
ALTER TABLE {s}.jobs DROP CONSTRAINT jobs_state_check;
ALTER TABLE {s}.jobs ADD CONSTRAINT jobs_state_check CHECK (state IN ('queued', 'delayed', 'processing', 'failing',
    'completed', 'failed', 'cancelled', 'waiting_children'));
ALTER TABLE {s}.jobs ADD COLUMN parent_queue text, ADD COLUMN parent_id text, ADD COLUMN parent_token text,
    ADD COLUMN child_seq bigint, ADD COLUMN policy text, ADD COLUMN pending integer,
    ADD COLUMN nchildren integer NOT NULL DEFAULT 0, ADD COLUMN failed_ids text[], ADD COLUMN failed_errors bytea[];
CREATE INDEX jobs_children ON {s}.jobs (parent_queue, parent_id, child_seq) WHERE parent_id IS NOT NULL;
