//! The node: its sandboxes and their lifecycle (get, list, pause, resume, kill).
//!
//! Creation is in [`crate::create`], re-adoption after a restart in [`crate::adopt`], guest
//! operations in [`crate::exec`] and [`crate::files`].

use std::collections::{BTreeMap, HashMap};
use std::os::fd::OwnedFd;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use tokio::task::AbortHandle;
use warren_types::ByteSize;
use warren_types::api::{BackendKind, NodeInfo, Sandbox as SandboxView, SandboxState};
use warren_types::id::{NodeId, SandboxId};

use crate::admission::{Admission, HostLoad};
use crate::cgroups::{Cgroups, SandboxCgroup};
use crate::config::NodeConfig;
use crate::error::NodeError;
use crate::images::Images;
use crate::state::{self, Record};

/// Where things live under the state directory.
#[derive(Debug, Clone)]
pub struct Dirs {
    pub sandboxes: PathBuf,
    pub sockets: PathBuf,
    pub images: PathBuf,
    pub trash: PathBuf,
    /// Logs of warm inits (moved into the sandbox directory when one is taken).
    pub warm: PathBuf,
    /// The disk pool that holds writable layers under quota, when the node has one.
    pub disk: Option<Arc<crate::disk::DiskPool>>,
}

/// One node daemon's state.
pub struct Node {
    /// This node's id (the first six characters of its sandboxes' ids).
    pub id: NodeId,
    /// Its configuration.
    pub cfg: NodeConfig,
    /// Incident events of its sandboxes.
    pub events: crate::events::EventStore,
    pub(crate) cgroups: Cgroups,
    pub(crate) images: Images,
    /// Image layers mounted here.
    pub(crate) layers: crate::layers::LayerMounts,
    pub(crate) guest_bin: PathBuf,
    pub(crate) dirs: Dirs,
    pub(crate) sandboxes: RwLock<HashMap<SandboxId, Arc<Sandbox>>>,
    pub(crate) admission: Admission,
    pub(crate) idempotency: Mutex<HashMap<String, IdemSlot>>,
    /// Inits started ahead of requests (see [`crate::pool`]).
    pub(crate) warm: Mutex<Vec<crate::pool::Warm>>,
    pub(crate) refilling: std::sync::atomic::AtomicBool,
    pub(crate) closing: std::sync::atomic::AtomicBool,
}

/// A create in flight or done, by idempotency key.
pub(crate) enum IdemSlot {
    InFlight(Arc<tokio::sync::Notify>),
    Done(SandboxId),
}

/// Where a sandbox is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    Running,
    Paused,
    Stopping,
}

/// A running (or paused) sandbox.
pub struct Sandbox {
    pub record: Record,
    pub dir: PathBuf,
    pub socket: PathBuf,
    pub(crate) cgroup: SandboxCgroup,
    pub(crate) pidfd: OwnedFd,
    pub(crate) phase: Mutex<Phase>,
    /// Serialises pause, resume and kill.
    pub(crate) lifecycle: tokio::sync::Mutex<()>,
    pub(crate) tasks: Mutex<Vec<AbortHandle>>,
    /// When the absolute timeout kills it, ms since the epoch (`set_timeout` moves it).
    pub(crate) deadline_ms: AtomicU64,
    /// API activity, for the idle timeout.
    pub(crate) activity: Mutex<Activity>,
    /// A trajectory being replayed (see [`crate::trajectory`]).
    pub(crate) replay: Mutex<Option<crate::trajectory::Replay>>,
    /// Serialises appends to the trajectory log.
    pub(crate) log: Mutex<()>,
    /// How far the node has read the guest's incident records.
    pub(crate) incident_seq: AtomicU64,
    /// Bytes its trajectory log and blobs hold, and the most they may.
    pub(crate) trajectory_bytes: AtomicU64,
    pub(crate) trajectory_budget: u64,
    /// Kernel counters last seen (OOM kills, pids-limit hits), to turn increases into events.
    pub(crate) counters: Mutex<crate::limits::Counters>,
    /// Its writable layer's volume in the disk pool (looked up once).
    pub(crate) volume: std::sync::OnceLock<Option<crate::disk::Volume>>,
}

/// API activity on a sandbox.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Activity {
    /// When the last operation ended (or the sandbox started), ms since the epoch.
    pub last_ms: u64,
    /// Operations in flight.
    pub busy: u32,
}

