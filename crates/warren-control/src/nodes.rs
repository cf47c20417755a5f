//! The nodes the control plane knows: a client for each, and their last reported load.
//!
//! The control plane keeps no sandbox state of its own. It learns load from the nodes (the
//! collector polls `GET /v1/node`) and asks them for sandboxes when it needs to list them.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use warren_types::api::{NodeInfo, Sandbox, SandboxChanges, SandboxState};
use warren_types::id::{NodeId, SandboxId};

use crate::fanout::{self, Answers};
use crate::node_api::{NodeApi, Timeouts};

/// How to reach a node.
#[derive(Debug, Clone)]
pub enum Endpoint {
    /// The node API on a local unix socket (`warren up`).
    Unix(PathBuf),
    /// The node API over HTTP with a cluster token.
    Http {
        /// Base URL, e.g. `http://10.0.0.5:7701`.
        url: String,
        /// Cluster token.
        token: Option<String>,
    },
}

/// Why a node could not be reached.
#[derive(Debug, thiserror::Error)]
#[error("node at {endpoint} does not answer: {reason}")]
pub struct Unreachable {
    /// Where we looked.
    pub endpoint: String,
    /// Why.
    pub reason: String,
}

/// How long a connection to a node may take to open.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);

/// A client for one node's API.
#[derive(Debug, Clone)]
pub struct NodeClient {
    http: reqwest::Client,
    base: String,
    token: Option<String>,
    endpoint: String,
}

impl NodeClient {
    /// A client for `endpoint`.
    pub fn new(endpoint: &Endpoint) -> Result<NodeClient, Unreachable> {
        // Idle connections are dropped before the node closes them (it does after
        // `HEADER_READ_TIMEOUT`): a request sent on one the node is closing would be lost.
        let builder = reqwest::Client::builder()
            .pool_max_idle_per_host(256)
            .pool_idle_timeout(warren_http::serve::HEADER_READ_TIMEOUT / 2)
            // A node's answers are its own: a redirect would send the control plane (and, to
            // the same host, the cluster token) somewhere else.
            .redirect(reqwest::redirect::Policy::none())
            // A node cut off drops what is sent to it: a call fails in seconds, not after the
            // kernel's two minutes of retried SYNs.
            .connect_timeout(CONNECT_TIMEOUT)
            .tcp_nodelay(true);
        let (builder, base, token, shown) = match endpoint {
            Endpoint::Unix(path) => (
                builder.unix_socket(path.clone()),
                "http://node".to_string(),
                None,
                path.display().to_string(),
            ),
            Endpoint::Http { url, token } => (
                builder,
                url.trim_end_matches('/').to_string(),
                token.clone(),
                url.clone(),
            ),
        };
        let http = builder.build().map_err(|e| Unreachable {
            endpoint: shown.clone(),
            reason: e.to_string(),
        })?;
        Ok(NodeClient {
            http,
            base,
            token,
            endpoint: shown,
        })
    }

    /// A request to `path_and_query` on the node.
    pub fn request(
        &self,
        method: reqwest::Method,
        path_and_query: &str,
    ) -> reqwest::RequestBuilder {
        let rb = self
            .http
            .request(method, format!("{}{}", self.base, path_and_query));
        match &self.token {
            Some(t) => rb.bearer_auth(t),
            None => rb,
        }
    }

    /// Where the node is, for messages.
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }
}

/// How long a placement the node has answered stays in its overlay when no report reflects
/// it (a node whose polls fail).
pub const PLACED_TTL: Duration = Duration::from_secs(10);

