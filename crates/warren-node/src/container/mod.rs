//! The container backend: Warren's own runtime. Each sandbox is an init (the guest agent) in
//! new namespaces (pid, mount, ipc, uts, network, cgroup), in a cgroup of its own, on an
//! overlay root of read-only layers under a writable layer (a btrfs volume under quota where
//! the node has a disk pool), confined by seccomp, Landlock and dropped capabilities in the
//! agent itself.
//!
//! - `cgroups`: the v1/v2 cgroup layer (limits, freezer, kill, counters).
//! - `spawn`: starting an init.
//! - `instance`: what a sandbox holds, and its one release.
//! - `pool`: inits started ahead of requests, a small pool per recently used image.
//! - `net`: sandbox interfaces, the node's firewall elements and its refused-packet log.

pub mod cgroups;
pub mod expose;
mod instance;
pub mod net;
mod pool;
mod spawn;

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Weak};
use std::time::Duration;

use warren_types::api::BackendKind;
use warren_types::api::QosSupport;
use warren_types::guest::{Activate, GraderSpec, GuestLimits};
use warren_types::net::NetworkMode;

use self::cgroups::Cgroups;
use self::instance::{ContainerInstance, Held};
use crate::backend::{Backend, Instance};
use crate::disk::DiskPool;
use crate::images::{Images, Rootfs};
use crate::layers::{Holder, LayerMounts};
use crate::state::{self, Record};

pub use self::pool::WARM_PREFIX;

/// What every container instance is made from and returns to.
pub(crate) struct Host {
    pub(crate) cgroups: Cgroups,
    sandboxes: PathBuf,
    sockets: PathBuf,
    warm: PathBuf,
    trash: PathBuf,
    pub(crate) disk: Option<Arc<DiskPool>>,
    pub(crate) layers: Arc<LayerMounts>,
    images: Arc<Images>,
    guest_bin: PathBuf,
    guest_limits: GuestLimits,
    grader: GraderSpec,
    /// The sandbox network, where the node has one.
    pub(crate) net: Option<Arc<net::NodeNet>>,
    /// Loopback-only network namespaces of ended sandboxes (network `none`), their sockets
    /// ended, for the next ones: a namespace made and destroyed per sandbox costs the kernel
    /// more than the rest of a sandbox's network.
    lo_spare: std::sync::Mutex<Vec<std::os::fd::OwnedFd>>,
    /// What the kernel offers for QoS, probed at start.
    qos: QosSupport,
}

/// Loopback-only namespaces kept for the next sandboxes.
const MAX_LO_SPARE: usize = 128;

/// Probes what the kernel offers for QoS. `use_cpu_idle`: the node's `qos_cpu_idle`.
fn probe_qos(cgroups: &Cgroups, use_cpu_idle: bool) -> QosSupport {
    use warren_sys::sched::CoreSched;
    let cpu_idle = use_cpu_idle && cgroups.has_cpu_idle();
    let smt = crate::capacity::smt_state();
    let core = warren_sys::sched::core_sched();
    let q = QosSupport {
        cpu_idle,
        sched_idle_fallback: !cpu_idle,
        core_scheduling: core != CoreSched::Unsupported,
        core_scheduling_used: core == CoreSched::Available && smt == "on",
        smt,
        psi: crate::capacity::read_pressure().is_some(),
        memory_reclaim: cgroups.reclaim_method().into(),
        swap_total: crate::capacity::swap_total(),
    };
    tracing::info!(
        cpu_idle = q.cpu_idle,
        sched_idle_fallback = q.sched_idle_fallback,
        smt = %q.smt,
        core_scheduling = q.core_scheduling,
        core_scheduling_used = q.core_scheduling_used,
        psi = q.psi,
        memory_reclaim = %q.memory_reclaim,
        swap_total = q.swap_total,
        "QoS support"
    );
    q
}

