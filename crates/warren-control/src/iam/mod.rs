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

/// Most keys (known or not) cached; past it unknown ones go, then all.
const MAX_CACHED: usize = 100_000;
/// How long a cached principal is used without a look at the database, whatever else happens
/// (a replica that cannot read the IAM version still drops it then).
const MAX_AGE: std::time::Duration = std::time::Duration::from_secs(30);

/// A key's principal (none: not a key) and when it was read.
type Cached = (std::time::Instant, Option<Arc<Principal>>);

/// What was read of every project (paths, quotas), and whether a change has made it stale: a
/// stale value is read again, and used as it is while the database does not answer.
type Kept<T> = RwLock<Option<(bool, Arc<T>)>>;

/// IAM for one replica: the database and what it cached.
#[derive(Debug)]
pub struct Iam {
    db: Db,
    cache: RwLock<HashMap<String, Cached>>,
    /// Every project's path, once read.
    projects: Kept<std::collections::HashSet<String>>,
    /// Every project's quota that sets a limit, once read.
    quotas: Kept<HashMap<String, store::Quota>>,
    version: AtomicI64,
    /// Bumped whenever the cache is dropped: a read from the database that began before is
    /// not cached.
    epoch: std::sync::atomic::AtomicU64,
    /// Keys used since the last flush: id → when.
    used: Mutex<HashMap<String, i64>>,
}

impl Iam {
    /// IAM on `db` (migrated).
    pub async fn new(db: Db) -> Result<Iam, IamError> {
        let v = store::version(&db).await?;
        let iam = Iam {
            db,
            cache: RwLock::default(),
            projects: RwLock::default(),
            quotas: RwLock::default(),
            version: AtomicI64::new(v),
            epoch: Default::default(),
            used: Mutex::default(),
        };
        // Read now, so that a database outage later finds them known.
        iam.project_exists(model::ROOT).await?;
        iam.quotas().await?;
        Ok(iam)
    }

    /// The database.
    pub fn db(&self) -> &Db {
        &self.db
    }

    /// The principal of `key`, if it is a key that works now. `Err` only when the database
    /// does not answer (and the key is not cached).
    pub async fn authenticate(&self, key: &str) -> Result<Option<Arc<Principal>>, IamError> {
        // Only Warren's and E2B's key forms are ever keys: anything else is no key, without
        // a look in the database (or a place in the cache).
        if !(key.starts_with("wrn_") || key.starts_with("e2b_")) || key.len() > 128 {
            return Ok(None);
        }
        let hash = crate::auth::hash(key);
        self.cached(hash.clone(), || store::principal(&self.db, &hash))
            .await
    }

    /// The principal of the key whose id is `id`, if it works now: what a request made on its
    /// behalf holds (`api::access`). Cached like [`Iam::authenticate`]'s, so a revoked key
    /// stops working for requests made on its behalf within about a second too.
    pub async fn principal_by_id(&self, id: &str) -> Result<Option<Arc<Principal>>, IamError> {
        if !id.starts_with("key_") || id.len() > 128 {
            return Ok(None);
        }
        // Hashes are hex: an entry by id cannot take one's place.
        self.cached(format!("id:{id}"), || store::principal_by_id(&self.db, id))
            .await
    }

    /// The principal cached under `entry`, read with `load` when missing or too old.
    async fn cached<F, Fut>(
        &self,
        entry: String,
        load: F,
    ) -> Result<Option<Arc<Principal>>, IamError>
    where
        F: FnOnce() -> Fut,
        Fut: std::future::Future<Output = Result<Option<Principal>, IamError>>,
    {
        let hash = entry;
        let cached = self
            .cache
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .get(&hash)
            .cloned();
        let p = match cached {
            Some((at, p)) if at.elapsed() < MAX_AGE => p,
            stale => {
                let before = self.epoch.load(Ordering::Acquire);
                let p = match load().await {
                    Ok(p) => p.map(Arc::new),
                    // The database away: what was known of the key stands (sandboxes keep
                    // working through an outage), an unknown key gets the error.
                    Err(e) => match stale {
                        Some((_, p)) => return Ok(self.used(p)),
                        None => return Err(e),
                    },
                };
                // Cached only if no change was seen meanwhile (else it may be from before it).
                if self.epoch.load(Ordering::Acquire) == before {
                    let mut c = self.cache.write().unwrap_or_else(|p| p.into_inner());
                    if c.len() >= MAX_CACHED {
                        // Unknown keys go first; keys in use stay unless they are all there is.
                        c.retain(|_, (_, p)| p.is_some());
                        if c.len() >= MAX_CACHED {
                            c.clear();
                        }
                    }
                    c.insert(hash, (std::time::Instant::now(), p.clone()));
                }
                p
            }
        };
        Ok(self.used(p))
    }

    /// `p` if it has not expired, its use noted.
    fn used(&self, p: Option<Arc<Principal>>) -> Option<Arc<Principal>> {
        let now = store::now_ms();
        let p = p.filter(|p| p.expires_ms.is_none_or(|e| e > now));
        if let Some(p) = &p {
            self.used
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .insert(p.key_id.clone(), now);
        }
        p
    }

    /// Whether project `path` exists (cached; through a database outage, as last read). A
    /// path not in the cache is looked for again: one made a moment ago through another
    /// replica exists.
    pub async fn project_exists(&self, path: &str) -> Result<bool, IamError> {
        let load = || async {
            let all: Vec<(String,)> = sqlx::query_as("SELECT path FROM projects")
                .fetch_all(&self.db)
                .await?;
            Ok(all.into_iter().map(|(p,)| p).collect())
        };
        if kept(&self.projects, load).await?.contains(path) {
            return Ok(true);
        }
        stale(&self.projects);
        Ok(kept(&self.projects, load).await?.contains(path))
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
        self.epoch.fetch_add(1, Ordering::AcqRel);
        self.cache
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .clear();
        stale(&self.projects);
        stale(&self.quotas);
    }

    /// Every project's quota that sets a limit (cached; through a database outage, as last
    /// read).
    pub async fn quotas(&self) -> Result<Arc<HashMap<String, store::Quota>>, IamError> {
        kept(&self.quotas, || async {
            Ok(store::quotas(&self.db).await?.into_iter().collect())
        })
        .await
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

/// Marks a kept value stale.
fn stale<T>(k: &Kept<T>) {
    if let Some((s, _)) = k.write().unwrap_or_else(|p| p.into_inner()).as_mut() {
        *s = true;
    }
}

/// The kept value, read again with `load` when missing or stale; a stale one stands while
/// `load` fails.
async fn kept<T, F, Fut>(k: &Kept<T>, load: F) -> Result<Arc<T>, IamError>
where
    F: FnOnce() -> Fut,
    Fut: std::future::Future<Output = Result<T, IamError>>,
{
    let now = k.read().unwrap_or_else(|p| p.into_inner()).clone();
    match now {
        Some((false, v)) => Ok(v),
        old => match load().await {
            Ok(v) => {
                let v = Arc::new(v);
                *k.write().unwrap_or_else(|p| p.into_inner()) = Some((false, v.clone()));
                Ok(v)
            }
            Err(e) => match old {
                Some((_, v)) => Ok(v),
                None => Err(e),
            },
        },
    }
}
