//! The warm pool: inits started, and their roots built, before any request asks.
//!
//! Starting an init costs more than a create should: the clone with a new network namespace
//! (serialised in the kernel), on cgroup v1 the join of its cgroups (the first task migration
//! after a quiet spell waits for an RCU grace period, about 10 ms here, and stalls every fork
//! on the host meanwhile), the overlay mount on a disk-backed upper directory (about 1 ms), and
//! for a layered image the mounts of its layers. A warm init has all of that behind it: it
//! sits in new namespaces and a cgroup of its own, its root built and pivoted into, and waits
//! for the activation message. A create of that image takes one, renames its directory,
//! cgroup and socket to the sandbox's id, sets the limits and activates it.
//!
//! The pool is keyed by image (its layers; none for the built-in `host` image) and network
//! (an interface with a deny-everything policy, or loopback only): `host` with the node's
//! default network keeps `warm_pool` inits, and each other key — `host` without the default
//! network, a layered image with or without — is an "image" here: each of the `warm_images`
//! most recently created keeps `warm_per_image`, so the pool holds at most
//! `warm_pool + warm_images × warm_per_image`. An image that falls out of the recent list, or has had no create for `layer_idle_unmount`
//! seconds, has its inits discarded (which also drops their references on its layers, so
//! idle layers are unmounted as before). The `host` pool refills in
//! batches (from half empty to full), so that the v1 migrations of a batch share one grace
//! period; an image's small pool refills as soon as one is taken.
//!
//! Warm inits need no cleanup when the daemon dies: the daemon holds their configuration pipe,
//! so they read end-of-file and exit. Their directories, cgroups and sockets are collected at
//! the next start like any leftover (names start with `warm-`, which no sandbox id can).

use std::collections::{HashMap, VecDeque};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::instance::Held;
use super::spawn::Spawned;
use super::{ContainerBackend, Host};
use crate::layers::Holder;
use crate::state::Record;

/// Prefix of warm pool names (directories, cgroups, sockets).
pub const WARM_PREFIX: &str = "warm-";

/// What the pool keys inits by: the image (its layer digests, bottom first; none: `host`) and
/// whether the init has a network interface.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct Key {
    pub layers: Vec<String>,
    pub net: bool,
}

/// How many warm inits to keep.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Targets {
    pub host: usize,
    pub per_image: usize,
    pub images: usize,
    /// A layered image's pool goes once it has had no create for this long.
    pub idle: Duration,
    /// Whether `host` inits of the `host` target have an interface (the node's default).
    pub host_net: bool,
}

/// A ready init waiting to become a sandbox. Dropping it frees what it holds.
pub(crate) struct Warm {
    spawned: Spawned,
    held: Held,
}

impl Warm {
    /// Gives it the sandbox's names (directory, cgroup, socket) and limits. What it holds is
    /// recorded under each new name as soon as it has it, so a failure part-way frees all.
    pub(crate) fn claim(
        &mut self,
        record: &Record,
        dir: &Path,
        host: &Host,
    ) -> std::io::Result<()> {
        let name = record.id.as_str();
        if let Some(from) = &self.held.dir {
            std::fs::rename(from, dir)?;
            self.held.dir = Some(dir.to_path_buf());
        }
        if let Some(cg) = &self.held.cgroup {
            let renamed = cg.rename(name)?;
            self.held.cgroup = Some(renamed);
        }
        if let Some(cg) = &self.held.cgroup {
            cg.set_limits(&record.resources)?;
        }
        if let (Some(pool), Some(disk)) = (&host.disk, record.resources.disk) {
            let v = pool
                .volume_of(dir)
                .ok_or_else(|| std::io::Error::other("the warm init has no disk volume"))?;
            pool.set_limit(&v, disk.bytes())?;
        }
        if let Some(from) = &self.held.socket {
            let socket = host.socket_of(name);
            std::fs::rename(from, &socket)?;
            self.held.socket = Some(socket);
        }
        if let (Some(net), Some(lease)) = (&host.net, &self.held.net) {
            net.rename(lease.index, name);
        }
        Ok(())
    }