impl Host {
    /// What `cpu.idle` cannot do for a new sandbox, done to its processes before it is
    /// activated (its init and spawner: every command it starts later is forked from them
    /// and inherits it): a best-effort sandbox's threads under `SCHED_IDLE` where its cgroup
    /// cannot be made idle; a latency-sensitive one's processes a core-scheduling cookie of
    /// their own where the kernel shares cores between SMT threads. Failures are logged: the
    /// sandbox runs, less protected.
    fn apply_qos(&self, held: &Held, r: &warren_types::api::Resources) {
        let Some(cg) = &held.cgroup else { return };
        let be = r.qos == warren_types::api::QosClass::Be;
        if be && self.qos.sched_idle_fallback {
            for pid in cg.pids() {
                let tids: Vec<i32> = std::fs::read_dir(format!("/proc/{pid}/task"))
                    .map(|rd| {
                        rd.flatten()
                            .filter_map(|e| e.file_name().to_str()?.parse().ok())
                            .collect()
                    })
                    .unwrap_or_default();
                for tid in tids {
                    if let Err(e) = warren_sys::sched::set_sched_idle(tid) {
                        tracing::warn!(pid, tid, "SCHED_IDLE for a best-effort sandbox: {e}");
                    }
                }
            }
        }
        if !be && self.qos.core_scheduling_used {
            for pid in cg.pids() {
                if let Err(e) = warren_sys::sched::core_sched_create(pid) {
                    tracing::warn!(
                        pid,
                        "core-scheduling cookie for a latency-sensitive sandbox: {e}"
                    );
                }
            }
        }
    }

    /// A loopback-only network namespace for a new init: one an ended sandbox left, or a new
    /// one. Blocking.
    pub(crate) fn take_loopback(&self) -> std::io::Result<std::os::fd::OwnedFd> {
        match self
            .lo_spare
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .pop()
        {
            Some(ns) => Ok(ns),
            None => warren_sys::net::new_netns(),
        }
    }

    /// Takes back the loopback-only namespace of an ended sandbox (every process of it gone):
    /// the TCP sockets still closing in it are ended and it is kept for the next sandbox,
    /// while there is room. Blocking.
    pub(crate) fn give_back_loopback(&self, ns: std::os::fd::OwnedFd) {
        if self
            .lo_spare
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .len()
            >= MAX_LO_SPARE
        {
            return;
        }
        match warren_net::sockets::destroy_all(std::os::fd::AsFd::as_fd(&ns)) {
            Ok(_) => {
                let mut spare = self.lo_spare.lock().unwrap_or_else(|p| p.into_inner());
                if spare.len() < MAX_LO_SPARE {
                    spare.push(ns);
                }
            }
            Err(e) => tracing::warn!("ending a loopback namespace's sockets: {e}"),
        }
    }

    /// The control socket of the instance `name`.
    pub(crate) fn socket_of(&self, name: &str) -> PathBuf {
        self.sockets.join(format!("{name}.sock"))
    }

    /// Moves `dir` into the trash at once and deletes it in the background (a large writable
    /// layer takes a while; iteratively and by descriptor: it can be 100,000 directories deep).
    pub(crate) fn trash(&self, dir: &Path) {
        if std::fs::symlink_metadata(dir).is_err() {
            return;
        }
        let name = dir
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let trash = self.trash.join(format!("{name}-{}", state::now_ms()));
        match std::fs::rename(dir, &trash) {
            Ok(()) => {
                std::thread::spawn(move || {
                    if let Err(e) = warren_fs::remove_path(&trash) {
                        tracing::error!("removing {}: {e}", trash.display());
                    }
                });
            }
            Err(_) => {
                if let Err(e) = warren_fs::remove_path(dir) {
                    tracing::error!("removing {}: {e}", dir.display());
                }
            }
        }
    }

    /// The root of an image given by its layers (none: the built-in `host` image), taking a
    /// reference on each layer for `holder` into `held`. Blocking.
    fn rootfs(
        &self,
        held: &mut Held,
        layers: &[String],
        holder: Holder,
    ) -> std::io::Result<Rootfs> {
        if layers.is_empty() {
            return Ok(self.images.host_rootfs());
        }
        let mounts = self
            .layers
            .acquire_for(layers, |d| self.images.layer_file(d), holder)?;
        held.layers = layers.to_vec();
        held.layers_for = holder;
        Ok(self.images.layered_rootfs(&mounts))
    }
}

