//! The seam between the node and what isolates a sandbox.
//!
//! A [`Backend`] starts an instance from a sandbox's record (its root from the record's layers,
//! the built-in `host` image when it has none; its limits; its environment), adopts one a
//! previous daemon left running, and removes what a dead one left. An [`Instance`] is one
//! running sandbox as the backend sees it: the transport to its guest agent, its freezer, its
//! exit, its kernel counters, and one `release` that frees everything it holds. The node above
//! (admission, idempotency, timers, tasks, trajectories, exec and files) knows sandboxes only
//! through these two traits: it never names a cgroup, a pidfd or a mount.
//!
//! One backend is chosen at start and recorded in each sandbox's `state.json`; the node reports
//! the backends it has, and the control plane places a create only on a node that has the one
//! asked for. Today there is one, the container backend (see the `container` module).

use std::collections::HashSet;
use std::future::Future;
use std::io;
use std::path::{Path, PathBuf};
use std::pin::Pin;

use warren_types::api::BackendKind;

use crate::state::Record;

/// How the node reaches an instance's guest agent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Transport {
    /// A unix socket on the host (containers; virtio-vsock or serial sockets for microVMs).
    Unix(PathBuf),
}

impl Transport {
    /// The socket's path.
    pub fn socket(&self) -> &Path {
        match self {
            Transport::Unix(p) => p,
        }
    }
}

/// Kernel counters of an instance's limits, as they stand.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct LimitCounters {
    /// Processes the OOM killer took.
    pub oom_kills: u64,
    /// Forks refused at the process limit.
    pub pids_max: u64,
}

/// A sandbox's network interface as its backend set it up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NetInfo {
    /// Its lease in the node's pools.
    pub index: u32,
    /// Its IPv4 address.
    pub v4: std::net::Ipv4Addr,
    /// Its IPv6 address.
    pub v6: std::net::Ipv6Addr,
    /// Its IPv4 gateway (the node; its DNS resolver).
    pub gateway4: std::net::Ipv4Addr,
    /// Its policy's generation (moves with each change).
    pub generation: u32,
}

/// Leave to carry one stream to an exposed port of an instance ([`Instance::permit_port`]):
/// `stop` fires when the port is unexposed or the instance ends; dropping it frees its place.
pub struct PortPermit {
    /// Fires when the stream must end.
    pub stop: tokio_util::sync::CancellationToken,
    /// What the backend keeps counted while the stream lives.
    pub hold: Box<dyn Send + Sync>,
}

/// Why a stream to a port was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PortRefusal {
    /// The port is not exposed (now).
    NotExposed,
    /// The port or the node carries as many streams as it may; the message says which.
    Full(String),
}

/// A connection attempt of a sandbox that its network policy refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NetDenial {
    /// The sandbox's id (or a warm init's name).
    pub name: String,
    /// Where it was going.
    pub dst: std::net::IpAddr,
    /// `tcp`, `udp`, `icmp`, …
    pub protocol: String,
    /// The destination port (TCP, UDP).
    pub port: Option<u16>,
    /// The name it asked the resolver for, for a refused name (then `dst` is the resolver).
    pub domain: Option<String>,
}

/// The future that resolves when an instance has exited.
pub type Exit = Pin<Box<dyn Future<Output = ()> + Send>>;

/// What a sandbox uses ([`Instance::usage`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Usage {
    /// CPU time its processes used since it started, ns.
    pub cpu_ns: u64,
    /// Memory charged to it, bytes.
    pub memory: u64,
    /// Page cache among `memory`, bytes.
    pub memory_cache: u64,
}

