//! What this node can hold, and how loaded it is.
//!
//! - At start: `kernel.pid_max` raised where the node is allowed to (each idle sandbox holds
//!   two processes; the kernel's default of 32768 stops a node near 16,000 sandboxes), the
//!   daemon's own open-file limit raised, and `max_sandboxes` derived from what the host has —
//!   memory, pids, open files — rather than fixed.
//! - Every second: the host's CPU use and pressure stall information (PSI) sampled into a
//!   [`Measured`], which admission and the node's report read without touching a file.

use std::io;
use std::sync::Mutex;

use warren_types::api::Pressure;

use crate::config::NodeConfig;

/// Host memory an idle sandbox holds, bytes: its two processes' private pages, its kernel
/// objects and the daemon's bookkeeping. `warren-bench density` measured 1.24–1.48 MiB on
/// the development VM (kernel 6.18), of which ~1.06 MiB is its network namespace's
/// unreclaimable slab alone (695 kmalloc-1k objects per namespace).
pub const IDLE_SANDBOX_MEMORY: u64 = 3 << 19;
/// Processes (pids) an idle sandbox holds: its init and the spawner.
pub const IDLE_SANDBOX_PIDS: u32 = 2;
/// Descriptors the daemon holds per idle sandbox: its init's pidfd (the incident stream and
/// calls in flight hold more while it is in use: the reserve below covers them).
pub const DAEMON_FDS_PER_SANDBOX: u64 = 1;
/// Descriptors the daemon keeps for everything else: API connections, sandboxes in use, the
/// DNS proxy's sockets.
const DAEMON_FDS_RESERVED: u64 = 4096;

/// The derived limit on sandboxes, and which resource sets it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Derived {
    /// Most sandboxes this node admits.
    pub max_sandboxes: u32,
    /// What binds: `memory`, `pids`, `open files` or `configured`.
    pub bound_by: &'static str,
}

/// Derives `max_sandboxes` from the host: memory (total less the node's reserve, at
/// [`IDLE_SANDBOX_MEMORY`] each), pids (`pid_max` less headroom, at [`IDLE_SANDBOX_PIDS`]
/// each) and the daemon's open files; a configured value caps it.
pub fn derive_max_sandboxes(
    cfg: &NodeConfig,
    mem_total: u64,
    pid_max: u32,
    open_files: u64,
) -> Derived {
    let by_memory = mem_total.saturating_sub(cfg.min_free_memory.bytes()) / IDLE_SANDBOX_MEMORY;
    let by_pids = u64::from(pid_max.saturating_sub(cfg.pid_headroom) / IDLE_SANDBOX_PIDS);
    let by_files = open_files.saturating_sub(DAEMON_FDS_RESERVED) / DAEMON_FDS_PER_SANDBOX;
    let mut best = (by_memory, "memory");
    for c in [(by_pids, "pids"), (by_files, "open files")] {
        if c.0 < best.0 {
            best = c;
        }
    }
    if let Some(m) = cfg.max_sandboxes
        && u64::from(m) < best.0
    {
        best = (u64::from(m), "configured");
    }
    Derived {
        max_sandboxes: best.0.min(u64::from(u32::MAX)) as u32,
        bound_by: best.1,
    }
}

/// Raises `kernel.pid_max` to `cfg.pid_max` when it is lower and the node may. Returns the
/// value in force.
pub fn raise_pid_max(cfg: &NodeConfig) -> io::Result<u32> {
    let path = "/proc/sys/kernel/pid_max";
    let now: u32 = std::fs::read_to_string(path)?
        .trim()
        .parse()
        .map_err(|_| io::Error::other("unexpected kernel.pid_max"))?;
    if !cfg.raise_pid_max || now >= cfg.pid_max {
        return Ok(now);
    }
    match std::fs::write(path, cfg.pid_max.to_string()) {
        Ok(()) => {
            tracing::info!(
                from = now,
                to = cfg.pid_max,
                "raised kernel.pid_max (set raise_pid_max = false to leave it alone)"
            );
            Ok(cfg.pid_max)
        }
        Err(e) => {
            tracing::warn!(
                "could not raise kernel.pid_max from {now} to {} ({e}): this node holds at most \
                 about {} idle sandboxes",
                cfg.pid_max,
                now / IDLE_SANDBOX_PIDS
            );
            Ok(now)
        }
    }
}

