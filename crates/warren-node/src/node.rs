//! The node: its sandboxes, what they are, and what is known of them (get, list, report).
//!
//! A sandbox is a record (what it was asked to be, saved as `state.json`) around an instance
//! of a backend (what runs it; see the `backend` module). Its lifecycle is in `lifecycle`,
//! creation in `create`, re-adoption after a restart in `adopt`, guest operations in `exec`
//! and `files`.

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};

use tokio::task::AbortHandle;
use warren_types::ByteSize;
use warren_types::api::{NodeInfo, Sandbox as SandboxView, SandboxState};
use warren_types::id::{NodeId, SandboxId};

use crate::admission::{Admission, HostLoad};
use crate::backend::{Backend, Instance, LimitCounters};
use crate::config::NodeConfig;
use crate::error::NodeError;
use crate::images::Images;
use crate::layers::LayerMounts;
use crate::state::{self, Record};
use crate::trajectory::log::Trajectory;

pub use crate::phase::Phase;

/// Where things live under the state directory.
#[derive(Debug, Clone)]
pub struct Dirs {
    pub sandboxes: PathBuf,
    pub sockets: PathBuf,
    pub images: PathBuf,
    pub trash: PathBuf,
    /// Where warm inits are built (moved into the sandbox directory when one is taken).
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
    /// What runs its sandboxes.
    pub(crate) backend: Arc<dyn Backend>,
    pub(crate) images: Arc<Images>,
    /// Image layers mounted here.
    pub(crate) layers: Arc<LayerMounts>,
    pub(crate) dirs: Dirs,
    /// The guest agent binary its inits run (its own copy, by digest).
    pub(crate) guest: crate::guest_bin::GuestBinary,
    /// Its sandboxes. Changed only through [`Node::insert`] and [`Node::forget`], which
    /// number each change (under this lock) for the control plane's view.
    pub(crate) sandboxes: RwLock<HashMap<SandboxId, Arc<Sandbox>>>,
    pub(crate) changes: Mutex<Changes>,
    pub(crate) admission: Admission,
    /// The derived most sandboxes, and what sets it.
    pub(crate) capacity: crate::capacity::Derived,
    /// The host's load, sampled every second.
    pub(crate) sampler: crate::capacity::Sampler,
    /// Creates waiting for (or holding) a start slot.
    pub(crate) create_gate: crate::capacity::Gate,
    /// One resume's prefetch at a time (they read from swap: several at once only compete).
    pub(crate) prefetch_gate: Arc<tokio::sync::Semaphore>,
    /// The state directory's lock, held while the node lives.
    pub(crate) _state_lock: std::fs::File,
    pub(crate) idempotency: Mutex<HashMap<String, IdemSlot>>,
    /// Creates of tasks in flight, and what task operations asked of them.
    pub(crate) pending: Arc<crate::pending::Pending>,
    /// Held shared by a task stop's teardowns, which go on after its answer; the node's
    /// shutdown takes it exclusively, so it waits for them.
    pub(crate) teardowns: Arc<tokio::sync::RwLock<()>>,
    /// Function-call workers.
    pub(crate) fncall: crate::workers::Workers,
}

/// The numbered changes to a node's set of sandboxes, the latest [`MAX_CHANGES`] of them.
/// Numbers start at the microsecond the node started, so those of an earlier run of the
/// daemon are never taken for this one's.
pub(crate) struct Changes {
    /// The number before the oldest change held: changes after it are all here.
    base: u64,
    /// The latest number.
    last: u64,
    log: std::collections::VecDeque<(u64, SandboxId, bool)>,
}

/// Changes held for the control plane's view; one further behind is sent the whole set.
const MAX_CHANGES: usize = 65_536;

impl Changes {
    pub(crate) fn new() -> Changes {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_micros() as u64)
            .unwrap_or(1);
        Changes {
            base: now,
            last: now,
            log: Default::default(),
        }
    }

    fn push(&mut self, id: SandboxId, added: bool) {
        self.last += 1;
        self.log.push_back((self.last, id, added));
        if self.log.len() > MAX_CHANGES
            && let Some((n, _, _)) = self.log.pop_front()
        {
            self.base = n;
        }
    }

    /// The ids added and removed after `since`, the latest change of each winning; none when
    /// they are not all held.
    fn since(&self, since: u64) -> Option<HashMap<&SandboxId, bool>> {
        if since < self.base || since > self.last {
            return None;
        }
        let mut out = HashMap::new();
        for (n, id, added) in self.log.iter().rev() {
            if *n <= since {
                break;
            }
            out.entry(id).or_insert(*added);
        }
        Some(out)
    }
}