/// A node and what the control plane knows of its load.
#[derive(Debug)]
pub struct NodeEntry {
    /// Its id.
    pub id: NodeId,
    /// Its client.
    pub client: NodeClient,
    /// The URL it joined with (none for `warren up`'s own node on a unix socket).
    pub address: Option<String>,
    last: RwLock<NodeInfo>,
    /// Whether its last report put it in the burst pool (read for every create).
    burst: AtomicBool,
    up: AtomicBool,
    cordoned: AtomicBool,
    /// Placements sent to it and not yet answered (the in-flight overlay).
    pub inflight: AtomicU32,
    /// Memory of those placements.
    pub inflight_memory: AtomicU64,
    /// CPU of those placements, millicores.
    pub inflight_cpu: AtomicU64,
    /// Placements it has answered that no report of its has counted yet: (when answered,
    /// memory, CPU). They leave when a report asked for after them arrives, or after
    /// [`PLACED_TTL`].
    placed: Mutex<Vec<(Instant, u64, u64)>>,
    /// Its sandboxes as its changes last said (the collector keeps it), for lists while it
    /// does not answer.
    view: Mutex<View>,
    timeouts: Timeouts,
}

/// What the control plane last heard of a node's sandboxes.
#[derive(Debug, Default)]
struct View {
    /// The node's generation it is at (0: nothing heard).
    generation: u64,
    sandboxes: HashMap<SandboxId, Sandbox>,
    /// Their sums by project (for quotas).
    by_project: HashMap<String, Totals>,
    /// When the changes it last applied were asked for: what the node did before then is in
    /// it.
    asked: Option<Instant>,
}

/// Sandboxes and their requests, summed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Totals {
    /// Sandboxes.
    pub sandboxes: u64,
    /// CPU requests, millicores.
    pub cpu: u64,
    /// Memory requests, bytes.
    pub memory: u64,
}

impl Totals {
    /// One sandbox's.
    pub fn of(sb: &Sandbox) -> Totals {
        Totals {
            sandboxes: 1,
            cpu: u64::from(sb.resources.cpu),
            memory: sb.resources.memory.bytes(),
        }
    }

    /// Adds `o`.
    pub fn add(&mut self, o: Totals) {
        self.sandboxes = self.sandboxes.saturating_add(o.sandboxes);
        self.cpu = self.cpu.saturating_add(o.cpu);
        self.memory = self.memory.saturating_add(o.memory);
    }

    fn sub(&mut self, o: Totals) {
        self.sandboxes = self.sandboxes.saturating_sub(o.sandboxes);
        self.cpu = self.cpu.saturating_sub(o.cpu);
        self.memory = self.memory.saturating_sub(o.memory);
    }
}

impl View {
    fn insert(&mut self, sb: Sandbox) {
        self.remove(&sb.id);
        self.by_project
            .entry(sb.project.clone())
            .or_default()
            .add(Totals::of(&sb));
        self.sandboxes.insert(sb.id.clone(), sb);
    }

    fn remove(&mut self, id: &SandboxId) {
        if let Some(old) = self.sandboxes.remove(id)
            && let Some(t) = self.by_project.get_mut(&old.project)
        {
            t.sub(Totals::of(&old));
            if t.sandboxes == 0 {
                self.by_project.remove(&old.project);
            }
        }
    }
}

/// The overlay a node carries on top of its last report: placements in flight and placed
/// but not yet reported.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Overlay {
    /// Sandboxes.
    pub sandboxes: u32,
    /// Memory requests, bytes.
    pub memory: u64,
    /// CPU requests, millicores.
    pub cpu: u64,
}

impl NodeEntry {
    fn new(
        id: NodeId,
        client: NodeClient,
        address: Option<String>,
        info: NodeInfo,
        up: bool,
        timeouts: Timeouts,
    ) -> NodeEntry {
        NodeEntry {
            id,
            client,
            address,
            burst: AtomicBool::new(info.pool == warren_types::api::BURST_POOL),
            last: RwLock::new(info),
            up: AtomicBool::new(up),
            cordoned: AtomicBool::new(false),
            inflight: AtomicU32::new(0),
            inflight_memory: AtomicU64::new(0),
            inflight_cpu: AtomicU64::new(0),
            placed: Mutex::new(Vec::new()),
            view: Mutex::default(),
            timeouts,
        }
    }

    /// Brings its view of the node's sandboxes up to `generation`, asking the node for what
    /// changed when it moved. A node that does not answer keeps the view it had.
    async fn follow(
        &self,
        generation: u64,
        reported: Instant,
    ) -> Result<(), crate::node_api::CallError> {
        let since = self
            .view
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .generation;
        if generation == 0 || generation == since {
            // Nothing changed up to the report, asked for at `reported`.
            self.view.lock().unwrap_or_else(|p| p.into_inner()).asked = Some(reported);
            return Ok(());
        }
        let asked = Instant::now();
        let ch = self.api().changes(since).await?;
        self.apply(ch, asked);
        Ok(())
    }