/// Raises the daemon's open-file limit to the kernel's most (`fs.nr_open`, at most 1Mi) where
/// it is lower; returns the soft limit in force.
pub fn raise_open_files() -> u64 {
    use rustix::process::{Resource, Rlimit, getrlimit, setrlimit};
    let want: u64 = std::fs::read_to_string("/proc/sys/fs/nr_open")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(65_536)
        .min(1 << 20);
    let now = getrlimit(Resource::Nofile);
    let current = now.current.unwrap_or(u64::MAX);
    if current >= want {
        return current;
    }
    let max = now.maximum.map_or(want, |m| m.max(want));
    let raise = |soft: u64, hard: Option<u64>| {
        setrlimit(
            Resource::Nofile,
            Rlimit {
                current: Some(soft),
                maximum: hard,
            },
        )
    };
    if raise(want, Some(max)).is_ok() {
        return want;
    }
    // Raising the hard limit needs CAP_SYS_RESOURCE: without it, the soft limit up to the
    // hard one.
    let hard = now.maximum.unwrap_or(want).min(want);
    match raise(hard, now.maximum) {
        Ok(()) => {
            tracing::warn!(
                "the daemon's open-file limit is {hard} (its hard limit; raising it needs \
                 CAP_SYS_RESOURCE or a higher LimitNOFILE): it bounds max_sandboxes"
            );
            hard
        }
        Err(e) => {
            tracing::warn!("could not raise the daemon's open-file limit to {hard}: {e}");
            current
        }
    }
}

/// Load measured on the host, refreshed every second by [`Sampler::sample`].
#[derive(Debug, Clone, Copy, Default)]
pub struct Measured {
    /// CPU use of all cores between the last two samples, percent.
    pub cpu_used_pct: f64,
    /// PSI `some avg10`, where the kernel has it.
    pub pressure: Option<Pressure>,
    /// Memory charged to sandboxes (Warren's parent cgroup), bytes.
    pub memory_used: Option<u64>,
}

/// Samples the host's load.
#[derive(Debug, Default)]
pub struct Sampler {
    last_cpu: Mutex<Option<(u64, u64)>>,
    now: Mutex<Measured>,
}

impl Sampler {
    /// The latest sample.
    pub fn get(&self) -> Measured {
        *self.now.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Takes a sample (`memory_used` from the backend). Blocking (a few /proc files).
    pub fn sample(&self, memory_used: Option<u64>) {
        let cpu = read_cpu_times();
        let mut pct = self.get().cpu_used_pct;
        if let Some((busy, total)) = cpu {
            let mut last = self.last_cpu.lock().unwrap_or_else(|p| p.into_inner());
            if let Some((b0, t0)) = *last
                && total > t0
            {
                pct = (busy.saturating_sub(b0)) as f64 * 100.0 / (total - t0) as f64;
            }
            *last = Some((busy, total));
        }
        let m = Measured {
            cpu_used_pct: pct,
            pressure: read_pressure(),
            memory_used,
        };
        *self.now.lock().unwrap_or_else(|p| p.into_inner()) = m;
    }
}

/// Busy and total jiffies of all CPUs (`/proc/stat`'s first line).
fn read_cpu_times() -> Option<(u64, u64)> {
    let stat = std::fs::read_to_string("/proc/stat").ok()?;
    let line = stat.lines().next()?.strip_prefix("cpu ")?;
    let v: Vec<u64> = line
        .split_whitespace()
        .filter_map(|f| f.parse().ok())
        .collect();
    if v.len() < 5 {
        return None;
    }
    // user nice system idle iowait irq softirq steal (guest time is within user).
    let total: u64 = v.iter().take(8).sum();
    let idle = v[3] + v[4];
    Some((total - idle, total))
}

/// PSI `some avg10` of cpu, memory and io, where `/proc/pressure` is readable.
pub fn read_pressure() -> Option<Pressure> {
    let one = |name: &str| -> Option<f64> {
        let s = std::fs::read_to_string(format!("/proc/pressure/{name}")).ok()?;
        parse_some_avg10(&s)
    };
    Some(Pressure {
        cpu: one("cpu")?,
        memory: one("memory")?,
        io: one("io")?,
    })
}

/// `some avg10=1.23 avg60=... total=...` → 1.23.
fn parse_some_avg10(s: &str) -> Option<f64> {
    let line = s.lines().find(|l| l.starts_with("some "))?;
    line.split_whitespace()
        .find_map(|f| f.strip_prefix("avg10="))
        .and_then(|v| v.parse().ok())
}

/// SMT's state (`/sys/devices/system/cpu/smt/control`), or `unknown`.
pub fn smt_state() -> String {
    std::fs::read_to_string("/sys/devices/system/cpu/smt/control")
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| "unknown".into())
}