    /// The init and what it holds, to be activated.
    pub(crate) fn into_parts(self) -> (Spawned, Held) {
        (self.spawned, self.held)
    }
}

/// What the pool holds.
#[derive(Default)]
struct Ready {
    by_image: HashMap<Key, Vec<Warm>>,
    /// Layered images with a pool, most recently created first, with when.
    recent: VecDeque<(Key, Instant)>,
    closed: bool,
}

/// The warm pool.
pub(crate) struct Pool {
    targets: Targets,
    ready: Mutex<Ready>,
    refilling: AtomicBool,
}

impl Pool {
    pub(crate) fn new(targets: Targets) -> Pool {
        Pool {
            targets,
            ready: Mutex::new(Ready::default()),
            refilling: AtomicBool::new(false),
        }
    }

    /// The key of the `host` target: `host` with the node's default network.
    fn host_key(&self) -> Key {
        Key {
            layers: Vec::new(),
            net: self.targets.host_net,
        }
    }

    /// A warm init of `image`, if one is ready. Marks the image recently used (a layered one
    /// gets a pool of its own, the least recently used one loses its) and refills.
    pub(crate) fn take(&self, image: &Key, backend: &ContainerBackend) -> Option<Warm> {
        let (warm, evicted) = {
            let mut r = self.ready.lock().unwrap_or_else(|p| p.into_inner());
            let warm = r.by_image.get_mut(image).and_then(Vec::pop);
            let mut evicted = Vec::new();
            if *image != self.host_key() && self.targets.images > 0 && self.targets.per_image > 0 {
                r.recent.retain(|(k, _)| k != image);
                r.recent.push_front((image.clone(), Instant::now()));
                while r.recent.len() > self.targets.images {
                    if let Some((old, _)) = r.recent.pop_back() {
                        evicted.extend(r.by_image.remove(&old).unwrap_or_default());
                    }
                }
            }
            (warm, evicted)
        };
        // Freed outside the lock, and off the create's path (blocking).
        if !evicted.is_empty() {
            let _ = std::thread::Builder::new()
                .name("warm-pool-evict".into())
                .spawn(move || drop(evicted));
        }
        if let Some(me) = backend.me.upgrade() {
            self.refill(&me);
        }
        warm
    }

    /// The image whose pool needs an init most, if any does: `host` below half (refilled to
    /// full), a layered image below its target.
    fn next_to_fill(&self, r: &Ready, filling_host: bool, skip_host: bool) -> Option<Key> {
        let have = |k: &Key| r.by_image.get(k).map_or(0, Vec::len);
        let host = self.host_key();
        let host_low = if skip_host {
            false
        } else if filling_host {
            have(&host) < self.targets.host
        } else {
            have(&host) < self.targets.host.div_ceil(2)
        };
        if host_low {
            return Some(host);
        }
        r.recent
            .iter()
            .map(|(k, _)| k)
            .find(|k| have(k) < self.targets.per_image)
            .cloned()
    }

