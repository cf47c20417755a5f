-- Idempotency keys of creates on a cluster of several nodes: which node a key's create was
-- sent to, so a retry through any replica goes there (that node returns the sandbox it made)
-- while placement follows load. Kept a day.
CREATE TABLE create_keys (
    key         TEXT PRIMARY KEY,
    node        TEXT NOT NULL,
    created_ms  BIGINT NOT NULL
);
CREATE INDEX create_keys_created ON create_keys (created_ms);