/// Swap the host has, bytes (`SwapTotal`).
pub fn swap_total() -> u64 {
    std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| {
            m.lines()
                .find(|l| l.starts_with("SwapTotal:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|kb| kb.parse::<u64>().ok())
        })
        .map_or(0, |kb| kb * 1024)
}

/// The start slots of creates: at most `max_concurrent_creates` start at once; up to
/// `create_queue` more wait, in arrival order, each at most `create_queue_timeout`; past
/// either, a create is refused with a retry hint (429) instead of hanging. The gate keeps what
/// the node's report shows of it ([`Gate::stats`]): creates starting and waiting, and the
/// longest wait of the last minute.
pub struct Gate {
    slots: std::sync::Arc<tokio::sync::Semaphore>,
    waiting: std::sync::atomic::AtomicU32,
    queue: u32,
    timeout: std::time::Duration,
    concurrent: u32,
    waits: Mutex<Waits>,
    /// When a long wait was last worth an event, ms since `waits.started` (+1; 0: never).
    last_event: std::sync::atomic::AtomicU64,
}

/// A wait for a start slot this long is worth a `create_queued` event.
pub const LONG_WAIT: std::time::Duration = std::time::Duration::from_secs(5);
/// The least time between two `create_queued` events of a node.
const LONG_WAIT_EVERY: std::time::Duration = std::time::Duration::from_secs(10);

/// A start slot, held while the create starts, and how long the create waited for it.
pub struct Slot {
    _permit: Option<tokio::sync::OwnedSemaphorePermit>,
    /// How long the create waited.
    pub waited: std::time::Duration,
}

/// The gate's creates and waits, as its report shows them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct GateStats {
    /// Creates holding a start slot now.
    pub starting: u32,
    /// Creates waiting for one now.
    pub waiting: u32,
    /// Start slots (`max_concurrent_creates`).
    pub slots: u32,
    /// The longest a create waited over the last minute, those still waiting included, ms.
    pub longest_wait_ms: u64,
}

/// Seconds of waits the gate remembers.
const WAIT_WINDOW: u64 = 60;

/// When the creates waiting now began, and the longest wait that ended in each of the last
/// [`WAIT_WINDOW`] seconds: bounded by the queue and the window.
struct Waits {
    started: std::time::Instant,
    next: u64,
    now: std::collections::BTreeMap<u64, std::time::Instant>,
    /// By second since `started` modulo the window: (that second, its longest wait in ms).
    ended: [(u64, u64); WAIT_WINDOW as usize],
}

impl Waits {
    fn second(&self, at: std::time::Instant) -> u64 {
        at.duration_since(self.started).as_secs()
    }

    fn end(&mut self, ticket: u64, waited: std::time::Duration) {
        self.now.remove(&ticket);
        let sec = self.second(std::time::Instant::now());
        let ms = waited.as_millis() as u64;
        let cell = &mut self.ended[(sec % WAIT_WINDOW) as usize];
        if cell.0 != sec {
            *cell = (sec, 0);
        }
        cell.1 = cell.1.max(ms);
    }

    fn longest_ms(&self) -> u64 {
        let now = std::time::Instant::now();
        let sec = self.second(now);
        let ended = self
            .ended
            .iter()
            .filter(|(s, _)| sec.saturating_sub(*s) < WAIT_WINDOW)
            .map(|(_, ms)| *ms)
            .max()
            .unwrap_or(0);
        // The oldest still waiting, as long as it has waited so far.
        let waiting = self
            .now
            .values()
            .next()
            .map_or(0, |t| now.duration_since(*t).as_millis() as u64);
        ended.max(waiting)
    }
}

/// A create waiting while alive: counted, and its wait remembered when it ends.
struct Waiting<'a> {
    gate: &'a Gate,
    ticket: u64,
    since: std::time::Instant,
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.gate
            .waiting
            .fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
        self.gate
            .waits
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .end(self.ticket, self.since.elapsed());
    }
}

