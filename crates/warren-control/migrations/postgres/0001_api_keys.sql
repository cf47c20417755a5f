-- API keys. Only a hash of each key is stored; the key itself is shown once (the admin key is
-- also written to <data-dir>/admin.key, mode 0600). (The same table as migrations/sqlite.)
CREATE TABLE api_keys (
    id          TEXT PRIMARY KEY,
    name        TEXT NOT NULL,
    key_hash    TEXT NOT NULL UNIQUE,
    role        TEXT NOT NULL,
    created_ms  BIGINT NOT NULL
);