/// One running sandbox as its backend holds it.
pub trait Instance: Send + Sync {
    /// How to reach its guest agent.
    fn transport(&self) -> &Transport;
    /// The identity of its first process (pid and start time), saved in the record so a
    /// restarted daemon can prove it is the same process.
    fn identity(&self) -> (i32, u64);
    /// Starts freezing (or thawing) it, without waiting: a batch starts all, then waits.
    fn begin_freeze(&self, frozen: bool) -> io::Result<()>;
    /// Waits until it is frozen (or thawed).
    fn finish_freeze(&self, frozen: bool) -> io::Result<()>;
    /// Whether a freeze (or thaw) begun is done, looked at once; one not done yet is nudged on
    /// where the kernel needs it. By default it waits ([`Instance::finish_freeze`]).
    fn freeze_done(&self, frozen: bool) -> io::Result<bool> {
        self.finish_freeze(frozen).map(|()| true)
    }
    /// Whether it is frozen now.
    fn is_frozen(&self) -> bool;
    /// Resolves when it has exited (and reaps it where the daemon is its parent).
    fn exited(&self) -> Exit;
    /// Whether it has exited already.
    fn has_exited(&self) -> bool;
    /// Its limit counters.
    fn counters(&self) -> LimitCounters;
    /// Bytes used and the quota of its writable layer, where a quota holds it.
    fn disk_usage(&self) -> Option<(u64, u64)>;
    /// Bytes its processes have read from storage.
    fn read_bytes(&self) -> u64;
    /// What it uses now: CPU time since it started (ns), memory charged to it and the page
    /// cache among it (bytes).
    fn usage(&self) -> Usage;
    /// The directory of its writable layer's changes (an overlay upper directory), for
    /// committing them as an image layer; `None` where the backend has none to offer.
    fn writable_layer(&self) -> Option<PathBuf>;
    /// Whether it was prepared ahead of the request (a warm init).
    fn prepared(&self) -> bool;
    /// Its network interface, if it has one (network mode `filtered`).
    fn network(&self) -> Option<NetInfo>;
    /// Its exposed ports and where the node's host takes connections for each.
    fn exposed(&self) -> Vec<(u16, std::net::SocketAddr)> {
        Vec::new()
    }
    /// Leave to carry one more stream to exposed port `port`, or why not.
    fn permit_port(&self, port: u16) -> Result<PortPermit, PortRefusal> {
        let _ = port;
        Err(PortRefusal::NotExposed)
    }
    /// Gives back what the kernel can of its memory while it is frozen (page cache, and
    /// anonymous memory where the host has swap), its limit `memory_limit` put back after.
    /// Returns the bytes freed. Blocking.
    fn reclaim(&self, memory_limit: u64) -> io::Result<u64> {
        let _ = memory_limit;
        Ok(0)
    }
    /// Memory charged to it now, bytes (one counter read: cheaper than [`Instance::usage`]).
    /// Blocking.
    fn memory_charged(&self) -> u64 {
        0
    }
    /// Asks the kernel to read back what of its processes' memory a reclaim moved to swap
    /// (after a thaw). Returns the bytes of the ranges advised. Blocking.
    fn prefetch(&self) -> io::Result<u64> {
        Ok(0)
    }
    /// Writes its memory limit again (before a thaw: a reclaim a stopped daemon did not
    /// finish may have left it lower). Blocking.
    fn restore_memory_limit(&self, memory_limit: u64) -> io::Result<()> {
        let _ = memory_limit;
        Ok(())
    }
    /// Kills its processes without waiting for them to go ([`Instance::release`] does the
    /// rest). Blocking, but only a few system calls.
    fn kill_now(&self) {}
    /// Kills it and frees everything it holds. Idempotent. Blocking.
    fn release(&self);

    /// Freezes or thaws it and waits. Blocking.
    fn set_frozen(&self, frozen: bool) -> io::Result<()> {
        self.begin_freeze(frozen)?;
        self.finish_freeze(frozen)
    }
}

