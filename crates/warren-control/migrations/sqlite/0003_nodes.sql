-- Node membership: the nodes that joined (and `warren up`'s own), where the control plane
-- reaches them, and whether they are cordoned. Never their sandboxes or load: those come from
-- the nodes themselves. Every replica reads this table, so a node that joined through one is
-- polled by all, and a restarted replica knows every node at once.
CREATE TABLE nodes (
    id          TEXT PRIMARY KEY,
    url         TEXT NOT NULL,   -- http(s)://host:port, or unix:<path> for warren up's node
    cordoned    INTEGER NOT NULL DEFAULT 0,
    version     TEXT NOT NULL,
    joined_ms   INTEGER NOT NULL,
    seen_ms     INTEGER NOT NULL
);