/// Marks a sandbox busy while alive; its end counts as activity.
pub(crate) struct Busy(Arc<Sandbox>);

impl Busy {
    pub(crate) fn new(sb: &Arc<Sandbox>) -> Busy {
        sb.activity.lock().unwrap_or_else(|p| p.into_inner()).busy += 1;
        Busy(sb.clone())
    }
}

impl Drop for Busy {
    fn drop(&mut self) {
        let mut a = self.0.activity.lock().unwrap_or_else(|p| p.into_inner());
        a.busy = a.busy.saturating_sub(1);
        a.last_ms = state::now_ms();
    }
}

impl Sandbox {
    /// A sandbox around a started (or adopted) init.
    pub(crate) fn new(
        record: Record,
        dir: PathBuf,
        socket: PathBuf,
        cgroup: SandboxCgroup,
        pidfd: OwnedFd,
        phase: Phase,
        trajectory_budget: u64,
    ) -> Arc<Sandbox> {
        Arc::new(Sandbox {
            trajectory_bytes: AtomicU64::new(Sandbox::trajectory_size(&dir)),
            trajectory_budget,
            deadline_ms: AtomicU64::new(record.expires_ms),
            activity: Mutex::new(Activity {
                last_ms: state::now_ms(),
                busy: 0,
            }),
            replay: Mutex::new(None),
            log: Mutex::new(()),
            incident_seq: AtomicU64::new(0),
            counters: Mutex::new(Default::default()),
            volume: std::sync::OnceLock::new(),
            record,
            dir,
            socket,
            cgroup,
            pidfd,
            phase: Mutex::new(phase),
            lifecycle: tokio::sync::Mutex::new(()),
            tasks: Mutex::new(Vec::new()),
        })
    }

    /// The record as it should be saved now (the deadline moves).
    pub(crate) fn current_record(&self) -> Record {
        Record {
            expires_ms: self.deadline_ms.load(Ordering::Relaxed),
            ..self.record.clone()
        }
    }

    pub fn phase(&self) -> Phase {
        *self.phase.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(crate) fn set_phase(&self, p: Phase) {
        *self.phase.lock().unwrap_or_else(|e| e.into_inner()) = p;
    }

    /// The sandbox as the API shows it.
    pub fn view(&self, node: &NodeId) -> SandboxView {
        let r = &self.record;
        SandboxView {
            id: r.id.clone(),
            node: node.clone(),
            backend: r.backend,
            image: r.image.clone(),
            layers: r.layers.clone(),
            task: r.task.clone(),
            labels: r.labels.clone(),
            state: if self.phase() == Phase::Paused {
                SandboxState::Paused
            } else {
                SandboxState::Running
            },
            resources: r.resources,
            created_at: state::rfc3339(r.created_ms),
            expires_at: state::rfc3339(self.deadline_ms.load(Ordering::Relaxed)),
            idle_timeout: r.idle_timeout,
            on_idle: r.on_idle,
            trajectory: r.trajectory,
        }
    }
}

/// Filters for listing.
#[derive(Debug, Default, Clone)]
pub struct ListFilter {
    pub task: Option<String>,
    pub labels: BTreeMap<String, String>,
    pub state: Option<SandboxState>,
}

impl Node {
    /// The sandbox `id`, if this node runs it.
    pub fn get(&self, id: &SandboxId) -> Result<Arc<Sandbox>, NodeError> {
        self.sandboxes
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .get(id)
            .filter(|s| s.phase() != Phase::Stopping)
            .cloned()
            .ok_or_else(|| NodeError::NotFound(id.clone()))
    }

    /// Sandboxes matching `f`, oldest first.
    pub fn list(&self, f: &ListFilter) -> Vec<SandboxView> {
        let map = self.sandboxes.read().unwrap_or_else(|p| p.into_inner());
        let mut out: Vec<(u64, SandboxView)> = map
            .values()
            .filter(|s| s.phase() != Phase::Stopping)
            .filter(|s| {
                f.task
                    .as_ref()
                    .is_none_or(|t| s.record.task.as_ref() == Some(t))
            })
            .filter(|s| {
                f.labels
                    .iter()
                    .all(|(k, v)| s.record.labels.get(k) == Some(v))
            })
            .map(|s| (s.record.created_ms, s.view(&self.id)))
            .filter(|(_, v)| f.state.is_none_or(|st| v.state == st))
            .collect();
        out.sort_by(|a, b| a.0.cmp(&b.0).then_with(|| a.1.id.cmp(&b.1.id)));
        out.into_iter().map(|(_, v)| v).collect()
    }

