//! What a container sandbox holds, and its one release.
//!
//! [`Held`] records each resource the moment it is acquired — the sandbox directory (and the
//! disk-pool volume of its writable layer), the cgroup, the control socket, the init's pidfd,
//! references on image layers — and frees exactly those, in the one order that works (kill,
//! thaw so the kill lands, reap, cgroup, socket, volume, directory, layers). It is the only
//! cleanup code of the backend: a failed start and a discarded warm init drop an armed `Held`;
//! a kill, a timeout and the node's collection of a dead sandbox call [`Instance::release`];
//! the collection of leftovers builds one from names and releases it.
//!
//! A running sandbox's `Held` is disarmed: dropping it (the daemon stopping) leaves the
//! sandbox running for the next daemon to adopt.

use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use super::Host;
use super::cgroups::SandboxCgroup;
use crate::backend::{Exit, Instance, LimitCounters, NetInfo, Transport};
use crate::disk::Volume;
use crate::layers::Holder;
use warren_net::link::Lease;

/// Resources acquired so far, freed together.
pub(crate) struct Held {
    host: Arc<Host>,
    /// Freed on drop (a start or warm init that did not finish).
    armed: bool,
    pub(crate) dir: Option<PathBuf>,
    pub(crate) cgroup: Option<SandboxCgroup>,
    pub(crate) socket: Option<PathBuf>,
    /// The init's pidfd, shared with the instance's exit watcher (one descriptor per sandbox).
    pub(crate) process: Option<Arc<OwnedFd>>,
    /// Layer digests it holds a reference on, and as whom.
    pub(crate) layers: Vec<String>,
    pub(crate) layers_for: Holder,
    /// Its network interface and firewall elements.
    pub(crate) net: Option<Lease>,
    /// The network namespace a new init is to join (its slot's, or a loopback-only one),
    /// until it has joined: then let go (the init holds it), so an idle sandbox costs the
    /// node no descriptor for it.
    pub(crate) netns: Option<OwnedFd>,
    /// The init that joined `netns` and the namespace's identity (device and inode): at
    /// release the namespace is found again through the init, before it is killed, and
    /// recycled only if it is still the same one. None for an adopted sandbox.
    pub(crate) joined: Option<(i32, (u64, u64))>,
}

impl Held {
    /// Nothing held yet; freed on drop until disarmed.
    pub(crate) fn new(host: &Arc<Host>) -> Held {
        Held {
            host: host.clone(),
            armed: true,
            dir: None,
            cgroup: None,
            socket: None,
            process: None,
            layers: Vec::new(),
            layers_for: Holder::Sandbox,
            net: None,
            netns: None,
            joined: None,
        }
    }

    /// Everything a sandbox named `name` (directory `dir`) may have left, for the collection
    /// of a sandbox that could not be adopted.
    pub(crate) fn leftovers_of(host: &Arc<Host>, name: &str, dir: &Path) -> Held {
        let mut h = Held::new(host);
        h.dir = Some(dir.to_path_buf());
        h.cgroup = Some(host.cgroups.sandbox(name));
        h.socket = Some(host.socket_of(name));
        h
    }

    /// Kills its processes without waiting for them to go: its network namespace found again
    /// first (the init holds the only reference), then SIGKILL to the init through its pidfd
    /// (its pid namespace dies with it), and a frozen cgroup thawed so the kill lands. Blocking
    /// (a few system calls); [`Held::release`] does the rest, and begins with this.
    pub(crate) fn kill(&mut self) {
        if self.netns.is_none()
            && let Some((pid, id)) = self.joined.take()
            && let Some(fd) = &self.process
        {
            self.netns = netns_of(fd, pid, id);
        }
        if let Some(fd) = &self.process {
            let _ = warren_sys::process::pidfd_kill(fd);
        }
        // A frozen process cannot die; thaw so the kill lands.
        if let Some(cg) = &self.cgroup
            && cg.exists()
            && cg.is_frozen()
        {
            let _ = cg.set_frozen(false);
        }
    }