    fn apply(&self, ch: SandboxChanges, asked: Instant) {
        let mut v = self.view.lock().unwrap_or_else(|p| p.into_inner());
        v.asked = Some(asked);
        if ch.full {
            v.sandboxes.clear();
            v.by_project.clear();
        }
        for id in &ch.removed {
            v.remove(id);
        }
        for sb in ch.sandboxes {
            // Only its own: a node cannot place entries for another's ids in the view.
            if sb.id.node() == self.id {
                v.insert(sb);
            }
        }
        v.generation = ch.generation;
    }

    /// Its sandboxes as last heard, each in state `unknown` (for lists while it does not
    /// answer), those `keep` wants.
    pub fn unknown_sandboxes(&self, keep: impl Fn(&Sandbox) -> bool) -> Vec<Sandbox> {
        let v = self.view.lock().unwrap_or_else(|p| p.into_inner());
        v.sandboxes
            .values()
            .map(|sb| Sandbox {
                state: SandboxState::Unknown,
                ..sb.clone()
            })
            .filter(|sb| keep(sb))
            .collect()
    }

    /// Its sandboxes' sums by project, as last heard.
    pub fn project_totals(&self) -> Vec<(String, Totals)> {
        self.view
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .by_project
            .iter()
            .map(|(p, t)| (p.clone(), *t))
            .collect()
    }

    /// Whether its view reflects what the node did before `at` (it was brought up to date
    /// by a call made after then).
    pub fn view_since(&self, at: Instant) -> bool {
        self.view
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .asked
            .is_some_and(|a| a > at)
    }

    /// How many sandboxes its view holds.
    pub fn known_sandboxes(&self) -> usize {
        self.view
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .sandboxes
            .len()
    }

    /// A node with a report given outright, for tests of placement (its client points
    /// nowhere).
    #[cfg(test)]
    pub(crate) fn simulated(info: NodeInfo, up: bool) -> NodeEntry {
        let client = NodeClient::new(&Endpoint::Http {
            url: "http://127.0.0.1:9".into(),
            token: None,
        })
        .expect("a client");
        NodeEntry::new(info.id.clone(), client, None, info, up, Timeouts::default())
    }

