-- IAM: projects (a tree addressed by path, from 'root'), identities (people and service
-- accounts), bindings of an identity to a project subtree with a role or one permission, and
-- API keys that act as an identity within a project subtree, with a role of their own (what a
-- key may do is its role's permissions and its identity's, both). Every write bumps
-- iam_version, which every replica reads each second to drop what it cached. (The same tables
-- in migrations/sqlite and migrations/postgres.)
CREATE TABLE projects (
    path           TEXT PRIMARY KEY,
    parent         TEXT REFERENCES projects(path),
    created_ms     INTEGER NOT NULL,
    created_by     TEXT NOT NULL,
    max_sandboxes  INTEGER,
    max_cpu        INTEGER,   -- millicores of CPU requests
    max_memory     INTEGER    -- bytes of memory requests
);
INSERT INTO projects (path, parent, created_ms, created_by) VALUES ('root', NULL, 0, 'warren');

CREATE TABLE identities (
    name        TEXT PRIMARY KEY,
    kind        TEXT NOT NULL,                                -- user or service
    project     TEXT NOT NULL REFERENCES projects(path),      -- where it was made
    created_ms  INTEGER NOT NULL,
    created_by  TEXT NOT NULL
);
INSERT INTO identities (name, kind, project, created_ms, created_by)
    VALUES ('admin', 'user', 'root', 0, 'warren');

CREATE TABLE bindings (
    identity    TEXT NOT NULL REFERENCES identities(name),
    project     TEXT NOT NULL REFERENCES projects(path),
    grant_name  TEXT NOT NULL,                                -- a role, or one permission
    created_ms  INTEGER NOT NULL,
    created_by  TEXT NOT NULL,
    PRIMARY KEY (identity, project, grant_name)
);
INSERT INTO bindings (identity, project, grant_name, created_ms, created_by)
    VALUES ('admin', 'root', 'admin', 0, 'warren');

-- Keys made before IAM are the admin's, over everything.
ALTER TABLE api_keys ADD COLUMN identity TEXT NOT NULL DEFAULT 'admin';
ALTER TABLE api_keys ADD COLUMN project TEXT NOT NULL DEFAULT 'root';
ALTER TABLE api_keys ADD COLUMN created_by TEXT NOT NULL DEFAULT 'warren';
ALTER TABLE api_keys ADD COLUMN expires_ms INTEGER;
ALTER TABLE api_keys ADD COLUMN revoked_ms INTEGER;
ALTER TABLE api_keys ADD COLUMN last_used_ms INTEGER;

CREATE TABLE iam_version (
    id       INTEGER PRIMARY KEY,
    version  INTEGER NOT NULL
);
INSERT INTO iam_version (id, version) VALUES (1, 1);

-- Security-relevant actions: who, what, when, from where.
CREATE TABLE audit (
    id       INTEGER PRIMARY KEY AUTOINCREMENT,
    at_ms    INTEGER NOT NULL,
    actor    TEXT NOT NULL,      -- the identity
    key_id   TEXT,               -- the key it used
    action   TEXT NOT NULL,      -- key.create, project.delete, ...
    target   TEXT NOT NULL,
    project  TEXT,
    source   TEXT,               -- the client's address
    detail   TEXT
);
CREATE INDEX audit_at ON audit (at_ms);