    /// Makes sure the sandbox runs: a paused one is resumed (transparent resume). Every
    /// operation that talks to the guest calls this first.
    pub async fn ensure_running(&self, sb: &Arc<Sandbox>) -> Result<(), NodeError> {
        match sb.phase() {
            Phase::Running => Ok(()),
            Phase::Stopping => Err(NodeError::Gone(sb.record.id.clone())),
            Phase::Paused => self.resume(&sb.record.id).await.map(|_| ()),
        }
    }

    /// Freezes every process of the sandbox. Pausing a paused sandbox is a no-op.
    pub async fn pause(&self, id: &SandboxId) -> Result<SandboxView, NodeError> {
        let sb = self.get(id)?;
        let _g = sb.lifecycle.lock().await;
        match sb.phase() {
            Phase::Stopping => return Err(NodeError::Gone(id.clone())),
            Phase::Paused => return Ok(sb.view(&self.id)),
            Phase::Running => {}
        }
        let cg = sb.cgroup.clone();
        blocking(move || cg.set_frozen(true))
            .await
            .map_err(|e| NodeError::host("freezing the sandbox", e))?;
        sb.set_phase(Phase::Paused);
        tracing::debug!(sandbox_id = %id, "paused");
        Ok(sb.view(&self.id))
    }

    /// Thaws a paused sandbox. Resuming a running sandbox is a no-op.
    pub async fn resume(&self, id: &SandboxId) -> Result<SandboxView, NodeError> {
        let sb = self.get(id)?;
        let _g = sb.lifecycle.lock().await;
        match sb.phase() {
            Phase::Stopping => return Err(NodeError::Gone(id.clone())),
            Phase::Running => return Ok(sb.view(&self.id)),
            Phase::Paused => {}
        }
        let cg = sb.cgroup.clone();
        blocking(move || cg.set_frozen(false))
            .await
            .map_err(|e| NodeError::host("thawing the sandbox", e))?;
        sb.set_phase(Phase::Running);
        tracing::debug!(sandbox_id = %id, "resumed");
        Ok(sb.view(&self.id))
    }

    /// Kills the sandbox and releases everything it held.
    pub async fn kill(&self, id: &SandboxId) -> Result<(), NodeError> {
        let sb = self.get(id)?;
        let _g = sb.lifecycle.lock().await;
        if sb.phase() == Phase::Stopping {
            return Err(NodeError::NotFound(id.clone()));
        }
        sb.set_phase(Phase::Stopping);
        self.destroy(sb.clone()).await;
        tracing::info!(sandbox_id = %id, "killed");
        Ok(())
    }

    /// Tears a sandbox down: init killed, cgroup removed, directories and socket gone.
    pub(crate) async fn destroy(&self, sb: Arc<Sandbox>) {
        if !sb.cgroup.is_frozen() {
            self.last_incidents(&sb).await;
        }
        for t in sb.tasks.lock().unwrap_or_else(|p| p.into_inner()).drain(..) {
            t.abort();
        }
        self.sandboxes
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&sb.record.id);
        if let Some(key) = &sb.record.idempotency_key {
            self.idempotency
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .remove(key);
        }
        let dirs = self.dirs.clone();
        let ask = crate::admission::Ask::of(&sb.record.resources);
        let layers = sb.record.layers.clone();
        let id = sb.record.id.clone();
        let res = blocking(move || {
            teardown(Some(&sb.pidfd), &sb.cgroup, &sb.dir, &sb.socket, &dirs);
            Ok(())
        })
        .await;
        if let Err(e) = res {
            tracing::error!(sandbox_id = %id, "teardown failed: {e}");
        }
        self.layers.release(&layers);
        self.admission.release(ask);
    }

    /// Called when a sandbox's init exits on its own (crash, OOM kill of PID 1).
    async fn on_init_exit(&self, id: SandboxId) {
        let Ok(sb) = self.get(&id) else { return };
        let _g = sb.lifecycle.lock().await;
        if sb.phase() == Phase::Stopping {
            return;
        }
        tracing::warn!(sandbox_id = %id, "the sandbox's init exited; cleaning up");
        sb.set_phase(Phase::Stopping);
        self.destroy(sb.clone()).await;
    }

