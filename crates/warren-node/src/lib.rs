//! Warren's node daemon: runs sandboxes on one host.
//!
//! - [`Node::start`] prepares the host (directories, cgroups, built-in images), re-adopts the
//!   sandboxes a previous daemon left running and removes what it left half-made.
//! - [`api::router`] serves the node API the control plane talks to.
//!
//! Sandboxes never depend on the daemon staying alive: see [`adopt`].

// The modules stand in layers; each imports only from layers below it.
// Top: the daemon's start (this file) and its HTTP API.
pub mod api;
// Operations on sandboxes.
pub mod adopt;
pub mod create;
pub mod exec;
pub mod files;
pub mod fncall;
pub mod image_ops;
pub mod incidents;
pub mod lifecycle;
pub mod limits;
pub mod network;
pub mod tasks;
pub mod timers;
pub mod trajectory;
// The talk to guest agents, and the node's state of its sandboxes.
pub mod guest_client;
pub mod node;
// The backend seam, and the container backend behind it.
pub mod backend;
pub mod container;
// Foundations: checks, accounting, stores, configuration.
pub mod admission;
pub mod capacity;
pub mod config;
pub mod disk;
pub mod error;
pub mod events;
pub mod guest_bin;
pub mod images;
pub mod layers;
pub mod pending;
pub mod phase;
pub mod state;
pub mod validate;
pub mod workers;

use std::collections::HashMap;
use std::os::unix::fs::DirBuilderExt;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, RwLock};

pub use adopt::AdoptReport;
pub use config::NodeConfig;
pub use error::NodeError;
pub use node::Node;
use warren_types::id::NodeId;

use crate::admission::Admission;
use crate::container::{ContainerBackend, ContainerConfig};
use crate::images::Images;
use crate::node::Dirs;