    /// Frees everything held, once. Blocking. Every step tolerates a resource already gone.
    pub(crate) fn release(&mut self) {
        self.kill();
        let process = self.process.take();
        // Whether every process of the sandbox is known to be gone (its init reaped, its
        // cgroup removed): only then may its network namespace serve another sandbox.
        let mut emptied = process.is_some();
        if let Some(cg) = self.cgroup.take() {
            if let Some(fd) = &process {
                emptied &= warren_sys::process::pidfd_wait(fd, Duration::from_secs(1));
                warren_sys::process::pidfd_reap(fd);
            } else if cg.exists() {
                // No process of ours to wait for (a leftover): end whatever is inside.
                cg.kill_all();
            }
            if cg.exists() && cg.remove(Duration::from_secs(2)).is_err() {
                // Something outlived its init (it should not: the pid namespace died with it).
                emptied = false;
                cg.kill_all();
                if let Err(e) = cg.remove(Duration::from_secs(5)) {
                    tracing::error!("cgroup left behind: {e}");
                }
            }
        } else if let Some(fd) = &process {
            emptied &= warren_sys::process::pidfd_wait(fd, Duration::from_secs(1));
            warren_sys::process::pidfd_reap(fd);
        }
        // The slot is recycled when the namespace is known to be empty, destroyed otherwise.
        let netns = self.netns.take().filter(|_| emptied);
        match (self.net.take(), &self.host.net) {
            (Some(lease), Some(net)) => net.release(lease, netns),
            (None, _) => {
                if let Some(ns) = netns {
                    self.host.give_back_loopback(ns);
                }
            }
            (Some(_), None) => {}
        }
        if let Some(socket) = self.socket.take() {
            let _ = std::fs::remove_file(socket);
        }
        if let Some(dir) = self.dir.take() {
            // The writable layer's volume, contents and all, in one call.
            if let Some(pool) = &self.host.disk {
                pool.release(&dir);
            }
            self.host.trash(&dir);
        }
        let layers = std::mem::take(&mut self.layers);
        if !layers.is_empty() {
            self.host.layers.release_for(&layers, self.layers_for);
        }
    }

    /// Keeps everything when dropped: the resources now belong to a running sandbox (whose
    /// layer references count as a sandbox's from now on).
    pub(crate) fn disarm(&mut self) {
        self.armed = false;
        if self.layers_for == Holder::Warm {
            self.host.layers.warm_to_sandbox(&self.layers);
            self.layers_for = Holder::Sandbox;
        }
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        if self.armed {
            self.release();
        }
    }
}

/// The device and inode of a namespace descriptor.
pub(crate) fn ns_identity(fd: &OwnedFd) -> Option<(u64, u64)> {
    let st = rustix::fs::fstat(fd).ok()?;
    Some((st.st_dev as u64, st.st_ino as u64))
}

/// The network namespace of the live process `pid` (whose pidfd is `process`), if it is still
/// the namespace `id` (a sandbox's init cannot change its own: it has no capability left;
/// checked anyway, so no other namespace is ever recycled as a sandbox's). Opened through
/// `/proc/<pid>/ns/net`, a kernel link, only while the process is known alive before and
/// after: then the pid named it throughout (a pid is reused only once its process is
/// reaped). A process that has exited gives `None`: its namespace went with it.
fn netns_of(process: &OwnedFd, pid: i32, id: (u64, u64)) -> Option<OwnedFd> {
    if warren_sys::process::pidfd_exited(process) {
        return None;
    }
    let f = std::fs::File::open(format!("/proc/{pid}/ns/net")).ok()?;
    if warren_sys::process::pidfd_exited(process) {
        return None;
    }
    let fd = OwnedFd::from(f);
    (ns_identity(&fd) == Some(id)).then_some(fd)
}

/// A running container sandbox.
pub(crate) struct ContainerInstance {
    transport: Transport,
    pid: i32,
    start_time: u64,
    cgroup: SandboxCgroup,
    /// The init's pidfd (the one `held` has), to watch it without the lock.
    watch: Arc<OwnedFd>,
    dir: PathBuf,
    host: Arc<Host>,
    /// Its writable layer's volume in the disk pool (looked up once).
    volume: OnceLock<Option<Volume>>,
    /// Whether it was a warm init.
    warm: bool,
    /// Its network interface's lease.
    /// Its lease while it holds one (cleared by `release`: the lease may go to another).
    net: Mutex<Option<Lease>>,
    held: Mutex<Held>,
}

impl ContainerInstance {
    /// A running sandbox around what `held` holds (a started or adopted init).
    pub(crate) fn new(
        mut held: Held,
        pid: i32,
        start_time: u64,
        warm: bool,
    ) -> std::io::Result<ContainerInstance> {
        let missing = |what: &str| std::io::Error::other(format!("the instance has no {what}"));
        let watch = held.process.clone().ok_or_else(|| missing("process"))?;
        let cgroup = held.cgroup.clone().ok_or_else(|| missing("cgroup"))?;
        let socket = held.socket.clone().ok_or_else(|| missing("socket"))?;
        let dir = held.dir.clone().ok_or_else(|| missing("directory"))?;
        held.disarm();
        let net = Mutex::new(held.net);
        Ok(ContainerInstance {
            net,
            transport: Transport::Unix(socket),
            pid,
            start_time,
            cgroup,
            watch,
            dir,
            host: held.host.clone(),
            volume: OnceLock::new(),
            warm,
            held: Mutex::new(held),
        })
    }
}

impl Instance for ContainerInstance {
    fn transport(&self) -> &Transport {
        &self.transport
    }

    fn identity(&self) -> (i32, u64) {
        (self.pid, self.start_time)
    }

    fn begin_freeze(&self, frozen: bool) -> std::io::Result<()> {
        self.cgroup.start_freeze(frozen)
    }

    fn finish_freeze(&self, frozen: bool) -> std::io::Result<()> {
        self.cgroup.wait_frozen(frozen)
    }

    fn freeze_done(&self, frozen: bool) -> std::io::Result<bool> {
        self.cgroup.freeze_settled(frozen)
    }

