//! API keys: their form, the admin key made on first start, and where a request presents one.
//!
//! Keys are `wrn_` + 32 random characters; the database keeps only their SHA-256. What a key
//! may do is IAM's (`crate::iam`).

use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

use crate::db::Db;
use axum::extract::Request;
use axum::http::header;
use sha2::{Digest, Sha256};

const ALPHABET: &[u8; 62] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";

/// Why key handling failed.
#[derive(Debug, thiserror::Error)]
pub enum AuthError {
    /// The database.
    #[error("api key store: {0}")]
    Db(#[from] sqlx::Error),
    /// The admin key file.
    #[error("admin key file {path}: {source}")]
    KeyFile {
        /// The file.
        path: String,
        /// What failed.
        #[source]
        source: std::io::Error,
    },
}

/// A fresh random key.
pub fn new_key() -> String {
    let bytes: [u8; 32] = rand::random();
    let mut s = String::from("wrn_");
    for b in bytes {
        s.push(ALPHABET[(b as usize) % ALPHABET.len()] as char);
    }
    s
}

/// The stored form of a key.
pub fn hash(key: &str) -> String {
    let d = Sha256::digest(key.as_bytes());
    d.iter().map(|b| format!("{b:02x}")).collect()
}

/// Makes sure an admin key exists: on first start, creates one, stores its hash and writes it
/// to `<data_dir>/admin.key` (mode 0600). Returns the key when it was just made.
pub async fn bootstrap_admin(db: &Db, data_dir: &Path) -> Result<Option<String>, AuthError> {
    let path = data_dir.join("admin.key");
    let file_err = |source| AuthError::KeyFile {
        path: path.display().to_string(),
        source,
    };
    if let Ok(existing) = std::fs::read_to_string(&path) {
        let key = existing.trim().to_string();
        // The database may be new (e.g. deleted); make sure the file's key still works.
        sqlx::query("INSERT INTO api_keys (id, name, key_hash, role, created_ms) VALUES ($1, 'admin', $2, 'admin', $3) ON CONFLICT DO NOTHING")
            .bind(format!("key_{}", &hash(&key)[..12]))
            .bind(hash(&key))
            .bind(now_ms())
            .execute(db)
            .await?;
        return Ok(None);
    }
    let key = new_key();
    sqlx::query("INSERT INTO api_keys (id, name, key_hash, role, created_ms) VALUES ($1, 'admin', $2, 'admin', $3)")
        .bind(format!("key_{}", &hash(&key)[..12]))
        .bind(hash(&key))
        .bind(now_ms())
        .execute(db)
        .await?;
    let tmp = data_dir.join("admin.key.tmp");
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&tmp)
        .map_err(file_err)?;
    f.write_all(format!("{key}\n").as_bytes())
        .map_err(file_err)?;
    f.sync_all().map_err(file_err)?;
    std::fs::rename(&tmp, &path).map_err(file_err)?;
    Ok(Some(key))
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

/// The key a request presents: `Authorization: Bearer <key>` or `X-API-Key: <key>`.
pub fn presented(req: &Request) -> Option<std::borrow::Cow<'_, str>> {
    let h = req.headers();
    let auth = h.get(header::AUTHORIZATION).and_then(|v| v.to_str().ok());
    if let Some(k) = auth.and_then(|v| v.strip_prefix("Bearer ")) {
        return Some(k.trim().into());
    }
    if let Some(k) = h.get("x-api-key").and_then(|v| v.to_str().ok()) {
        return Some(k.trim().into());
    }
    // HTTP Basic, the key as the password (any user name): what a client that takes only a
    // URL can send (`http://fncall:KEY@host`, the `sandbox-fusion` package). Only there: on
    // other routes a browser's remembered credentials must not act as a key.
    if req.uri().path() != "/run_code" {
        return None;
    }
    let basic = auth.and_then(|v| v.strip_prefix("Basic "))?;
    use base64::Engine;
    let raw = base64::engine::general_purpose::STANDARD
        .decode(basic.trim())
        .ok()?;
    let text = String::from_utf8(raw).ok()?;
    let (_, key) = text.split_once(':')?;
    Some(key.trim().to_string().into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_random_and_hashes_stable() {
        let (a, b) = (new_key(), new_key());
        assert_ne!(a, b);
        assert!(a.starts_with("wrn_") && a.len() == 36);
        assert_eq!(hash("x"), hash("x"));
        assert_eq!(hash("x").len(), 64);
    }

    #[tokio::test]
    async fn the_admin_key_is_made_once_and_kept_on_each_database() {
        for t in crate::db::testing::each().await {
            let db = &t.db;
            let dir = tempfile::tempdir().unwrap();
            let key = bootstrap_admin(db, dir.path()).await.unwrap().unwrap();
            assert!(
                crate::iam::store::principal(db, &hash(&key))
                    .await
                    .unwrap()
                    .is_some_and(|p| p.allows(crate::iam::Perm::ClusterAdmin, "root"))
            );
            // Again: the file's key is kept (and inserted once, not twice).
            assert_eq!(bootstrap_admin(db, dir.path()).await.unwrap(), None);
            let n: (i64,) = sqlx::query_as("SELECT COUNT(*) FROM api_keys")
                .fetch_one(db)
                .await
                .unwrap();
            assert_eq!(n.0, 1);
            assert!(
                crate::iam::store::principal(db, &hash("wrn_not-a-key"))
                    .await
                    .unwrap()
                    .is_none()
            );
        }
    }
}
