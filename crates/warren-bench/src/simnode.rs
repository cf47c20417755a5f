//! A simulated node: the node API the control plane uses for placement, lists and task
//! operations (`GET /v1/node`, `POST /v1/sandboxes`, `GET /v1/sandboxes`,
//! `DELETE /v1/sandboxes/{id}`, `POST /v1/tasks/{task}/{action}`, and the changes to its set
//! of sandboxes the collector follows, `GET /v1/node/sandboxes`), with sandboxes held in
//! memory, a configurable create latency and admission by count, behind the cluster token.
//! So the real control plane runs against more nodes than a machine has.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::{Path, Query, Request, State};
use axum::http::{StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, get, post};
use axum::{Json, Router};
use warren_types::ByteSize;
use warren_types::api::{
    BackendKind, CreateSandbox, IdleAction, NodeInfo, Resources, Sandbox, SandboxChanges,
    SandboxList, SandboxState, TaskAction, TaskResult,
};
use warren_types::error::ApiError;
use warren_types::id::{NodeId, SandboxId};

/// Its sandboxes (task, paused) and the numbered changes to the set.
#[derive(Default)]
struct Held {
    map: HashMap<SandboxId, (Option<String>, bool)>,
    generation: u64,
    /// The number before the oldest change held.
    base: u64,
    log: std::collections::VecDeque<(u64, SandboxId, bool)>,
}

/// Changes a simulated node holds (as a real one does).
const MAX_CHANGES: usize = 65_536;

impl Held {
    fn changed(&mut self, id: SandboxId, added: bool) {
        self.generation += 1;
        self.log.push_back((self.generation, id, added));
        if self.log.len() > MAX_CHANGES
            && let Some((n, _, _)) = self.log.pop_front()
        {
            self.base = n;
        }
    }
}

/// A simulated node.
pub struct SimNode {
    /// Its id.
    pub id: NodeId,
    /// Most sandboxes it admits.
    pub max: u32,
    /// How long a create takes.
    pub latency: Duration,
    sandboxes: Mutex<Held>,
    /// Creates it answered 201.
    pub created: AtomicU64,
}

impl SimNode {
    /// A node of id `id` admitting `max` sandboxes, each create taking `latency`.
    pub fn new(id: NodeId, max: u32, latency: Duration) -> Arc<SimNode> {
        Arc::new(SimNode {
            id,
            max,
            latency,
            sandboxes: Mutex::new(Held {
                generation: 1,
                base: 1,
                ..Default::default()
            }),
            created: AtomicU64::new(0),
        })
    }

    /// How many sandboxes it holds.
    pub fn count(&self) -> usize {
        self.sandboxes.lock().unwrap().map.len()
    }

    /// Forgets every sandbox (between runs).
    pub fn clear(&self) {
        let mut h = self.sandboxes.lock().unwrap();
        let ids: Vec<SandboxId> = h.map.drain().map(|(id, _)| id).collect();
        for id in ids {
            h.changed(id, false);
        }
    }

    fn info(&self) -> NodeInfo {
        let (n, generation) = {
            let h = self.sandboxes.lock().unwrap();
            (h.map.len() as u32, h.generation)
        };
        let mut i = NodeInfo::unknown(self.id.clone());
        i.sandbox_generation = generation;
        i.version = "sim".into();
        i.sandboxes = n;
        i.max_sandboxes = self.max;
        i.memory_total = ByteSize(1 << 40);
        i.memory_allocatable = ByteSize(4 << 40);
        i.memory_reserved = ByteSize(n as u64 * (64 << 20));
        i.memory_available = ByteSize(1 << 40);
        i.cpu_cores = 128;
        i.cpu_allocatable = 128 * 8000;
        i.cpu_requested = n as u64 * 10;
        i.cgroups = "sim".into();
        i.backends = vec![BackendKind::Container];
        i.reachable = true;
        i
    }

    fn view(&self, id: &SandboxId, task: Option<String>, paused: bool) -> Sandbox {
        Sandbox {
            id: id.clone(),
            node: self.id.clone(),
            pool: warren_types::api::DEFAULT_POOL.into(),
            backend: BackendKind::Container,
            image: "host".into(),
            layers: Vec::new(),
            task,
            project: warren_types::project::ROOT.into(),
            labels: Default::default(),
            state: if paused {
                SandboxState::Paused
            } else {
                SandboxState::Running
            },
            resources: Resources {
                cpu: 10,
                cpu_limit: 2000,
                memory: ByteSize(64 << 20),
                memory_limit: ByteSize(2 << 30),
                qos: Default::default(),
                pids: 1024,
                disk: None,
            },
            created_at: String::new(),
            expires_at: String::new(),
            idle_timeout: None,
            on_idle: IdleAction::default(),
            trajectory: false,
            guest: None,
            builder: false,
            network: None,
        }
    }
}

type S = State<Arc<SimNode>>;