/// A create in flight or done, by idempotency key.
pub(crate) enum IdemSlot {
    InFlight(Arc<tokio::sync::Notify>),
    Done(SandboxId),
}

/// What the node last saw of a sandbox's limits, to turn increases into events.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct Seen {
    pub counters: LimitCounters,
    pub disk_full: bool,
}

/// A running (or paused) sandbox.
pub struct Sandbox {
    pub record: Record,
    /// Its directory: `state.json`, the guest's log, the trajectory (and, for containers, the
    /// writable layer).
    pub dir: PathBuf,
    /// What runs it.
    pub(crate) instance: Box<dyn Instance>,
    pub(crate) phase: Mutex<Phase>,
    /// Serialises pause, resume and kill.
    pub(crate) lifecycle: tokio::sync::Mutex<()>,
    pub(crate) tasks: Mutex<Vec<AbortHandle>>,
    /// When the absolute timeout kills it, ms since the epoch (`set_timeout` moves it).
    pub(crate) deadline_ms: AtomicU64,
    /// API activity, for the idle timeout.
    pub(crate) activity: Mutex<Activity>,
    /// Its trajectory log and replay.
    pub(crate) trajectory: Trajectory,
    /// How far the node has read the guest's incident records.
    pub(crate) incident_seq: AtomicU64,
    /// Limits last seen.
    pub(crate) seen: Mutex<Seen>,
    /// The previous metrics read: when (ms since the epoch) and the CPU time then (ns).
    pub(crate) cpu_seen: Mutex<Option<(u64, u64)>>,
    /// Its network policy as it stands (the record's is the one it was created or adopted
    /// with); changes are serialised by the lifecycle lock.
    pub(crate) network: Mutex<warren_types::net::NetworkPolicy>,
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
    /// A sandbox around a started (or adopted) instance.
    pub(crate) fn new(
        record: Record,
        dir: PathBuf,
        instance: Box<dyn Instance>,
        phase: Phase,
        trajectory_budget: u64,
    ) -> Arc<Sandbox> {
        Arc::new(Sandbox {
            trajectory: Trajectory::new(
                record.id.clone(),
                &dir,
                record.trajectory,
                trajectory_budget,
            ),
            deadline_ms: AtomicU64::new(record.expires_ms),
            activity: Mutex::new(Activity {
                last_ms: state::now_ms(),
                busy: 0,
            }),
            incident_seq: AtomicU64::new(0),
            seen: Mutex::new(Seen::default()),
            cpu_seen: Mutex::new(None),
            network: Mutex::new(record.network.clone()),
            record,
            dir,
            instance,
            phase: Mutex::new(phase),
            lifecycle: tokio::sync::Mutex::new(()),
            tasks: Mutex::new(Vec::new()),
        })
    }

    /// Its guest agent's control socket (the instance's transport).
    pub fn socket(&self) -> &std::path::Path {
        self.instance.transport().socket()
    }

    /// The record as it should be saved now (the deadline moves).
    pub(crate) fn current_record(&self) -> Record {
        Record {
            expires_ms: self.deadline_ms.load(Ordering::Relaxed),
            network: self.network_policy(),
            net_lease: self.instance.network().map(|n| (n.index, n.generation)),
            host_ports: self
                .instance
                .exposed()
                .into_iter()
                .map(|(p, a)| (p, a.port()))
                .collect(),
            ..self.record.clone()
        }
    }