    /// Its typed API, for the control plane's own calls.
    pub fn api(&self) -> NodeApi<'_> {
        NodeApi::new(&self.client, self.timeouts)
    }

    /// `f` of its last report, borrowed (placement reads a few numbers of every node per
    /// create; a copy of the whole report each time would cost more than the choice).
    pub fn with_report<R>(&self, f: impl FnOnce(&NodeInfo) -> R) -> R {
        f(&self.last.read().unwrap_or_else(|p| p.into_inner()))
    }

    /// Its last reported state, with what the control plane knows of it: cordoned, reachable,
    /// where it is.
    pub fn info(&self) -> NodeInfo {
        let mut i = self.last.read().unwrap_or_else(|p| p.into_inner()).clone();
        i.cordoned = self.is_cordoned();
        i.reachable = self.is_up();
        i.address = self.address.clone();
        i
    }

    /// Whether it answered the last poll.
    pub fn is_up(&self) -> bool {
        self.up.load(Ordering::Relaxed)
    }

    /// Whether it is in the burst pool.
    pub fn is_burst(&self) -> bool {
        self.burst.load(Ordering::Relaxed)
    }

    /// Whether new sandboxes are kept off it.
    pub fn is_cordoned(&self) -> bool {
        self.cordoned.load(Ordering::Relaxed)
    }

    /// Keeps new sandboxes off it, or lets them on again.
    pub fn set_cordoned(&self, on: bool) {
        self.cordoned.store(on, Ordering::Relaxed);
    }

    /// Marks it answering or not (tests of placement; the collector does it for real nodes).
    pub fn set_up(&self, up: bool) {
        self.up.store(up, Ordering::Relaxed);
    }

    /// Records a report asked for at `asked`: placements answered before then are in it.
    pub fn record(&self, info: NodeInfo, asked: Instant) {
        self.burst.store(
            info.pool == warren_types::api::BURST_POOL,
            Ordering::Relaxed,
        );
        *self.last.write().unwrap_or_else(|p| p.into_inner()) = info;
        self.placed
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .retain(|(at, _, _)| *at >= asked && asked.saturating_duration_since(*at) < PLACED_TTL);
    }

    /// A placement it answered (made the sandbox): counted until its report shows it.
    pub fn placed(&self, memory: u64, cpu: u64) {
        let now = Instant::now();
        let mut p = self.placed.lock().unwrap_or_else(|p| p.into_inner());
        p.retain(|(at, _, _)| now.saturating_duration_since(*at) < PLACED_TTL);
        p.push((now, memory, cpu));
    }

    /// What it carries on top of its last report.
    pub fn overlay(&self) -> Overlay {
        let mut o = Overlay {
            sandboxes: self.inflight.load(Ordering::Relaxed),
            memory: self.inflight_memory.load(Ordering::Relaxed),
            cpu: self.inflight_cpu.load(Ordering::Relaxed),
        };
        // One clock read (in a VM it may be a system call), not one per placement.
        let now = Instant::now();
        for (at, m, c) in self.placed.lock().unwrap_or_else(|p| p.into_inner()).iter() {
            if now.saturating_duration_since(*at) < PLACED_TTL {
                o.sandboxes += 1;
                o.memory = o.memory.saturating_add(*m);
                o.cpu = o.cpu.saturating_add(*c);
            }
        }
        o
    }
}

/// Every node the control plane knows.
#[derive(Debug, Default)]
pub struct Nodes {
    map: RwLock<HashMap<NodeId, Arc<NodeEntry>>>,
    /// The same nodes sorted by id, remade when the map changes (every create reads it).
    sorted: RwLock<Arc<[Arc<NodeEntry>]>>,
    timeouts: Timeouts,
}

impl Nodes {
    /// No nodes yet; calls to the nodes added will wait as long as `timeouts` say.
    pub fn new(timeouts: Timeouts) -> Self {
        Nodes {
            map: RwLock::default(),
            sorted: RwLock::new(Arc::new([])),
            timeouts,
        }
    }

    /// Registers a node after asking for its identity.
    pub async fn add(&self, endpoint: &Endpoint) -> Result<Arc<NodeEntry>, Unreachable> {
        let client = NodeClient::new(endpoint)?;
        let info = NodeApi::new(&client, self.timeouts)
            .info()
            .await
            .map_err(|e| Unreachable {
                endpoint: client.endpoint().to_string(),
                reason: e.to_string(),
            })?;
        let address = match endpoint {
            Endpoint::Http { url, .. } => Some(url.clone()),
            Endpoint::Unix(_) => None,
        };
        let entry = Arc::new(NodeEntry::new(
            info.id.clone(),
            client,
            address,
            info,
            true,
            self.timeouts,
        ));
        self.insert(entry.clone());
        Ok(entry)
    }

    /// Knows node `id` at `endpoint` from now on, before hearing from it (it is listed as not
    /// reachable until a poll answers). Replaces what was known of it, keeping its cordon.
    pub fn add_unheard(
        &self,
        id: NodeId,
        endpoint: &Endpoint,
        cordoned: bool,
    ) -> Result<Arc<NodeEntry>, Unreachable> {
        let client = NodeClient::new(endpoint)?;
        let address = match endpoint {
            Endpoint::Http { url, .. } => Some(url.clone()),
            Endpoint::Unix(_) => None,
        };
        let old = self.get(&id);
        let info = old
            .as_ref()
            .map(|e| e.last.read().unwrap_or_else(|p| p.into_inner()).clone())
            .unwrap_or_else(|| NodeInfo::unknown(id.clone()));
        let entry = Arc::new(NodeEntry::new(
            id,
            client,
            address,
            info,
            false,
            self.timeouts,
        ));
        entry.set_cordoned(cordoned);
        // What was heard of its sandboxes stays until it answers.
        if let Some(old) = old {
            let v = std::mem::take(&mut *old.view.lock().unwrap_or_else(|p| p.into_inner()));
            *entry.view.lock().unwrap_or_else(|p| p.into_inner()) = v;
        }
        self.insert(entry.clone());
        Ok(entry)
    }

