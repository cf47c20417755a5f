//! Identity and access: projects, identities, bindings, keys, and the check of every request.
//!
//! [`Iam::authenticate`] turns a presented key into a [`Principal`] from a cache (a hash
//! lookup: the create path adds microseconds), filled from the database on a miss. Every
//! change to IAM bumps a version in the database; each replica reads it every second and drops
//! its cache when it moved, so a revoked key stops working on every replica within about a
//! second. Unknown keys are cached too (as unknown), so guessing keys does not reach the
//! database; the cache is bounded.

pub mod model;
pub mod store;

use std::collections::HashMap;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

pub use model::{Perm, Perms, Principal};
pub use store::IamError;

use crate::db::Db;

/// Most keys (known or not) cached; past it the cache starts afresh.
const MAX_CACHED: usize = 100_000;

/// IAM for one replica: the database and what it cached.
#[derive(Debug)]
pub struct Iam {
    db: Db,
    cache: RwLock<HashMap<String, Option<Arc<Principal>>>>,
    /// Every project's path, once read.
    projects: RwLock<Option<std::collections::HashSet<String>>>,
    /// Every project's quota that sets a limit, once read.
    quotas: RwLock<Option<Arc<HashMap<String, store::Quota>>>>,
    version: AtomicI64,
    /// Keys used since the last flush: id → when.
    used: Mutex<HashMap<String, i64>>,
}

impl Iam {
    /// IAM on `db` (migrated).
    pub async fn new(db: Db) -> Result<Iam, IamError> {
        let v = store::version(&db).await?;
        Ok(Iam {
            db,
            cache: RwLock::default(),
            projects: RwLock::default(),
            quotas: RwLock::default(),
            version: AtomicI64::new(v),
            used: Mutex::default(),
        })
    }

    /// The database.
    pub fn db(&self) -> &Db {
        &self.db
    }

    /// The principal of `key`, if it is a key that works now. `Err` only when the database
    /// does not answer (and the key is not cached).
    pub async fn authenticate(&self, key: &str) -> Result<Option<Arc<Principal>>, IamError> {
        let hash = crate::auth::hash(key);
        let cached = self
            .cache
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .get(&hash)
            .cloned();
        let p = match cached {
            Some(p) => p,
            None => {
                let p = store::principal(&self.db, &hash).await?.map(Arc::new);
                let mut c = self.cache.write().unwrap_or_else(|p| p.into_inner());
                if c.len() >= MAX_CACHED {
                    c.clear();
                }
                c.insert(hash, p.clone());
                p
            }
        };
        let now = store::now_ms();
        let p = p.filter(|p| p.expires_ms.is_none_or(|e| e > now));
        if let Some(p) = &p {
            self.used
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .insert(p.key_id.clone(), now);
        }
        Ok(p)
    }

    /// Whether project `path` exists (cached like keys).
    pub async fn project_exists(&self, path: &str) -> Result<bool, IamError> {
        if let Some(p) = self
            .projects
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .as_ref()
        {
            return Ok(p.contains(path));
        }
        let all: Vec<(String,)> = sqlx::query_as("SELECT path FROM projects")
            .fetch_all(&self.db)
            .await?;
        let set: std::collections::HashSet<String> = all.into_iter().map(|(p,)| p).collect();
        let there = set.contains(path);
        *self.projects.write().unwrap_or_else(|p| p.into_inner()) = Some(set);
        Ok(there)
    }

    /// Drops the cache when IAM changed since it was filled; returns whether it did.
    pub async fn refresh(&self) -> Result<bool, IamError> {
        let v = store::version(&self.db).await?;
        if self.version.swap(v, Ordering::Relaxed) != v {
            self.changed();
            return Ok(true);
        }
        Ok(false)
    }

    /// Drops the cache now (after a change made through this replica).
    pub fn changed(&self) {
        self.cache
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .clear();
        *self.projects.write().unwrap_or_else(|p| p.into_inner()) = None;
        *self.quotas.write().unwrap_or_else(|p| p.into_inner()) = None;
    }

    /// Every project's quota that sets a limit (cached like keys).
    pub async fn quotas(&self) -> Result<Arc<HashMap<String, store::Quota>>, IamError> {
        if let Some(q) = self
            .quotas
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
        {
            return Ok(q);
        }
        let q: Arc<HashMap<String, store::Quota>> =
            Arc::new(store::quotas(&self.db).await?.into_iter().collect());
        *self.quotas.write().unwrap_or_else(|p| p.into_inner()) = Some(q.clone());
        Ok(q)
    }

    /// Reads the version every `interval`, and writes keys' last use every minute, until the
    /// process ends.
    pub fn spawn_refresh(self: &Arc<Self>, interval: Duration) {
        let me = Arc::downgrade(self);
        tokio::spawn(async move {
            let mut failing = false;
            let mut last_flush = std::time::Instant::now();
            loop {
                tokio::time::sleep(interval).await;
                let Some(iam) = me.upgrade() else { break };
                match iam.refresh().await {
                    Ok(_) => {
                        if failing {
                            tracing::info!("IAM: the database answers again");
                        }
                        failing = false;
                    }
                    Err(e) => {
                        if !failing {
                            tracing::warn!("IAM: cannot read the version ({e}); cached keys stay");
                        }
                        failing = true;
                    }
                }
                if last_flush.elapsed() >= Duration::from_secs(60) {
                    last_flush = std::time::Instant::now();
                    let used: Vec<(String, i64)> =
                        std::mem::take(&mut *iam.used.lock().unwrap_or_else(|p| p.into_inner()))
                            .into_iter()
                            .collect();
                    if let Err(e) = store::touch_keys(&iam.db, &used).await {
                        tracing::debug!("IAM: last use of keys: {e}");
                    }
                }
            }
        });
    }
}