    /// Its network policy now.
    pub(crate) fn network_policy(&self) -> warren_types::net::NetworkPolicy {
        self.network
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Its network as the API shows it.
    pub fn network_status(&self) -> warren_types::net::NetworkStatus {
        let policy = self.network_policy();
        let info = self.instance.network();
        warren_types::net::NetworkStatus {
            mode: policy.mode,
            ipv4: info.map(|n| n.v4.to_string()),
            ipv6: info.map(|n| n.v6.to_string()),
            gateway: info.map(|n| n.gateway4.to_string()),
            allow: policy.allow,
            deny: policy.deny,
            exposed: self
                .instance
                .exposed()
                .into_iter()
                .map(|(port, a)| warren_types::net::ExposedPort {
                    port,
                    host: a.to_string(),
                })
                .collect(),
        }
    }

    pub fn phase(&self) -> Phase {
        *self.phase.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(crate) fn set_phase(&self, p: Phase) {
        *self.phase.lock().unwrap_or_else(|e| e.into_inner()) = p;
    }

    /// Whether its project is in `scope` (the control plane's comma-separated subtrees; none:
    /// no limit).
    pub fn in_scope(&self, scope: Option<&str>) -> bool {
        scope.is_none_or(|s| warren_types::project::in_scope_list(s, &self.record.project))
    }

    /// The sandbox as the API shows it.
    pub fn view(&self, node: &NodeId, pool: &str) -> SandboxView {
        let r = &self.record;
        SandboxView {
            id: r.id.clone(),
            node: node.clone(),
            pool: pool.to_string(),
            backend: r.backend,
            image: r.image.clone(),
            layers: r.layers.clone(),
            task: r.task.clone(),
            project: r.project.clone(),
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
            guest: r.guest.clone(),
            builder: r.builder,
            network: Some(self.network_status()),
        }
    }
}

/// Filters for listing.
#[derive(Debug, Default, Clone)]
pub struct ListFilter {
    /// Only sandboxes of projects in these subtrees (comma-separated; the control plane's
    /// scope of the caller).
    pub scope: Option<String>,
    pub task: Option<String>,
    pub labels: BTreeMap<String, String>,
    pub state: Option<SandboxState>,
}

impl Node {
    /// Adds a sandbox to the node's set.
    pub(crate) fn insert(&self, sb: Arc<Sandbox>) {
        let mut map = self.sandboxes.write().unwrap_or_else(|p| p.into_inner());
        let id = sb.record.id.clone();
        map.insert(id.clone(), sb);
        self.changes
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(id, true);
    }

    /// Takes a sandbox out of the node's set.
    pub(crate) fn forget(&self, id: &SandboxId) {
        let mut map = self.sandboxes.write().unwrap_or_else(|p| p.into_inner());
        if map.remove(id).is_some() {
            self.changes
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .push(id.clone(), false);
        }
    }

    /// What changed in the set since generation `since`, or all of it (see
    /// [`SandboxChanges`](warren_types::api::SandboxChanges)).
    pub fn changes_since(&self, since: u64) -> warren_types::api::SandboxChanges {
        let map = self.sandboxes.read().unwrap_or_else(|p| p.into_inner());
        let changes = self.changes.lock().unwrap_or_else(|p| p.into_inner());
        let generation = changes.last;
        let view = |sb: &Arc<Sandbox>| sb.view(&self.id, &self.cfg.pool);
        match changes.since(since) {
            Some(ids) => {
                let mut out = warren_types::api::SandboxChanges {
                    generation,
                    ..Default::default()
                };
                for (id, added) in ids {
                    match (added, map.get(id)) {
                        (true, Some(sb)) => out.sandboxes.push(view(sb)),
                        _ => out.removed.push(id.clone()),
                    }
                }
                out
            }
            None => warren_types::api::SandboxChanges {
                generation,
                full: true,
                sandboxes: map.values().map(view).collect(),
                removed: Vec::new(),
            },
        }
    }

    /// The number of the latest change to the set.
    pub fn generation(&self) -> u64 {
        self.changes.lock().unwrap_or_else(|p| p.into_inner()).last
    }

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
            .filter(|s| s.in_scope(f.scope.as_deref()))
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
            .map(|s| (s.record.created_ms, s.view(&self.id, &self.cfg.pool)))
            .filter(|(_, v)| f.state.is_none_or(|st| v.state == st))
            .collect();
        out.sort_by(|a, b| a.0.cmp(&b.0).then_with(|| a.1.id.cmp(&b.1.id)));
        out.into_iter().map(|(_, v)| v).collect()
    }

    /// Adds addresses no sandbox may reach from now on: the cluster's members and database,
    /// as the control plane named them when this node joined. Blocking.
    pub fn deny_destinations(&self, addrs: &[std::net::IpAddr]) -> std::io::Result<()> {
        self.backend.deny_destinations(addrs)
    }

    /// The backends this node runs sandboxes in.
    pub fn backends(&self) -> Vec<warren_types::api::BackendKind> {
        vec![self.backend.kind()]
    }

    /// Capacity and load, for the control plane and `GET /v1/nodes`.
    pub fn info(&self) -> NodeInfo {
        let load = HostLoad::read().unwrap_or(HostLoad {
            mem_total: 0,
            mem_available: 0,
            threads: 0,
            pid_max: 0,
            cores: 1,
        });
        let usage = self.admission.usage();
        let measured = self.sampler.get();
        let gate = self.create_gate.stats();
        NodeInfo {
            id: self.id.clone(),
            version: env!("CARGO_PKG_VERSION").to_string(),
            sandboxes: self
                .sandboxes
                .read()
                .unwrap_or_else(|p| p.into_inner())
                .len() as u32,
            max_sandboxes: self.capacity.max_sandboxes,
            creates_starting: gate.starting,
            creates_waiting: gate.waiting,
            create_slots: gate.slots,
            create_wait_ms: gate.longest_wait_ms,
            memory_reserved: ByteSize(usage.memory),
            memory_allocatable: ByteSize(
                (load.mem_total as f64 * self.cfg.memory_overcommit) as u64,
            ),
            memory_available: ByteSize(load.mem_available),
            memory_total: ByteSize(load.mem_total),
            memory_used: ByteSize(measured.memory_used.unwrap_or(0)),
            cpu_requested: usage.cpu,
            cpu_allocatable: (f64::from(load.cores) * 1000.0 * self.cfg.cpu_overcommit) as u64,
            cpu_cores: load.cores,
            cpu_used_pct: measured.cpu_used_pct,
            pressure: measured.pressure,
            qos: Some(self.backend.qos_support()),
            threads: load.threads,
            pid_max: load.pid_max,
            cgroups: self.backend.isolation(),
            max_upload: self.cfg.max_upload,
            disk_pool: self.dirs.disk.as_ref().map(|p| ByteSize(p.capacity)),
            disk_reserved: ByteSize(usage.disk),
            backends: self.backends(),
            guest: Some(self.guest.digest.clone()),
            sandbox_generation: self.generation(),
            labels: self.cfg.labels.clone(),
            pool: self.cfg.pool.clone(),
            // The control plane's to say.
            cordoned: false,
            reachable: true,
            address: None,
            fncall_pools: self.fncall.stats(),
            fncall_budget: ByteSize(self.fncall.budget()),
            fncall_held: ByteSize(self.fncall.held()),
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

#[cfg(test)]
mod changes_tests {
    use super::*;

    fn id(i: u32) -> SandboxId {
        let node: NodeId = "abcdef".parse().unwrap();
        let mut r = [0u8; warren_types::id::SANDBOX_RANDOM_LEN];
        r[..4].copy_from_slice(&i.to_le_bytes());
        SandboxId::new(&node, r)
    }

    #[test]
    fn changes_since_a_generation_net_out_and_fall_back_to_the_whole_set() {
        let mut c = Changes::new();
        let start = c.last;
        assert!(c.since(start).unwrap().is_empty());
        c.push(id(1), true);
        c.push(id(2), true);
        let mid = c.last;
        c.push(id(1), false);
        c.push(id(3), true);
        let all = c.since(start).unwrap();
        assert_eq!(all.len(), 3);
        assert!(!all[&id(1)], "added then removed: removed");
        assert!(all[&id(2)] && all[&id(3)]);
        let later = c.since(mid).unwrap();
        assert_eq!(later.len(), 2);
        assert!(!later[&id(1)] && later[&id(3)]);
        // A number from before the node started, or from the future: the whole set.
        assert!(c.since(start - 1).is_none());
        assert!(c.since(c.last + 1).is_none());
        // Past the most held, the oldest go and asking from before them is the whole set.
        for i in 0..MAX_CHANGES as u32 {
            c.push(id(10 + i), true);
        }
        assert!(c.since(start).is_none());
        assert!(c.since(mid).is_none());
        assert_eq!(c.since(c.last - 5).unwrap().len(), 5);
    }
}