/// How the container backend is set up.
pub struct ContainerConfig {
    /// Warren's parent cgroup name.
    pub cgroup_parent: String,
    /// Where sandbox directories live.
    pub sandboxes: PathBuf,
    /// Where control sockets live.
    pub sockets: PathBuf,
    /// Where warm inits are built.
    pub warm: PathBuf,
    /// Where directories of killed sandboxes are deleted.
    pub trash: PathBuf,
    /// The guest agent binary every init executes (the node's own copy; see `guest_bin`).
    pub guest_bin: PathBuf,
    /// Limits the guest applies to itself.
    pub guest_limits: GuestLimits,
    /// The grader's account.
    pub grader: GraderSpec,
    /// Warm inits of the built-in `host` image (0: none).
    pub warm_host: usize,
    /// Warm inits of each recently used layered image.
    pub warm_per_image: usize,
    /// How many layered images have warm inits (the most recently used ones).
    pub warm_images: usize,
    /// A layered image's warm inits go once it has had no create for this long.
    pub warm_idle: Duration,
    /// Use `cpu.idle` for best-effort sandboxes where the kernel has it (else `SCHED_IDLE`).
    pub cpu_idle: bool,
    /// The sandbox network; none: every sandbox is loopback only.
    pub network: Option<net::NetConfig>,
}

/// The container backend.
pub struct ContainerBackend {
    host: Arc<Host>,
    pool: pool::Pool,
    me: Weak<ContainerBackend>,
}

impl ContainerBackend {
    /// Sets up cgroups and the warm pool (empty until [`ContainerBackend::prewarm`]).
    pub fn new(
        cfg: ContainerConfig,
        disk: Option<Arc<DiskPool>>,
        layers: Arc<LayerMounts>,
        images: Arc<Images>,
    ) -> std::io::Result<Arc<ContainerBackend>> {
        // The network first: a node refused for sharing a namespace makes nothing else.
        let net = match cfg.network {
            Some(n) => Some(net::NodeNet::new(n)?),
            None => None,
        };
        let mut cgroups = Cgroups::new(&cfg.cgroup_parent)?;
        let host_net = net.is_some();
        let qos = probe_qos(&cgroups, cfg.cpu_idle);
        cgroups.use_idle = qos.cpu_idle;
        let host = Arc::new(Host {
            net,
            cgroups,
            sandboxes: cfg.sandboxes,
            sockets: cfg.sockets,
            warm: cfg.warm,
            trash: cfg.trash,
            disk,
            layers,
            images,
            guest_bin: cfg.guest_bin,
            guest_limits: cfg.guest_limits,
            grader: cfg.grader,
            lo_spare: std::sync::Mutex::new(Vec::new()),
            qos,
        });
        let pool = pool::Pool::new(pool::Targets {
            host: cfg.warm_host,
            per_image: cfg.warm_per_image,
            images: cfg.warm_images,
            idle: cfg.warm_idle,
            host_net,
        });
        Ok(Arc::new_cyclic(|me| ContainerBackend {
            host,
            pool,
            me: me.clone(),
        }))
    }

    /// Starts filling the warm pool in the background.
    pub fn prewarm(&self) {
        if let Some(me) = self.me.upgrade() {
            self.pool.refill(&me);
        }
    }