    fn is_frozen(&self) -> bool {
        self.cgroup.is_frozen()
    }

    fn exited(&self) -> Exit {
        let fd = self.watch.clone();
        Box::pin(async move {
            if warren_sys::process::exited(fd.clone()).await.is_err() {
                // Not watchable on the reactor (it never should be): asked every second.
                while !warren_sys::process::pidfd_exited(&*fd) {
                    tokio::time::sleep(std::time::Duration::from_secs(1)).await;
                }
            }
            // Reap it if it is our child (a no-op for adopted sandboxes).
            warren_sys::process::pidfd_reap(&*fd);
        })
    }

    fn has_exited(&self) -> bool {
        warren_sys::process::pidfd_exited(&*self.watch)
    }

    fn counters(&self) -> LimitCounters {
        let (oom_kills, pids_max) = self.cgroup.limit_counters();
        LimitCounters {
            oom_kills,
            pids_max,
        }
    }

    fn disk_usage(&self) -> Option<(u64, u64)> {
        let pool = self.host.disk.as_ref()?;
        let v = self
            .volume
            .get_or_init(|| pool.volume_of(&self.dir))
            .as_ref()?;
        pool.usage(v)
    }

    fn read_bytes(&self) -> u64 {
        self.cgroup.pids().into_iter().map(proc_read_bytes).sum()
    }

    fn reclaim(&self, memory_limit: u64) -> std::io::Result<u64> {
        if !self.cgroup.is_frozen() {
            return Err(std::io::Error::other(
                "reclaim of a sandbox that is not frozen",
            ));
        }
        self.cgroup.reclaim(memory_limit)
    }

    fn memory_charged(&self) -> u64 {
        self.cgroup.memory_usage()
    }

    fn prefetch(&self) -> std::io::Result<u64> {
        if self.cgroup.is_frozen() {
            return Ok(0);
        }
        let mut advised = 0;
        // The pids are read from the cgroup the node made; one that exits (or whose number
        // is reused) meanwhile is skipped or advised harmlessly: the advice reads, never
        // writes, and goes through a pidfd to the process the mappings were read from.
        for pid in self.cgroup.pids() {
            advised += warren_sys::process::prefetch_swapped(pid)?;
        }
        Ok(advised)
    }

    fn restore_memory_limit(&self, memory_limit: u64) -> std::io::Result<()> {
        self.cgroup.restore_memory_limit(memory_limit)
    }

    fn usage(&self) -> crate::backend::Usage {
        // v1's cpu hierarchy counts no usage: the processes' own times, each with what its
        // reaped children used (the guest, PID 1, reaps every orphan, so the time of every
        // process that ended is in a live process's children's times).
        let cpu_ns = self.cgroup.cpu_usage_ns().unwrap_or_else(|| {
            self.cgroup
                .pids()
                .into_iter()
                .filter_map(warren_sys::process::cpu_time_ns)
                .sum()
        });
        crate::backend::Usage {
            cpu_ns,
            memory: self.cgroup.memory_usage(),
            memory_cache: self.cgroup.memory_cache(),
        }
    }

    fn writable_layer(&self) -> Option<PathBuf> {
        Some(self.dir.join("upper"))
    }

    fn prepared(&self) -> bool {
        self.warm
    }

    fn network(&self) -> Option<NetInfo> {
        let lease = self.lease()?;
        let net = self.host.net.as_ref()?;
        Some(NetInfo {
            index: lease.index,
            v4: lease.v4,
            v6: lease.v6,
            gateway4: net.addressing().gateway4(),
            generation: net.generation(lease.index).unwrap_or(0),
        })
    }

    fn permit_port(
        &self,
        port: u16,
    ) -> Result<crate::backend::PortPermit, crate::backend::PortRefusal> {
        let (Some(lease), Some(net)) = (self.lease(), self.host.net.as_ref()) else {
            return Err(crate::backend::PortRefusal::NotExposed);
        };
        let p = net.permit(lease.index, port)?;
        Ok(crate::backend::PortPermit {
            stop: p.stop.clone(),
            hold: Box::new(p),
        })
    }

    fn exposed(&self) -> Vec<(u16, std::net::SocketAddr)> {
        match (self.lease(), self.host.net.as_ref()) {
            (Some(lease), Some(net)) => net.exposed(lease.index),
            _ => Vec::new(),
        }
    }

    fn kill_now(&self) {
        self.held.lock().unwrap_or_else(|p| p.into_inner()).kill();
    }

    fn release(&self) {
        *self.net.lock().unwrap_or_else(|p| p.into_inner()) = None;
        self.held
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .release();
    }
}

impl ContainerInstance {
    /// Its lease, while it holds one.
    fn lease(&self) -> Option<Lease> {
        *self.net.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// `read_bytes` of a process's I/O accounting: storage reads it caused, its reaped children's
/// included.
fn proc_read_bytes(pid: i32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/io"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("read_bytes: "))
                .and_then(|v| v.trim().parse().ok())
        })
        .unwrap_or(0)
}