impl Gate {
    /// The gate `cfg` asks for.
    pub fn new(cfg: &crate::config::NodeConfig) -> Gate {
        let cores = std::thread::available_parallelism()
            .map(|n| n.get() as u32)
            .unwrap_or(1);
        let concurrent = cfg.max_concurrent_creates.unwrap_or(4 * cores).max(1);
        Gate {
            slots: std::sync::Arc::new(tokio::sync::Semaphore::new(concurrent as usize)),
            waiting: Default::default(),
            queue: cfg.create_queue,
            timeout: std::time::Duration::from_secs(cfg.create_queue_timeout.max(1)),
            concurrent,
            waits: Mutex::new(Waits {
                started: std::time::Instant::now(),
                next: 0,
                now: Default::default(),
                ended: [(u64::MAX, 0); WAIT_WINDOW as usize],
            }),
            last_event: Default::default(),
        }
    }

    /// Whether a create that waited `waited` is worth a `create_queued` event: it waited at
    /// least [`LONG_WAIT`], and the node's last such event is [`LONG_WAIT_EVERY`] old.
    pub fn worth_an_event(&self, waited: std::time::Duration) -> bool {
        use std::sync::atomic::Ordering;
        if waited < LONG_WAIT {
            return false;
        }
        let started = self.waits.lock().unwrap_or_else(|p| p.into_inner()).started;
        let now = started.elapsed().as_millis() as u64 + 1;
        let last = self.last_event.load(Ordering::Relaxed);
        (last == 0 || now.saturating_sub(last) >= LONG_WAIT_EVERY.as_millis() as u64)
            && self
                .last_event
                .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
    }

    /// No slot: for a function-call worker, which must not wait behind the creates queued
    /// here (a reward call would wait for a rollout's creates). Its pool starts at most
    /// `workers::MAX_STARTING` at once, so these are bounded too.
    pub fn bypass(&self) -> Slot {
        Slot {
            _permit: None,
            waited: std::time::Duration::ZERO,
        }
    }