    /// Starts the init of a new sandbox (a warm one when the pool has one). Blocking.
    fn start_init(&self, record: &Record, dir: &Path) -> std::io::Result<ContainerInstance> {
        let activate = Activate {
            env: record
                .env
                .iter()
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect(),
        };
        let name = record.id.as_str();
        let policy = record.network.parse().map_err(std::io::Error::other)?;
        let key = pool::Key {
            layers: record.layers.clone(),
            net: policy.mode == NetworkMode::Filtered,
        };
        // Rules beyond deny-everything (what every new interface starts with), or ports to
        // expose.
        let rules =
            !(policy.allow.is_empty() && policy.deny.is_empty() && policy.expose.is_empty());
        // A builder's init is its own: warm inits are made without the build capabilities; a
        // function-call worker's likewise, without a call server.
        if let Some(mut w) = (!record.builder && !record.fncall_worker)
            .then(|| self.pool.take(&key, self))
            .flatten()
        {
            match w.claim(record, dir, &self.host) {
                Ok(()) => {
                    let (spawned, held) = w.into_parts();
                    let (pid, start_time) = (spawned.pid, spawned.start_time);
                    if rules && let (Some(net), Some(lease)) = (&self.host.net, &held.net) {
                        net.set_policies(&[(lease.index, &policy)])?;
                    }
                    self.host.apply_qos(&held, &record.resources);
                    spawned.activate(&activate)?;
                    return ContainerInstance::new(held, pid, start_time, true);
                }
                // Dropping it frees what it held, under whichever names it had got to.
                Err(e) => tracing::warn!("warm init unusable, starting a new one: {e}"),
            }
        }
        let mut held = Held::new(&self.host);
        let rootfs = self
            .host
            .rootfs(&mut held, &record.layers, Holder::Sandbox)?;
        let spawned = self.host.spawn_guest(
            &mut held,
            name,
            &rootfs,
            Some(&record.resources),
            dir,
            spawn::InitKind {
                builder: record.builder,
                net: key.net,
                calls: record.fncall_worker,
            },
        )?;
        let (pid, start_time) = (spawned.pid, spawned.start_time);
        if rules && let (Some(net), Some(lease)) = (&self.host.net, &held.net) {
            net.set_policies(&[(lease.index, &policy)])?;
        }
        self.host.apply_qos(&held, &record.resources);
        spawned.activate(&activate)?;
        ContainerInstance::new(held, pid, start_time, false)
    }
}

impl Backend for ContainerBackend {
    fn kind(&self) -> BackendKind {
        BackendKind::Container
    }

    fn isolation(&self) -> String {
        self.host.cgroups.layout.name().to_string()
    }

    fn qos_support(&self) -> QosSupport {
        self.host.qos.clone()
    }

    fn memory_charged(&self) -> Option<u64> {
        self.host.cgroups.memory_charged()
    }

    fn start(&self, record: &Record, dir: &Path) -> std::io::Result<Box<dyn Instance>> {
        let i = self.start_init(record, dir)?;
        Ok(Box::new(i))
    }

    fn adopt(&self, record: &Record, dir: &Path) -> Result<Box<dyn Instance>, String> {
        let same_process = |pid| warren_sys::process::start_time(pid) == Some(record.start_time);
        if record.pid <= 0 || !same_process(record.pid) {
            return Err(format!("its init (pid {}) is gone", record.pid));
        }
        let pidfd =
            warren_sys::process::pidfd_open(record.pid).map_err(|e| format!("pidfd_open: {e}"))?;
        // The pid could have been reused between the check and the open: check again.
        if !same_process(record.pid) {
            return Err(format!("its init (pid {}) is gone", record.pid));
        }
        let name = record.id.as_str();
        let socket = self.host.socket_of(name);
        if !socket.exists() {
            return Err("its control socket is gone".into());
        }
        let mut held = Held::new(&self.host);
        held.dir = Some(dir.to_path_buf());
        held.cgroup = Some(self.host.cgroups.sandbox(name));
        held.socket = Some(socket);
        held.process = Some(Arc::new(pidfd));
        if let Some((index, generation)) = record.net_lease {
            let net = self.host.net.as_ref().ok_or_else(|| {
                "it has a network interface and this node now has no network ([node.network] \
                 enabled = false)"
                    .to_string()
            })?;
            held.net =
                Some(net.adopt(name, index, generation, &record.network, &record.host_ports)?);
        }
        if !record.layers.is_empty() {
            // Its layers are mounted (taken over at start): count it as a user.
            match self
                .host
                .layers
                .acquire(&record.layers, |d| self.host.images.layer_file(d))
            {
                Ok(_) => held.layers = record.layers.clone(),
                Err(e) => tracing::warn!(sandbox_id = %record.id, "its layers: {e}"),
            }
        }
        ContainerInstance::new(held, record.pid, record.start_time, false)
            .map(|i| Box::new(i) as Box<dyn Instance>)
            .map_err(|e| e.to_string())
    }

    fn discard(&self, name: &str, dir: &Path) {
        Held::leftovers_of(&self.host, name, dir).release();
    }

