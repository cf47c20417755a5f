//! The warm pool: sandbox inits started, and their roots built, before any request asks.
//!
//! Starting an init costs more than a create should: the clone with a new network namespace
//! (serialised in the kernel), on cgroup v1 the join of its cgroups (the first task migration
//! after a quiet spell waits for an RCU grace period, about 10 ms here, and stalls every fork
//! on the host meanwhile), and the overlay mount on a disk-backed upper directory (about 1 ms).
//! A warm init has all of that behind it: it sits in new namespaces and a cgroup of its own,
//! its root built from the pool's image and pivoted into, and waits for the activation message.
//! A create of that image takes one, renames its directory, cgroup and socket to the sandbox's
//! id, sets the limits and activates it.
//!
//! The pool refills in batches (from half empty to full), so that the v1 migrations of a batch
//! share one grace period.
//!
//! Warm inits need no cleanup when the daemon dies: the daemon holds their configuration pipe,
//! so they read end-of-file and exit. Their directories, cgroups and sockets are collected at
//! the next start like any leftover (names start with `warm-`, which no sandbox id can).

use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use crate::cgroups::SandboxCgroup;
use crate::create::Spawned;
use crate::node::{Node, blocking};
use crate::state::Record;

/// Prefix of warm pool names (directories, cgroups, sockets).
pub const WARM_PREFIX: &str = "warm-";

/// A ready init waiting to become a sandbox.
pub struct Warm {
    image: String,
    spawned: Spawned,
    cgroup: SandboxCgroup,
    socket: PathBuf,
    dir: PathBuf,
    disk: Option<Arc<crate::disk::DiskPool>>,
}

impl Warm {
    /// Gives it the sandbox's names (directory, cgroup, socket) and limits. On failure, the
    /// caller discards it.
    pub(crate) fn claim(
        &mut self,
        record: &Record,
        dir: &Path,
        socket: &Path,
    ) -> std::io::Result<()> {
        std::fs::rename(&self.dir, dir)?;
        self.dir = dir.to_path_buf();
        self.cgroup = self.cgroup.rename(record.id.as_str())?;
        self.cgroup.set_limits(&record.resources)?;
        if let (Some(pool), Some(disk)) = (&self.disk, record.resources.disk) {
            let v = pool
                .volume_of(dir)
                .ok_or_else(|| std::io::Error::other("the warm init has no disk volume"))?;
            pool.set_limit(&v, disk.bytes())?;
        }
        std::fs::rename(&self.socket, socket)?;
        self.socket = socket.to_path_buf();
        Ok(())
    }

    /// The init, ready to be activated.
    pub(crate) fn into_spawned(self) -> Spawned {
        self.spawned
    }

    /// Kills it and removes its cgroup, socket and directory. Blocking.
    pub(crate) fn discard(self) {
        let pidfd: OwnedFd = self.spawned.pidfd;
        let _ = warren_sys::process::pidfd_kill(&pidfd);
        drop(self.spawned.config);
        warren_sys::process::pidfd_wait(&pidfd, Duration::from_secs(1));
        warren_sys::process::pidfd_reap(&pidfd);
        let _ = self.cgroup.remove(Duration::from_secs(2));
        let _ = std::fs::remove_file(&self.socket);
        if let Some(pool) = &self.disk {
            pool.release(&self.dir);
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

impl Node {
    /// Starts one warm init of `image`. Blocking.
    fn start_warm(&self, image: &str) -> std::io::Result<Warm> {
        let rootfs = match self.images.resolve(image, None) {
            Ok(crate::images::Resolved::Host(r)) => r,
            Ok(crate::images::Resolved::Layered(_)) => {
                return Err(std::io::Error::other(
                    "the warm pool prepares the built-in host image only",
                ));
            }
            Err(e) => return Err(std::io::Error::other(e.to_string())),
        };
        let name = format!("{WARM_PREFIX}{}", crate::create::random_name(12));
        let cgroup = self.cgroups.sandbox(&name);
        let socket = self.dirs.sockets.join(format!("{name}.sock"));
        let dir = self.dirs.warm.join(&name);
        // Only an init whose root is built joins the pool: claiming renames its directory.
        let started = self
            .spawn_guest(&rootfs, &cgroup, None, &socket, &dir)
            .and_then(|s| s.wait_built(Duration::from_secs(30)).map(|()| s));
        match started {
            Ok(spawned) => Ok(Warm {
                image: image.to_string(),
                spawned,
                cgroup,
                socket,
                dir,
                disk: self.dirs.disk.clone(),
            }),
            Err(e) => {
                let _ = cgroup.remove(Duration::from_secs(2));
                let _ = std::fs::remove_file(&socket);
                if let Some(pool) = &self.dirs.disk {
                    pool.release(&dir);
                }
                let _ = std::fs::remove_dir_all(&dir);
                Err(e)
            }
        }
    }

    /// A warm init of `image`, if one is ready; refills the pool when it runs low.
    pub(crate) fn take_warm(self: &Arc<Self>, image: &str) -> Option<Warm> {
        let mut pool = self.warm.lock().unwrap_or_else(|p| p.into_inner());
        let w = pool
            .iter()
            .position(|w| w.image == image)
            .map(|i| pool.swap_remove(i));
        let low = pool.len() < (self.cfg.warm_pool as usize).div_ceil(2);
        drop(pool);
        if low {
            self.refill();
        }
        w
    }

    /// Fills the pool to `warm_pool` in the background (one refiller at a time).
    pub(crate) fn refill(self: &Arc<Self>) {
        if self.cfg.warm_pool == 0 || self.refilling.swap(true, Ordering::AcqRel) {
            return;
        }
        let node = self.clone();
        tokio::spawn(async move {
            let image = node.cfg.warm_image.clone();
            loop {
                let have = node.warm.lock().unwrap_or_else(|p| p.into_inner()).len();
                if have >= node.cfg.warm_pool as usize || node.closing.load(Ordering::Acquire) {
                    break;
                }
                let (n, img) = (node.clone(), image.clone());
                match blocking(move || n.start_warm(&img)).await {
                    Ok(w) => node.warm.lock().unwrap_or_else(|p| p.into_inner()).push(w),
                    Err(e) => {
                        tracing::warn!("warm pool: starting an init failed: {e}");
                        break;
                    }
                }
            }
            node.refilling.store(false, Ordering::Release);
        });
    }

    /// Empties the pool (on shutdown); sandboxes are not touched.
    pub async fn drain_warm_pool(&self) {
        self.closing.store(true, Ordering::Release);
        let all: Vec<Warm> =
            std::mem::take(&mut *self.warm.lock().unwrap_or_else(|p| p.into_inner()));
        let _ = blocking(move || {
            for w in all {
                w.discard();
            }
            Ok(())
        })
        .await;
    }
}
