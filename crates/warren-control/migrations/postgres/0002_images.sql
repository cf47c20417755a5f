-- The image catalog: named, versioned references to ordered lists of layers. The layers
-- themselves are files in the layer store (a shared file system), named by digest.
-- (The same table as migrations/sqlite.)
CREATE TABLE images (
    name        TEXT PRIMARY KEY,
    layers      TEXT NOT NULL,   -- JSON array of layer digests, bottom first
    size        BIGINT NOT NULL,
    created_ms  BIGINT NOT NULL,
    creator     TEXT NOT NULL,
    parents     TEXT NOT NULL,   -- JSON array of image names
    source      TEXT NOT NULL,
    env         TEXT NOT NULL,   -- JSON object
    user_name   TEXT,
    workdir     TEXT
);