    /// Forgets node `id` (removed from the membership). Returns whether it was known.
    pub fn remove(&self, id: &NodeId) -> bool {
        let mut map = self.map.write().unwrap_or_else(|p| p.into_inner());
        let known = map.remove(id).is_some();
        self.resort(&map);
        known
    }

    /// Remakes the sorted list from `map` (its write lock held).
    fn resort(&self, map: &HashMap<NodeId, Arc<NodeEntry>>) {
        let mut v: Vec<Arc<NodeEntry>> = map.values().cloned().collect();
        v.sort_by(|a, b| a.id.cmp(&b.id));
        *self.sorted.write().unwrap_or_else(|p| p.into_inner()) = v.into();
    }

    /// Forgets `entry` if it is still the one known for its id (not replaced since by a new
    /// join). Returns whether it was.
    pub fn remove_entry(&self, entry: &Arc<NodeEntry>) -> bool {
        let mut map = self.map.write().unwrap_or_else(|p| p.into_inner());
        if map.get(&entry.id).is_some_and(|e| Arc::ptr_eq(e, entry)) {
            map.remove(&entry.id);
            self.resort(&map);
            true
        } else {
            false
        }
    }

    /// Adds (or replaces) an entry.
    pub fn insert(&self, entry: Arc<NodeEntry>) {
        let mut map = self.map.write().unwrap_or_else(|p| p.into_inner());
        map.insert(entry.id.clone(), entry);
        self.resort(&map);
    }

    /// The node `id`.
    pub fn get(&self, id: &NodeId) -> Option<Arc<NodeEntry>> {
        self.map
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .get(id)
            .cloned()
    }

    /// All nodes, sorted by id.
    pub fn all(&self) -> Vec<Arc<NodeEntry>> {
        self.snapshot().to_vec()
    }

    /// All nodes, sorted by id, shared (no copy).
    pub fn snapshot(&self) -> Arc<[Arc<NodeEntry>]> {
        self.sorted
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Polls every node once and records what it says; the answers say which did not.
    pub async fn collect(&self) -> Answers<()> {
        fanout::ask(self.all(), |n| async move {
            let asked = Instant::now();
            match n.api().info().await {
                Ok(info) if info.id != n.id => {
                    // Another node answers at this address now: not this one.
                    if n.up.swap(false, Ordering::Relaxed) {
                        tracing::warn!(
                            node_id = %n.id,
                            "node {} answers at {} now, not node {}",
                            info.id,
                            n.client.endpoint(),
                            n.id
                        );
                    }
                    Err(crate::node_api::CallError::Unreachable(format!(
                        "node {} answers at its address",
                        info.id
                    )))
                }
                Ok(info) => {
                    let generation = info.sandbox_generation;
                    n.record(info, asked);
                    if !n.up.swap(true, Ordering::Relaxed) {
                        tracing::info!(node_id = %n.id, "node answers");
                    }
                    // The view follows; should that fail, the next poll tries again (the node
                    // answered, so it is up).
                    if let Err(e) = n.follow(generation, asked).await {
                        tracing::debug!(node_id = %n.id, "sandbox changes: {e}");
                    }
                    Ok(())
                }
                Err(e) => {
                    if n.up.swap(false, Ordering::Relaxed) {
                        tracing::warn!(node_id = %n.id, "node stopped answering: {e}");
                    }
                    Err(e)
                }
            }
        })
        .await
    }

    /// Polls nodes every `interval` until the process ends.
    pub fn spawn_collector(self: &Arc<Self>, interval: Duration) {
        let nodes = Arc::downgrade(self);
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(interval).await;
                let Some(n) = nodes.upgrade() else { break };
                // Each node that stops answering is logged once, above.
                n.collect().await;
            }
        });
    }
}