/// What isolates sandboxes on this node.
pub trait Backend: Send + Sync {
    /// Its kind, as records and the API name it.
    fn kind(&self) -> BackendKind;
    /// How it isolates, for the node's report (the container backend: its cgroup layout).
    fn isolation(&self) -> String;
    /// Starts the instance of a new sandbox in `dir` (which it makes), ready once it answers
    /// on its transport. Blocking. On failure, nothing it acquired is left behind.
    fn start(&self, record: &Record, dir: &Path) -> io::Result<Box<dyn Instance>>;
    /// Takes over the instance of `record` (in `dir`) that a previous daemon started. Blocking.
    fn adopt(&self, record: &Record, dir: &Path) -> Result<Box<dyn Instance>, String>;
    /// Frees what the sandbox named `name` (in `dir`) left behind: one whose record could not
    /// be adopted. Blocking.
    fn discard(&self, name: &str, dir: &Path);
    /// Frees what no sandbox in `live` owns (by name); returns how many things. Blocking.
    fn collect_leftovers(&self, live: &HashSet<String>) -> usize;
    /// Periodic upkeep (every second): for containers, warm inits of images no longer used
    /// are freed. Blocking.
    fn housekeeping(&self);
    /// Stops preparing instances ahead of requests and frees those prepared. Blocking.
    fn shutdown(&self);
    /// Removes the backend's own host state (Warren's parent cgroups), once no sandbox is left.
    fn remove_host_state(&self) -> io::Result<()>;
    /// Removes its network's node-wide state (the firewall table), once no sandbox is left.
    fn remove_network(&self) -> io::Result<()>;
    /// Whether it gives sandboxes network interfaces (mode `filtered`).
    fn has_network(&self) -> bool;
    /// Refuses a policy that allows what this backend never lets a sandbox reach, saying why.
    fn check_network(&self, policy: &warren_types::net::Policy) -> Result<(), String>;
    /// Adds addresses no sandbox may reach from now on (the cluster's members and database,
    /// named by the control plane when the node joins). Blocking.
    fn deny_destinations(&self, _addrs: &[std::net::IpAddr]) -> io::Result<()> {
        Ok(())
    }
    /// Replaces the network policies of instances (by their [`NetInfo::index`]) in one
    /// change, all or none: each takes effect for new connections at once and for open ones
    /// at their next packet. Blocking.
    fn set_networks(&self, updates: &[(u32, &warren_types::net::Policy)]) -> io::Result<()>;
    /// What the kernel supports for QoS (probed at start).
    fn qos_support(&self) -> warren_types::api::QosSupport;
    /// Memory charged to all its sandboxes now, bytes, where it can tell. Blocking.
    fn memory_charged(&self) -> Option<u64>;
    /// The refused connection attempts of its sandboxes, once (the node takes them at start).
    fn take_network_denials(&self) -> Option<tokio::sync::mpsc::Receiver<NetDenial>>;
}

/// How often a batch looks at the freezes (or thaws) still in progress.
const FREEZE_POLL: std::time::Duration = std::time::Duration::from_micros(200);
/// How long a freeze (or thaw) may take.
pub const FREEZE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// Freezes (or thaws) every instance of a batch: all begin first, then all are looked at in
/// rounds until each is done or `until` passes, so the kernel freezes them in parallel and a
/// sandbox slow to freeze holds up no other's check. Each answer is `Ok(true)` when done,
/// `Ok(false)` when begun but not done by `until`. Blocking.
pub fn freeze_batch(
    batch: &[&dyn Instance],
    frozen: bool,
    until: std::time::Instant,
) -> Vec<io::Result<bool>> {
    let mut out: Vec<Option<io::Result<bool>>> = batch
        .iter()
        .map(|i| i.begin_freeze(frozen).err().map(Err))
        .collect();
    loop {
        let mut waiting = false;
        for (i, slot) in batch.iter().zip(out.iter_mut()) {
            if slot.is_some() {
                continue;
            }
            // A round over many on a loaded host takes a while: the deadline holds within it.
            if std::time::Instant::now() > until {
                waiting = true;
                break;
            }
            match i.freeze_done(frozen) {
                Ok(true) => *slot = Some(Ok(true)),
                Ok(false) => waiting = true,
                Err(e) => *slot = Some(Err(e)),
            }
        }
        if !waiting || std::time::Instant::now() > until {
            break;
        }
        std::thread::sleep(FREEZE_POLL);
    }
    out.into_iter().map(|r| r.unwrap_or(Ok(false))).collect()
}