/// Why the node could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// A directory or file of the state directory.
    #[error("state directory {path}: {source}")]
    State {
        /// The path.
        path: PathBuf,
        /// What failed.
        #[source]
        source: std::io::Error,
    },
    /// The backend cannot run here (for containers: cgroups missing or not writable).
    #[error("the container backend: {0}")]
    Backend(#[source] std::io::Error),
    /// The guest agent binary is missing, or the node's copy of it cannot be made.
    #[error(transparent)]
    Guest(#[from] crate::guest_bin::GuestBinError),
    /// A setting that cannot work.
    #[error("configuration: {0}")]
    Config(String),
}

impl Node {
    /// Prepares the host and re-adopts surviving sandboxes.
    pub async fn start(cfg: NodeConfig) -> Result<(Arc<Node>, AdoptReport), StartError> {
        // The grader's uid must be no one else's: not root's, not the default user's, not the
        // guest's spawner's.
        if [0, 1000, warren_types::guest::SPAWNER_UID].contains(&cfg.grader_uid) {
            return Err(StartError::Config(format!(
                "grader_uid = {} is taken (0 is root, 1000 the default user, {} the guest's \
                 spawner): pick another uid no agent uses, e.g. 61000",
                cfg.grader_uid,
                warren_types::guest::SPAWNER_UID
            )));
        }
        crate::validate::check_labels(&cfg.labels)
            .map_err(|e| StartError::Config(format!("labels: {e}")))?;
        if !matches!(cfg.pool.as_str(), "default" | "burst") {
            return Err(StartError::Config(format!(
                "pool = {:?}: give \"default\" or \"burst\"",
                cfg.pool
            )));
        }
        let root = cfg.state_dir.clone();
        let state_err = |path: PathBuf| move |source| StartError::State { path, source };
        let dirs = Dirs {
            sandboxes: root.join("sandboxes"),
            sockets: root.join("sockets"),
            images: root.join("images"),
            trash: root.join("trash"),
            warm: root.join("warm"),
            disk: None,
        };
        for d in [
            &root,
            &dirs.sandboxes,
            &dirs.sockets,
            &dirs.images,
            &dirs.trash,
            &dirs.warm,
        ] {
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(d)
                .map_err(state_err(d.clone()))?;
        }
        let state_lock = lock_state_dir(&root)?;
        let id = node_id(&root).map_err(state_err(root.join("node.id")))?;
        let mut dirs = dirs;
        dirs.disk = match crate::disk::DiskPool::open(&root, &cfg) {
            Ok(pool) => pool.map(Arc::new),
            Err(e) => {
                tracing::error!(
                    "no disk quotas on this node ({e}); sandboxes' writable layers are unlimited \
                     directories in the state directory: install btrfs-progs, or set disk_quota = \"off\" to silence this"
                );
                None
            }
        };
        if cfg.warm_image != "host" {
            tracing::warn!(
                warm_image = %cfg.warm_image,
                "warm_pool prepares only the built-in `host` image; layered images get warm \
                 inits of their own once used (warm_images, warm_per_image)"
            );
        }
        let images = Arc::new(
            Images::prepare(&dirs.images, Some(&cfg.image_store))
                .map_err(state_err(dirs.images.clone()))?,
        );
        let layers = Arc::new(
            crate::layers::LayerMounts::new(
                &root.join("layers"),
                cfg.layer_mount,
                std::time::Duration::from_secs(cfg.layer_idle_unmount),
                cfg.layer_readahead_kb,
            )
            .map_err(state_err(root.join("layers")))?,
        );
        let guest_bin = match &cfg.guest_binary {
            Some(p) => p.clone(),
            None => std::env::current_exe()
                .ok()
                .and_then(|e| e.parent().map(|d| d.join("warren-guest")))
                .unwrap_or_else(|| PathBuf::from("warren-guest")),
        };
        // Inits run the node's own copy, so the configured file stays free to be rebuilt.
        let guest = crate::guest_bin::install(&guest_bin, &root.join("guest"))?;
        let network = if cfg.network.enabled {
            Some(network_config(&cfg.network, &root).map_err(StartError::Config)?)
        } else {
            None
        };
        // Before the backend: its DNS proxy holds a socket per query in flight.
        let open_files = crate::capacity::raise_open_files();
        let backend = ContainerBackend::new(
            ContainerConfig {
                network,
                cgroup_parent: cfg.cgroup_parent.clone(),
                sandboxes: dirs.sandboxes.clone(),
                sockets: dirs.sockets.clone(),
                warm: dirs.warm.clone(),
                trash: dirs.trash.clone(),
                guest_bin: guest.path.clone(),
                guest_limits: cfg.guest_limits(),
                grader: cfg.grader(),
                warm_host: cfg.warm_pool as usize,
                warm_per_image: cfg.warm_per_image as usize,
                warm_images: cfg.warm_images as usize,
                warm_idle: std::time::Duration::from_secs(cfg.layer_idle_unmount),
                cpu_idle: cfg.qos_cpu_idle,
            },
            dirs.disk.clone(),
            layers.clone(),
            images.clone(),
        )
        .map_err(|e| {
            // Nothing runs: the disk pool mounted above goes again.
            if let Some(pool) = &dirs.disk {
                let _ = warren_sys::mount::unmount_detach(&pool.root);
            }
            StartError::Backend(e)
        })?;
        let pid_max = crate::capacity::raise_pid_max(&cfg).unwrap_or(32768);
        let mem_total = crate::admission::HostLoad::read()
            .map(|l| l.mem_total)
            .unwrap_or(0);
        let capacity = crate::capacity::derive_max_sandboxes(&cfg, mem_total, pid_max, open_files);
        tracing::info!(
            max_sandboxes = capacity.max_sandboxes,
            bound_by = capacity.bound_by,
            pid_max,
            open_files,
            "capacity"
        );
        let create_gate = crate::capacity::Gate::new(&cfg);
        let fncall = {
            let allocatable = (mem_total as f64 * cfg.memory_overcommit) as u64;
            let share = cfg.fncall_memory_share;
            if !(0.0..=1.0).contains(&share) {
                tracing::warn!(share, "fncall_memory_share is taken as 0 to 1: clamped");
            }
            let share = if share.is_nan() {
                0.25
            } else {
                share.clamp(0.0, 1.0)
            };
            crate::workers::Workers::new((allocatable as f64 * share) as u64, allocatable)
        };
        let events = crate::events::EventStore::open(&root);
        let node = Arc::new(Node {
            id,
            events,
            cfg,
            backend: backend.clone(),
            images,
            layers,
            dirs,
            guest,
            sandboxes: RwLock::new(HashMap::new()),
            admission: Admission::default(),
            capacity,
            sampler: Default::default(),
            create_gate,
            prefetch_gate: Arc::new(tokio::sync::Semaphore::new(1)),
            _state_lock: state_lock,
            idempotency: Mutex::new(HashMap::new()),
            pending: Default::default(),
            teardowns: Default::default(),
            fncall,
            changes: Mutex::new(crate::node::Changes::new()),
        });
        let report = node.adopt().await;
        node.watch_network_denials();
        node.collect_guest_copies();
        backend.prewarm();
        node.start_timers();
        tracing::info!(
            node_id = %node.id,
            isolation = node.backend.isolation(),
            adopted = report.adopted,
            removed = report.removed,
            leftovers = report.leftovers,
            "node started"
        );
        Ok((node, report))
    }

    /// Removes the copies of the guest binary that neither this start nor an adopted sandbox
    /// runs (see the `guest_bin` module). Blocking (a few files).
    fn collect_guest_copies(&self) {
        let mut keep: std::collections::HashSet<String> = self
            .sandboxes
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .values()
            .filter_map(|s| s.record.guest.clone())
            .collect();
        keep.insert(self.guest.digest.clone());
        let removed = crate::guest_bin::collect(&self.cfg.state_dir.join("guest"), &keep);
        tracing::info!(
            guest = %self.guest.digest,
            path = %self.guest.path.display(),
            unused_copies_removed = removed,
            "guest agent"
        );
    }

    /// Stops the node's own work (the teardowns a task stop left going, waited for up to a
    /// minute; the warm pool); sandboxes keep running.
    pub async fn shutdown(&self) {
        if tokio::time::timeout(std::time::Duration::from_secs(60), self.teardowns.write())
            .await
            .is_err()
        {
            tracing::warn!("teardowns still going after a minute: the next start collects them");
        }
        let backend = self.backend.clone();
        let _ = crate::node::blocking(move || {
            backend.shutdown();
            Ok(())
        })
        .await;
    }

    /// Unmounts every layer no sandbox uses now (blocking; for shutdown).
    pub fn unmount_unused_layers(&self) -> usize {
        self.layers.sweep(true)
    }

    /// Unmounts the disk pool when no sandbox is left to use it (at stop; the next start mounts
    /// it again). Its loop device frees itself.
    pub fn unmount_disk_pool_if_unused(&self) {
        let none = self
            .sandboxes
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .is_empty();
        if let (true, Some(pool)) = (none, &self.dirs.disk)
            && let Err(e) = warren_sys::mount::unmount_detach(&pool.root)
        {
            tracing::warn!("unmounting the disk pool: {e}");
        }
    }

    /// Removes the sandbox network's firewall table when no sandbox is left (at stop; the
    /// next start installs it again).
    pub fn remove_network_if_unused(&self) {
        let none = self
            .sandboxes
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .is_empty();
        if none && let Err(e) = self.backend.remove_network() {
            tracing::warn!("removing the firewall table: {e}");
        }
    }

    /// Removes the backend's own host state (Warren's empty parent cgroups), once every
    /// sandbox is gone.
    pub fn remove_cgroups(&self) -> std::io::Result<()> {
        self.backend.remove_host_state()
    }

    /// Kills every sandbox (for `warren up --kill-sandboxes-on-exit`).
    pub async fn kill_all(&self) -> usize {
        let ids: Vec<_> = self
            .sandboxes
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .keys()
            .cloned()
            .collect();
        let kills = ids.iter().map(|id| self.kill(id));
        futures_util::future::join_all(kills)
            .await
            .into_iter()
            .filter(Result::is_ok)
            .count()
    }
}

/// The container backend's network from `[node.network]`, or what is wrong with it.
fn network_config(
    n: &crate::config::NetworkConfig,
    root: &std::path::Path,
) -> Result<crate::container::net::NetConfig, String> {
    use warren_types::net::Cidr;
    let cidr =
        |what: &str, s: &str| Cidr::parse(s).map_err(|e| format!("[node.network] {what}: {e}"));
    let addressing =
        warren_net::link::Addressing::new(cidr("pool4", &n.pool4)?, cidr("pool6", &n.pool6)?)
            .map_err(|e| format!("[node.network]: {e}"))?;
    let list = |what: &str, v: &[String]| -> Result<Vec<Cidr>, String> {
        v.iter().map(|s| cidr(what, s)).collect()
    };
    let dns_upstream = match &n.dns_upstream {
        Some(s) => parse_upstream(s)?,
        None => host_resolver().ok_or_else(|| {
            "[node.network] dns_upstream is not set and /etc/resolv.conf names no nameserver: \
             set it to the DNS server sandboxes' allowed names are resolved with"
                .to_string()
        })?,
    };
    if n.dns_min_ttl > n.dns_max_ttl || n.dns_max_ttl == 0 {
        return Err(format!(
            "[node.network] dns_min_ttl ({}) must be at most dns_max_ttl ({}), which must be at least 1",
            n.dns_min_ttl, n.dns_max_ttl
        ));
    }
    Ok(crate::container::net::NetConfig {
        dns_upstream,
        dns_ttl: (n.dns_min_ttl, n.dns_max_ttl),
        firewall: warren_net::nft::FirewallConfig {
            addressing,
            internal: list("internal", &n.internal)?,
            exempt: list("exempt", &n.exempt)?,
            log_group: n.log_group,
            masquerade: n.masquerade,
            proxy_port: n.sni_proxy.then_some(n.proxy_port),
        },
        resolv_conf: root.join("resolv.conf"),
        generation_file: root.join("net-generation"),
        expose: crate::container::expose::ExposeConfig {
            address: n.expose_address.parse().map_err(|_| {
                format!(
                    "[node.network] expose_address {:?} is not an IP address: give the host \
                     address exposed ports listen on, e.g. 127.0.0.1 (this host only) or 0.0.0.0",
                    n.expose_address
                )
            })?,
            ports: warren_types::net::PortRange::parse(&n.expose_ports)
                .map_err(|e| format!("[node.network] expose_ports: {e}"))?,
        },
        sni: n.sni_proxy.then_some(crate::container::net::SniConfig {
            port: n.proxy_port,
            refuse_ech: n.refuse_ech,
        }),
    })
}

/// `ADDR`, `ADDR:PORT` or `[V6]:PORT`, port 53 by default.
fn parse_upstream(s: &str) -> Result<std::net::SocketAddr, String> {
    let s = s.trim();
    if let Ok(a) = s.parse::<std::net::SocketAddr>() {
        return Ok(a);
    }
    s.parse::<std::net::IpAddr>()
        .map(|ip| std::net::SocketAddr::new(ip, 53))
        .map_err(|_| format!("[node.network] dns_upstream {s:?} is not an address or address:port"))
}

/// The first nameserver of the host's `/etc/resolv.conf`.
fn host_resolver() -> Option<std::net::SocketAddr> {
    let text = std::fs::read_to_string("/etc/resolv.conf").ok()?;
    text.lines()
        .filter_map(|l| l.trim().strip_prefix("nameserver"))
        .filter_map(|a| a.trim().split('%').next()?.parse::<std::net::IpAddr>().ok())
        .map(|ip| std::net::SocketAddr::new(ip, 53))
        .next()
}

/// Takes the state directory for this daemon alone (an exclusive `flock` on
/// `<state_dir>/daemon.lock`, held while the node lives): two daemons on one state directory
/// would share a node id and fight over its sandboxes.
fn lock_state_dir(root: &std::path::Path) -> Result<std::fs::File, StartError> {
    use std::os::unix::fs::OpenOptionsExt;
    let path = root.join("daemon.lock");
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o600)
        .custom_flags(rustix::fs::OFlags::NOFOLLOW.bits() as i32)
        .open(&path)
        .map_err(|source| StartError::State {
            path: path.clone(),
            source,
        })?;
    match rustix::fs::flock(&f, rustix::fs::FlockOperation::NonBlockingLockExclusive) {
        Ok(()) => Ok(f),
        Err(rustix::io::Errno::WOULDBLOCK) => Err(StartError::Config(format!(
            "another node daemon (warren up or warren node) runs on the state directory {}: \
             stop it, or give this one a --data-dir of its own",
            root.display()
        ))),
        Err(e) => Err(StartError::State {
            path,
            source: e.into(),
        }),
    }
}