    /// Fills the pools in the background (one refiller at a time).
    pub(crate) fn refill(&self, backend: &Arc<ContainerBackend>) {
        {
            let r = self.ready.lock().unwrap_or_else(|p| p.into_inner());
            if r.closed || self.next_to_fill(&r, false, false).is_none() {
                return;
            }
        }
        if self.refilling.swap(true, Ordering::AcqRel) {
            return;
        }
        let backend = Arc::downgrade(backend);
        let spawned = std::thread::Builder::new()
            .name("warm-pool".into())
            .spawn(move || {
                let mut filling_host = false;
                // A host init that fails is tried again at the next take, not in a loop; the
                // layered images' pools are filled meanwhile.
                let mut skip_host = false;
                loop {
                    let Some(b) = backend.upgrade() else { break };
                    let key = {
                        let r = b.pool.ready.lock().unwrap_or_else(|p| p.into_inner());
                        if r.closed {
                            None
                        } else {
                            b.pool.next_to_fill(&r, filling_host, skip_host)
                        }
                    };
                    let Some(key) = key else {
                        b.pool.refilling.store(false, Ordering::Release);
                        // A take between the last look and the flag's reset would have found
                        // the flag set: look once more.
                        let again = {
                            let r = b.pool.ready.lock().unwrap_or_else(|p| p.into_inner());
                            !r.closed && b.pool.next_to_fill(&r, false, skip_host).is_some()
                        };
                        if again && !b.pool.refilling.swap(true, Ordering::AcqRel) {
                            continue;
                        }
                        break;
                    };
                    let is_host = key == b.pool.host_key();
                    filling_host = is_host;
                    match start_warm(&b.host, &key) {
                        Ok(w) => {
                            let mut r = b.pool.ready.lock().unwrap_or_else(|p| p.into_inner());
                            let wanted = is_host || r.recent.iter().any(|(k, _)| k == &key);
                            if !r.closed && wanted {
                                r.by_image.entry(key).or_default().push(w);
                            }
                            // Else it is dropped (freed) here.
                        }
                        Err(e) => {
                            tracing::warn!(
                                layers = key.layers.len(),
                                net = key.net,
                                "warm pool: starting an init failed: {e}"
                            );
                            if is_host {
                                skip_host = true;
                                continue;
                            }
                            // An image that cannot be prepared gets no pool: the inits it has
                            // go too (freed outside the lock).
                            let dropped = {
                                let mut r = b.pool.ready.lock().unwrap_or_else(|p| p.into_inner());
                                r.recent.retain(|(k, _)| k != &key);
                                r.by_image.remove(&key)
                            };
                            drop(dropped);
                        }
                    }
                }
            });
        if spawned.is_err() {
            self.refilling.store(false, Ordering::Release);
        }
    }

    /// Frees the pools of layered images that have had no create for the idle time (their
    /// layers can then be unmounted). Blocking.
    pub(crate) fn expire(&self) {
        let expired: Vec<Warm> = {
            let mut r = self.ready.lock().unwrap_or_else(|p| p.into_inner());
            let idle = self.targets.idle;
            let old: Vec<Key> = r
                .recent
                .iter()
                .filter(|(_, at)| at.elapsed() >= idle)
                .map(|(k, _)| k.clone())
                .collect();
            r.recent.retain(|(_, at)| at.elapsed() < idle);
            old.iter()
                .flat_map(|k| r.by_image.remove(k).unwrap_or_default())
                .collect()
        };
        drop(expired);
    }

    /// Stops refilling and frees every warm init (at shutdown); sandboxes are not touched.
    pub(crate) fn close(&self) {
        let all: Vec<Warm> = {
            let mut r = self.ready.lock().unwrap_or_else(|p| p.into_inner());
            r.closed = true;
            r.recent.clear();
            r.by_image.drain().flat_map(|(_, v)| v).collect()
        };
        drop(all);
        // A refiller that is starting one frees it when it sees the pool closed.
        for _ in 0..100 {
            if !self.refilling.load(Ordering::Acquire) {
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// Starts one warm init of `image`. Blocking.
fn start_warm(host: &Arc<Host>, image: &Key) -> std::io::Result<Warm> {
    let mut held = Held::new(host);
    let rootfs = host.rootfs(&mut held, &image.layers, Holder::Warm)?;
    let name = format!("{WARM_PREFIX}{}", crate::state::random_name(12));
    let dir = host.warm.join(&name);
    // Only an init whose root is built joins the pool: claiming renames its directory.
    let kind = super::spawn::InitKind {
        builder: false,
        net: image.net,
        calls: false,
    };
    let spawned = host.spawn_guest(&mut held, &name, &rootfs, None, &dir, kind)?;
    spawned.wait_built(Duration::from_secs(30))?;
    Ok(Warm { spawned, held })
}