    fn collect_leftovers(&self, live: &HashSet<String>) -> usize {
        let host = &self.host;
        // Names that something of an instance still carries — a cgroup, a control socket, a
        // warm init's directory — and no live sandbox owns: each is released like any
        // instance, through its guard.
        let mut names: HashSet<String> = host.cgroups.existing().into_iter().collect();
        for e in std::fs::read_dir(&host.sockets)
            .into_iter()
            .flatten()
            .flatten()
        {
            let name = e.file_name().to_string_lossy().into_owned();
            names.insert(name.trim_end_matches(".sock").to_string());
        }
        for e in std::fs::read_dir(&host.warm)
            .into_iter()
            .flatten()
            .flatten()
        {
            names.insert(e.file_name().to_string_lossy().into_owned());
        }
        let mut n = 0;
        // The trash first: directories of sandboxes killed while being deleted (those moved
        // there below are deleted in the background).
        for e in std::fs::read_dir(&host.trash)
            .into_iter()
            .flatten()
            .flatten()
        {
            if let Err(e) = warren_fs::remove_path(&e.path()) {
                tracing::error!("leftover in the trash: {e}");
            }
            n += 1;
        }
        // Only names an instance can have: a sandbox id, or a warm init's.
        let ours = |n: &str| {
            n.parse::<warren_types::id::SandboxId>().is_ok()
                || n.strip_prefix(WARM_PREFIX)
                    .is_some_and(|r| !r.is_empty() && r.bytes().all(|b| b.is_ascii_alphanumeric()))
        };
        for name in names.iter().filter(|n| !live.contains(*n) && ours(n)) {
            let dir = if name.starts_with(WARM_PREFIX) {
                host.warm.join(name)
            } else {
                host.sandboxes.join(name)
            };
            Held::leftovers_of(host, name, &dir).release();
            n += 1;
        }
        // Disk volumes that no live sandbox's directory links to.
        if let Some(pool) = &host.disk {
            let used: HashSet<String> = live
                .iter()
                .filter_map(|name| pool.volume_of(&host.sandboxes.join(name)))
                .map(|v| v.name)
                .collect();
            for name in pool.volumes() {
                if !used.contains(&name) {
                    match pool.delete(&name) {
                        Ok(()) => n += 1,
                        Err(e) => tracing::error!("leftover disk volume: {e}"),
                    }
                }
            }
        }
        if let Some(pool) = &host.disk {
            pool.collect_quota_groups();
        }
        // Interfaces no live sandbox holds, then the whole firewall table at once (an earlier
        // daemon's kept enforcing until this moment).
        if let Some(net) = &host.net {
            match net.install() {
                Ok(k) => n += k,
                Err(e) => tracing::error!("installing the firewall: {e}"),
            }
        }
        n
    }

    fn housekeeping(&self) {
        self.pool.expire();
    }

    fn shutdown(&self) {
        self.pool.close();
        // The warm inits' slots came back as spares: no init will take them now.
        if let Some(net) = &self.host.net {
            net.drain_spare();
        }
    }

    fn remove_host_state(&self) -> std::io::Result<()> {
        if let Some(net) = &self.host.net
            && let Err(e) = net.remove_table()
        {
            tracing::warn!("removing the firewall table: {e}");
        }
        self.host.cgroups.remove_all()
    }

    fn remove_network(&self) -> std::io::Result<()> {
        match &self.host.net {
            Some(net) => net.remove_table(),
            None => Ok(()),
        }
    }

    fn has_network(&self) -> bool {
        self.host.net.is_some()
    }

    fn check_network(&self, policy: &warren_types::net::Policy) -> Result<(), String> {
        match &self.host.net {
            Some(net) => net.check(policy),
            None => Ok(()),
        }
    }

    fn deny_destinations(&self, addrs: &[std::net::IpAddr]) -> std::io::Result<()> {
        match &self.host.net {
            Some(net) => net.deny_also(addrs),
            None => Ok(()),
        }
    }

    fn set_networks(&self, updates: &[(u32, &warren_types::net::Policy)]) -> std::io::Result<()> {
        match &self.host.net {
            Some(net) => net.set_policies(updates),
            None => Err(std::io::Error::other("this node has no sandbox network")),
        }
    }

    fn take_network_denials(
        &self,
    ) -> Option<tokio::sync::mpsc::Receiver<crate::backend::NetDenial>> {
        self.host.net.as_ref()?.take_denials()
    }
}