    /// Creates waiting for a slot now.
    pub fn waiting(&self) -> u32 {
        self.waiting.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Creates starting and waiting now, and the longest wait of the last minute.
    pub fn stats(&self) -> GateStats {
        let starting = (self.concurrent as usize).saturating_sub(self.slots.available_permits());
        GateStats {
            starting: starting as u32,
            waiting: self.waiting(),
            slots: self.concurrent,
            longest_wait_ms: self
                .waits
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .longest_ms(),
        }
    }

    /// Waits for a start slot, or says why not.
    pub async fn enter(&self) -> Result<Slot, crate::error::NodeError> {
        use std::sync::atomic::Ordering;
        if let Ok(p) = self.slots.clone().try_acquire_owned() {
            return Ok(Slot {
                _permit: Some(p),
                waited: std::time::Duration::ZERO,
            });
        }
        if self.waiting.fetch_add(1, Ordering::Relaxed) >= self.queue {
            self.waiting.fetch_sub(1, Ordering::Relaxed);
            return Err(crate::error::NodeError::Capacity {
                message: format!(
                    "this node is starting {} sandboxes and {} more wait (its create_queue); \
                     retry shortly",
                    self.concurrent, self.queue
                ),
                retry_after: 1,
            });
        }
        let since = std::time::Instant::now();
        let ticket = {
            let mut w = self.waits.lock().unwrap_or_else(|p| p.into_inner());
            w.next += 1;
            let t = w.next;
            w.now.insert(t, since);
            t
        };
        let _waiting = Waiting {
            gate: self,
            ticket,
            since,
        };
        match tokio::time::timeout(self.timeout, self.slots.clone().acquire_owned()).await {
            Ok(Ok(p)) => Ok(Slot {
                _permit: Some(p),
                waited: since.elapsed(),
            }),
            Ok(Err(_)) => Err(crate::error::NodeError::host(
                "waiting for a start slot",
                std::io::Error::other("the create gate closed"),
            )),
            Err(_) => Err(crate::error::NodeError::Capacity {
                message: format!(
                    "this create waited {} s for one of the node's {} start slots \
                     (create_queue_timeout); the node is overloaded: retry later or elsewhere",
                    self.timeout.as_secs(),
                    self.concurrent
                ),
                retry_after: 2,
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use warren_types::ByteSize;

    #[test]
    fn the_scarcest_resource_sets_max_sandboxes() {
        let cfg = NodeConfig {
            min_free_memory: ByteSize(256 << 20),
            pid_headroom: 512,
            ..NodeConfig::default()
        };
        // 24 GiB, pid_max 32768, plenty of files: pids bind (16,128 < 16,213 by memory).
        let d = derive_max_sandboxes(&cfg, 24 << 30, 32768, 1 << 20);
        assert_eq!(d.bound_by, "pids");
        assert_eq!(d.max_sandboxes, (32768 - 512) / 2);
        // pid_max raised: memory binds (1.5 MiB each).
        let d = derive_max_sandboxes(&cfg, 24 << 30, 4_194_304, 1 << 20);
        assert_eq!(d.bound_by, "memory");
        assert_eq!(
            d.max_sandboxes,
            (((24u64 << 30) - (256 << 20)) / (3 << 19)) as u32
        );
        // A daemon held to 20,000 descriptors (a hard limit it may not raise).
        let d = derive_max_sandboxes(&cfg, 24 << 30, 4_194_304, 20_000);
        assert_eq!(d.bound_by, "open files");
        assert_eq!(d.max_sandboxes, 20_000 - 4096);
        // A configured value caps it.
        let cfg = NodeConfig {
            max_sandboxes: Some(100),
            ..cfg
        };
        let d = derive_max_sandboxes(&cfg, 24 << 30, 4_194_304, 1 << 20);
        assert_eq!((d.max_sandboxes, d.bound_by), (100, "configured"));
    }

    #[tokio::test]
    async fn the_gate_reports_creates_starting_waiting_and_the_longest_wait() {
        let cfg = NodeConfig {
            max_concurrent_creates: Some(1),
            create_queue: 4,
            ..NodeConfig::default()
        };
        let gate = std::sync::Arc::new(Gate::new(&cfg));
        assert_eq!(
            gate.stats(),
            GateStats {
                starting: 0,
                waiting: 0,
                slots: 1,
                longest_wait_ms: 0
            }
        );
        let first = gate.enter().await.unwrap();
        assert_eq!(first.waited, std::time::Duration::ZERO);
        let g = gate.clone();
        let second = tokio::spawn(async move { g.enter().await.map(|s| s.waited) });
        while gate.stats().waiting == 0 {
            tokio::task::yield_now().await;
        }
        std::thread::sleep(std::time::Duration::from_millis(30));
        let s = gate.stats();
        assert_eq!((s.starting, s.waiting), (1, 1));
        assert!(s.longest_wait_ms >= 30, "one still waiting counts: {s:?}");
        drop(first);
        let waited = second.await.unwrap().unwrap();
        assert!(waited >= std::time::Duration::from_millis(30));
        let s = gate.stats();
        assert_eq!((s.starting, s.waiting), (0, 0));
        assert!(
            s.longest_wait_ms >= 30,
            "the ended wait is remembered: {s:?}"
        );
        // Long waits are worth an event, at most one every 10 s.
        assert!(!gate.worth_an_event(LONG_WAIT / 2));
        assert!(gate.worth_an_event(LONG_WAIT));
        assert!(!gate.worth_an_event(LONG_WAIT * 2), "rate-limited");
    }

    #[test]
    fn psi_lines_parse() {
        let s = "some avg10=12.50 avg60=3.00 avg300=1.00 total=123\n\
                 full avg10=1.00 avg60=0.00 avg300=0.00 total=5\n";
        assert_eq!(parse_some_avg10(s), Some(12.5));
        assert_eq!(parse_some_avg10("garbage"), None);
    }

    #[test]
    fn the_host_is_sampled() {
        let s = Sampler::default();
        s.sample(Some(5));
        std::thread::sleep(std::time::Duration::from_millis(50));
        s.sample(Some(7));
        let m = s.get();
        assert_eq!(m.memory_used, Some(7));
        assert!((0.0..=100.0).contains(&m.cpu_used_pct), "{m:?}");
        // Where the kernel has PSI, it is read.
        if std::path::Path::new("/proc/pressure/memory").exists() {
            assert!(m.pressure.is_some());
        }
    }
}
