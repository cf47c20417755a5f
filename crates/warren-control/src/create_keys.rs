//! Idempotency keys of creates, in the database: which node a key's create was sent to.
//!
//! On one node the node's own record of keys is enough. On several, a create with a key is
//! placed by load like any other, and the key's node is recorded first; a retry of it — through
//! any replica — goes to that node, which answers with the sandbox it made (or waits for the
//! create in flight). When a node refuses, the record moves with the create to the next; when
//! every node refused, it is removed, so a later retry is placed afresh. Without the database,
//! keyed creates fall back to an order fixed by the key's hash (idempotent, but blind to load).

use sqlx::Row;
use warren_types::id::NodeId;

use crate::db::Db;

/// How long a key is kept, milliseconds (a day).
pub const KEEP_MS: i64 = 24 * 3600 * 1000;

/// Whose a key is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Claim {
    /// New: recorded for the node given.
    Ours,
    /// An earlier create with this key was sent to this node.
    Theirs(NodeId),
    /// The database did not answer.
    Unavailable,
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

/// Records `key` for `node` unless it is recorded already.
pub async fn claim(db: &Db, key: &str, node: &NodeId) -> Claim {
    let done = sqlx::query(
        "INSERT INTO create_keys (key, node, created_ms) VALUES ($1, $2, $3) \
         ON CONFLICT (key) DO NOTHING",
    )
    .bind(key)
    .bind(node.as_str())
    .bind(now_ms())
    .execute(db)
    .await;
    match done {
        Ok(r) if r.rows_affected() == 1 => Claim::Ours,
        Ok(_) => match sqlx::query("SELECT node FROM create_keys WHERE key = $1")
            .bind(key)
            .fetch_optional(db)
            .await
        {
            Ok(Some(row)) => match row
                .try_get::<String, _>(0)
                .ok()
                .and_then(|n| n.parse().ok())
            {
                Some(n) => Claim::Theirs(n),
                None => Claim::Unavailable,
            },
            // Removed meanwhile (every node refused it): try again as new.
            Ok(None) => Box::pin(claim(db, key, node)).await,
            Err(e) => {
                tracing::warn!("create keys: {e}");
                Claim::Unavailable
            }
        },
        Err(e) => {
            tracing::warn!("create keys: {e}");
            Claim::Unavailable
        }
    }
}

/// The key's create goes from node `from` (which refused it) to node `to`.
pub async fn moved(db: &Db, key: &str, from: &NodeId, to: &NodeId) {
    if let Err(e) = sqlx::query("UPDATE create_keys SET node = $1 WHERE key = $2 AND node = $3")
        .bind(to.as_str())
        .bind(key)
        .bind(from.as_str())
        .execute(db)
        .await
    {
        tracing::warn!("create keys: {e}");
    }
}

/// Every node refused the key's create (the last was `node`): forgotten, so that a retry is
/// placed afresh.
pub async fn refused(db: &Db, key: &str, node: &NodeId) {
    if let Err(e) = sqlx::query("DELETE FROM create_keys WHERE key = $1 AND node = $2")
        .bind(key)
        .bind(node.as_str())
        .execute(db)
        .await
    {
        tracing::warn!("create keys: {e}");
    }
}

/// Removes keys older than [`KEEP_MS`].
pub async fn expire(db: &Db) -> Result<u64, sqlx::Error> {
    Ok(sqlx::query("DELETE FROM create_keys WHERE created_ms < $1")
        .bind(now_ms() - KEEP_MS)
        .execute(db)
        .await?
        .rows_affected())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_key_is_claimed_once_moves_and_is_forgotten_on_each_database() {
        for t in crate::db::testing::each().await {
            let db = &t.db;
            let (a, b): (NodeId, NodeId) = ("aaaaaa".parse().unwrap(), "bbbbbb".parse().unwrap());
            assert_eq!(claim(db, "k1", &a).await, Claim::Ours);
            assert_eq!(claim(db, "k1", &b).await, Claim::Theirs(a.clone()));
            moved(db, "k1", &a, &b).await;
            assert_eq!(claim(db, "k1", &a).await, Claim::Theirs(b.clone()));
            // A move from a node it is no longer on changes nothing.
            moved(db, "k1", &a, &a).await;
            assert_eq!(claim(db, "k1", &a).await, Claim::Theirs(b.clone()));
            refused(db, "k1", &b).await;
            assert_eq!(claim(db, "k1", &a).await, Claim::Ours);
            // Old keys go.
            sqlx::query("UPDATE create_keys SET created_ms = 0")
                .execute(db)
                .await
                .unwrap();
            assert_eq!(expire(db).await.unwrap(), 1);
            assert_eq!(claim(db, "k1", &b).await, Claim::Ours);
        }
    }
}