/// Reads this node's id, making one on first start.
fn node_id(root: &std::path::Path) -> std::io::Result<NodeId> {
    let path = root.join("node.id");
    match std::fs::read_to_string(&path) {
        Ok(s) => s
            .trim()
            .parse()
            .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, format!("{e}"))),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let id = NodeId::from_random(rand::random());
            std::fs::write(&path, format!("{id}\n"))?;
            Ok(id)
        }
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod start_tests {
    use super::*;

    #[test]
    fn one_daemon_per_state_directory() {
        let dir = tempfile::tempdir().unwrap();
        let first = lock_state_dir(dir.path()).unwrap();
        match lock_state_dir(dir.path()) {
            Err(StartError::Config(m)) => assert!(m.contains("another node daemon"), "{m}"),
            other => panic!("a second lock was taken: {other:?}"),
        }
        drop(first);
        lock_state_dir(dir.path()).unwrap();
        // A link planted in the lock's place is not followed.
        let d2 = tempfile::tempdir().unwrap();
        std::os::unix::fs::symlink("/etc/passwd", d2.path().join("daemon.lock")).unwrap();
        assert!(lock_state_dir(d2.path()).is_err());
    }

    #[tokio::test]
    async fn a_taken_grader_uid_is_refused_before_anything_is_touched() {
        let dir = tempfile::tempdir().unwrap();
        for uid in [0, 1000, warren_types::guest::SPAWNER_UID] {
            let cfg = NodeConfig {
                state_dir: dir.path().join("state"),
                grader_uid: uid,
                ..Default::default()
            };
            match Node::start(cfg).await {
                Err(StartError::Config(m)) => assert!(m.contains("grader_uid"), "{m}"),
                Err(e) => panic!("uid {uid}: {e}"),
                Ok(_) => panic!("uid {uid} accepted"),
            }
            assert!(!dir.path().join("state").exists());
        }
    }
}