/// The node API of `sim`, behind `token`.
pub fn router(sim: Arc<SimNode>, token: String) -> Router {
    Router::new()
        .route("/v1/node", get(node_info))
        .route("/v1/node/sandboxes", get(changes))
        .route("/v1/sandboxes", post(create).get(list))
        .route("/v1/sandboxes/{id}", delete(kill))
        .route("/v1/tasks/{task}/{action}", post(task))
        .layer(axum::middleware::from_fn(
            move |req: Request, next: Next| {
                let ok = req
                    .headers()
                    .get(header::AUTHORIZATION)
                    .and_then(|v| v.to_str().ok())
                    .and_then(|v| v.strip_prefix("Bearer "))
                    == Some(token.as_str());
                async move {
                    if ok {
                        next.run(req).await
                    } else {
                        StatusCode::UNAUTHORIZED.into_response()
                    }
                }
            },
        ))
        .with_state(sim)
}

async fn node_info(State(n): S) -> Json<NodeInfo> {
    Json(n.info())
}

async fn create(State(n): S, Json(req): Json<CreateSandbox>) -> Response {
    if !n.latency.is_zero() {
        tokio::time::sleep(n.latency).await;
    }
    let id = SandboxId::new(&n.id, rand::random());
    {
        let mut m = n.sandboxes.lock().unwrap();
        if m.map.len() as u32 >= n.max {
            let e = ApiError::capacity(
                format!("simulated node {} holds its most, {}", n.id, n.max),
                1,
            );
            let body = warren_types::error::ErrorBody { error: e };
            return (StatusCode::TOO_MANY_REQUESTS, Json(body)).into_response();
        }
        m.map.insert(id.clone(), (req.task.clone(), false));
        m.changed(id.clone(), true);
    }
    n.created.fetch_add(1, Ordering::Relaxed);
    (StatusCode::CREATED, Json(n.view(&id, req.task, false))).into_response()
}

async fn changes(State(n): S, Query(q): Query<HashMap<String, String>>) -> Json<SandboxChanges> {
    let since: u64 = q.get("since").and_then(|s| s.parse().ok()).unwrap_or(0);
    let h = n.sandboxes.lock().unwrap();
    let view = |id: &SandboxId| {
        let (task, paused) = &h.map[id];
        n.view(id, task.clone(), *paused)
    };
    if since < h.base || since > h.generation {
        return Json(SandboxChanges {
            generation: h.generation,
            full: true,
            sandboxes: h.map.keys().map(view).collect(),
            removed: Vec::new(),
        });
    }
    let mut last: HashMap<&SandboxId, bool> = HashMap::new();
    for (g, id, added) in h.log.iter().rev() {
        if *g <= since {
            break;
        }
        last.entry(id).or_insert(*added);
    }
    let mut out = SandboxChanges {
        generation: h.generation,
        ..Default::default()
    };
    for (id, added) in last {
        if added && h.map.contains_key(id) {
            out.sandboxes.push(view(id));
        } else {
            out.removed.push(id.clone());
        }
    }
    Json(out)
}

async fn list(State(n): S) -> Json<SandboxList> {
    let m = n.sandboxes.lock().unwrap();
    Json(SandboxList {
        sandboxes: m
            .map
            .iter()
            .map(|(id, (task, paused))| n.view(id, task.clone(), *paused))
            .collect(),
    })
}

async fn kill(State(n): S, Path(id): Path<String>) -> StatusCode {
    let Ok(id) = id.parse::<SandboxId>() else {
        return StatusCode::BAD_REQUEST;
    };
    let mut h = n.sandboxes.lock().unwrap();
    match h.map.remove(&id) {
        Some(_) => {
            h.changed(id, false);
            StatusCode::NO_CONTENT
        }
        None => StatusCode::NOT_FOUND,
    }
}

async fn task(State(n): S, Path((task, action)): Path<(String, String)>) -> Response {
    let action = match action.as_str() {
        "pause" => TaskAction::Pause,
        "resume" => TaskAction::Resume,
        "stop" => TaskAction::Stop,
        _ => return StatusCode::NOT_FOUND.into_response(),
    };
    let mut h = n.sandboxes.lock().unwrap();
    let mut succeeded = 0;
    let mut stopped = Vec::new();
    h.map.retain(|id, (t, paused)| {
        if t.as_deref() != Some(task.as_str()) {
            return true;
        }
        succeeded += 1;
        match action {
            TaskAction::Pause => *paused = true,
            TaskAction::Resume => *paused = false,
            TaskAction::Stop => {
                stopped.push(id.clone());
                return false;
            }
        }
        true
    });
    for id in stopped {
        h.changed(id, false);
    }
    Json(TaskResult {
        task,
        action,
        succeeded,
        failed: Vec::new(),
        memory_freed: None,
        creates_in_flight: 0,
    })
    .into_response()
}