    /// Starts the task that watches a sandbox's init for its exit. (Timeouts are the
    /// [`crate::timers`] sweep's.)
    pub(crate) fn watch(self: &Arc<Self>, sb: &Arc<Sandbox>) {
        let mut tasks = Vec::new();
        if let Ok(fd) = sb.pidfd.try_clone() {
            let node = Arc::downgrade(self);
            let id = sb.record.id.clone();
            let reap = sb.pidfd.try_clone();
            tasks.push(
                tokio::spawn(async move {
                    let _ = warren_sys::process::exited(fd).await;
                    // Reap it if it is our child (a no-op for adopted sandboxes).
                    if let Ok(r) = reap {
                        warren_sys::process::pidfd_reap(&r);
                    }
                    if let Some(node) = node.upgrade() {
                        node.on_init_exit(id).await;
                    }
                })
                .abort_handle(),
            );
        }
        tasks.push(self.watch_incidents(sb));
        *sb.tasks.lock().unwrap_or_else(|p| p.into_inner()) = tasks;
    }

    /// Capacity and load, for the control plane and `GET /v1/nodes`.
    pub fn info(&self) -> NodeInfo {
        let load = HostLoad::read().unwrap_or(HostLoad {
            mem_total: 0,
            mem_available: 0,
            threads: 0,
            pid_max: 0,
        });
        let usage = self.admission.usage();
        NodeInfo {
            id: self.id.clone(),
            version: env!("CARGO_PKG_VERSION").to_string(),
            sandboxes: self
                .sandboxes
                .read()
                .unwrap_or_else(|p| p.into_inner())
                .len() as u32,
            max_sandboxes: self.cfg.max_sandboxes,
            memory_reserved: ByteSize(usage.memory),
            memory_allocatable: ByteSize(
                (load.mem_total as f64 * self.cfg.memory_overcommit) as u64,
            ),
            memory_available: ByteSize(load.mem_available),
            threads: load.threads,
            pid_max: load.pid_max,
            cgroups: self.cgroups.layout.name().to_string(),
            max_upload: self.cfg.max_upload,
            disk_pool: self.dirs.disk.as_ref().map(|p| ByteSize(p.capacity)),
            disk_reserved: ByteSize(usage.disk),
            backends: vec![BackendKind::Container],
        }
    }
}

/// Releases everything a sandbox holds. Safe to call on half-made sandboxes and leftovers:
/// every step tolerates a resource that is already gone.
pub(crate) fn teardown(
    pidfd: Option<&OwnedFd>,
    cgroup: &SandboxCgroup,
    dir: &std::path::Path,
    socket: &std::path::Path,
    dirs: &Dirs,
) {
    if let Some(fd) = pidfd {
        let _ = warren_sys::process::pidfd_kill(fd);
    }
    // A frozen process cannot die; thaw so the kill lands.
    if cgroup.exists() && cgroup.is_frozen() {
        let _ = cgroup.set_frozen(false);
    }
    if let Some(fd) = pidfd {
        warren_sys::process::pidfd_wait(fd, Duration::from_secs(1));
        warren_sys::process::pidfd_reap(fd);
    }
    if cgroup.exists() && cgroup.remove(Duration::from_secs(2)).is_err() {
        // Something outlived its init (it should not: the pid namespace died with it).
        cgroup.kill_all();
        if let Err(e) = cgroup.remove(Duration::from_secs(5)) {
            tracing::error!("cgroup left behind: {e}");
        }
    }
    let _ = std::fs::remove_file(socket);
    // The writable layer's volume, contents and all, in one call.
    if let Some(pool) = &dirs.disk {
        pool.release(dir);
    }
    if dir.exists() {
        // Move aside at once, delete in the background: a large writable layer takes a while.
        let name = dir
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let trash = dirs.trash.join(format!("{name}-{}", state::now_ms()));
        // Iteratively and by descriptor: a writable layer can be 100,000 directories deep.
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
}

/// Runs blocking work (cgroup files, mounts, clone) off the async threads.
pub(crate) async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> std::io::Result<T> + Send + 'static,
) -> std::io::Result<T> {
    tokio::task::spawn_blocking(f)
        .await
        .unwrap_or_else(|e| Err(std::io::Error::other(format!("blocking task failed: {e}"))))
}
