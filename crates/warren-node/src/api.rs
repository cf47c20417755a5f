//! The node's HTTP API: the same `/v1/sandboxes/...` routes as the control plane's, without
//! authentication of users (the control plane does that) and only for this node's sandboxes.
//! Served on a unix socket the control plane reaches (and, for remote control planes, TCP with
//! a cluster token).

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::Router;
use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post, put};
use serde::Deserialize;
use warren_http::{Error, Json, Path, Query};
use warren_types::api::{
    CreateSandbox, ExecRequest, FileList, ImageStats, Layer, MkdirRequest, NodeInfo, ProcessInfo,
    ProcessList, PtySize, RenameRequest, Sandbox as SandboxView, SandboxList, SandboxState,
    SetTimeout, SignalRequest, StdinRequest, TaskAction, TaskList, TaskResult,
};
use warren_types::error::{ApiError, ErrorCode};
use warren_types::id::SandboxId;

use crate::exec::{self, DEFAULT_EXEC_TIMEOUT};
use crate::node::{ListFilter, Node};

type S = State<Arc<Node>>;

/// Largest JSON body the node takes, bytes (the control plane's limit too).
pub const MAX_JSON_BODY: usize = 64 << 20;

/// The node API router. With a `token`, every request must carry `Authorization: Bearer <token>`.
pub fn router(node: Arc<Node>, token: Option<String>) -> Router {
    let r = Router::new()
        .route("/v1/node", get(node_info))
        .route("/v1/node/sandboxes", get(changes))
        .route("/v1/node/fncall", post(fncall))
        .route("/v1/sandboxes", post(create).get(list))
        .route("/v1/sandboxes/{id}", get(get_one).delete(kill))
        .route("/v1/sandboxes/{id}/pause", post(pause))
        .route("/v1/sandboxes/{id}/resume", post(resume))
        .route("/v1/sandboxes/{id}/timeout", post(set_timeout))
        .route(
            "/v1/sandboxes/{id}/network",
            get(get_network).put(put_network),
        )
        .route("/v1/tasks/{task}/network", put(put_task_network))
        .route("/v1/sandboxes/{id}/ports/{port}/connect", get(connect_port))
        .route("/v1/sandboxes/{id}/trajectory", get(trajectory))
        .route("/v1/sandboxes/{id}/metrics", get(metrics))
        .route("/v1/sandboxes/{id}/commit", post(commit))
        .route("/v1/images/stats", get(image_stats))
        .route("/v1/tasks", get(tasks))
        .route("/v1/events", get(events))
        .route("/v1/tasks/{task}/{action}", post(task_action))
        .route("/v1/sandboxes/{id}/exec", post(exec))
        .route("/v1/sandboxes/{id}/processes", post(spawn).get(processes))
        .route(
            "/v1/sandboxes/{id}/processes/{pid}",
            get(process).delete(forget),
        )
        .route("/v1/sandboxes/{id}/processes/{pid}/wait", post(wait))
        .route("/v1/sandboxes/{id}/processes/{pid}/signal", post(signal))
        .route("/v1/sandboxes/{id}/processes/{pid}/output", get(output))
        .route("/v1/sandboxes/{id}/processes/{pid}/stdin", post(stdin))
        .route("/v1/sandboxes/{id}/processes/{pid}/resize", post(resize))
        .route(
            "/v1/sandboxes/{id}/files",
            get(read_file).put(write_file).delete(remove),
        )
        .route("/v1/sandboxes/{id}/files/list", get(list_dir))
        .route(
            "/v1/sandboxes/{id}/files/tar",
            get(download_tar).put(upload_tar),
        )
        .route("/v1/sandboxes/{id}/files/stat", get(stat))
        .route("/v1/sandboxes/{id}/files/mkdir", post(mkdir))
        .route("/v1/sandboxes/{id}/files/rename", post(rename))
        .route("/v1/sandboxes/{id}/watches", post(watch_create))
        .route(
            "/v1/sandboxes/{id}/watches/{watch}",
            axum::routing::delete(watch_remove),
        )
        .route(
            "/v1/sandboxes/{id}/watches/{watch}/events",
            get(watch_events),
        )
        .fallback(warren_http::not_found)
        // The control plane checks bodies against the same limit (a replayed trajectory rides
        // in a create's body); uploads stream and have their own (max_upload).
        .layer(axum::extract::DefaultBodyLimit::max(MAX_JSON_BODY))
        .layer(axum::middleware::from_fn_with_state(node.clone(), scoped))
        .with_state(node);
    let r = match token {
        Some(t) => r.layer(axum::middleware::from_fn(
            move |req: Request, next: Next| {
                let t = t.clone();
                async move {
                    let ok = req
                        .headers()
                        .get(header::AUTHORIZATION)
                        .and_then(|v| v.to_str().ok())
                        .and_then(|v| v.strip_prefix("Bearer "))
                        .is_some_and(|v| warren_http::token_matches(v, &t));
                    if ok {
                        next.run(req).await
                    } else {
                        Error(ApiError::new(
                            ErrorCode::Unauthenticated,
                            "this node API needs the cluster token",
                        ))
                        .into_response()
                    }
                }
            },
        )),
        None => r,
    };
    // A request refused before its body was read still gets its answer (not a broken pipe).
    r.layer(axum::middleware::from_fn(warren_http::drain::unread_body))
}

/// Parses a sandbox id from a path and checks it is this node's.
pub fn parse_id(node: &Node, raw: &str) -> Result<SandboxId, Error> {
    let id: SandboxId = raw.parse().map_err(|e| {
        Error(ApiError::invalid(format!(
            "{e}; sandbox ids are what create returned"
        )))
    })?;
    if id.node() != node.id {
        return Err(Error(ApiError::new(
            ErrorCode::SandboxNotFound,
            format!(
                "sandbox {id} belongs to node {}, not this node ({})",
                id.node(),
                node.id
            ),
        )));
    }
    Ok(id)
}

async fn node_info(State(n): S) -> Json<NodeInfo> {
    Json(n.info())
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ChangesQuery {
    #[serde(default)]
    since: u64,
}

/// What changed in the node's set of sandboxes since a generation (the control plane's view).
async fn changes(
    State(n): S,
    Query(q): Query<ChangesQuery>,
) -> Json<warren_types::api::SandboxChanges> {
    Json(n.changes_since(q.since))
}

/// A function call on a worker of this node.
async fn fncall(
    State(n): S,
    Json(call): Json<warren_types::fncall::NodeCall>,
) -> Result<Json<warren_types::fncall::NodeCallResult>, Error> {
    Ok(Json(n.fncall(call).await?))
}

async fn create(
    State(n): S,
    headers: HeaderMap,
    Json(req): Json<CreateSandbox>,
) -> Result<Response, Error> {
    let key = headers.get("idempotency-key").map(|v| {
        v.to_str()
            .map(str::to_string)
            .map_err(|_| Error(ApiError::invalid("Idempotency-Key must be ASCII")))
    });
    let key = key.transpose()?;
    let (sb, created) = n.create(req, key).await?;
    let status = if created {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    Ok((status, Json(sb)).into_response())
}

/// `GET /v1/events` filters (the control plane turns `since` into `since_ms`).
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EventQuery {
    pub sandbox: Option<String>,
    pub task: Option<String>,
    pub kind: Option<String>,
    pub since_ms: Option<u64>,
}

async fn events(
    State(n): S,
    headers: HeaderMap,
    Query(q): Query<EventQuery>,
) -> Result<Json<warren_types::events::EventList>, Error> {
    let kind = q
        .kind
        .as_deref()
        .map(|k| {
            warren_types::events::EventKind::parse(k).ok_or_else(|| {
                let known: Vec<&str> = warren_types::events::EventKind::ALL
                    .iter()
                    .map(|k| k.name())
                    .collect();
                Error(ApiError::invalid(format!(
                    "unknown event kind {k:?} (known: {})",
                    known.join(", ")
                )))
            })
        })
        .transpose()?;
    let sandbox = q
        .sandbox
        .as_deref()
        .map(|s| {
            s.parse::<SandboxId>().map_err(|e| {
                Error(ApiError::invalid(format!(
                    "{e}; sandbox ids are what create returned"
                )))
            })
        })
        .transpose()?;
    let f = crate::events::EventFilter {
        sandbox,
        task: q.task,
        kind,
        since_ms: q.since_ms,
        // A limited caller sees the events of its projects' sandboxes, gone ones included:
        // each event keeps its sandbox's project.
        scope: scope_of(&headers),
    };
    let events = n.events.list(&n.id, &f);
    Ok(Json(warren_types::events::EventList { events }))
}

/// `GET /v1/sandboxes` filters.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ListQuery {
    /// Only this task's sandboxes.
    pub task: Option<String>,
    /// Only sandboxes with all these labels: `k=v,k2=v2`.
    pub label: Option<String>,
    /// Only sandboxes in this state.
    pub state: Option<SandboxState>,
}

/// Parses `k=v,k2=v2`.
pub fn parse_labels(s: &str) -> Result<BTreeMap<String, String>, Error> {
    s.split(',')
        .filter(|p| !p.is_empty())
        .map(|p| {
            p.split_once('=')
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .ok_or_else(|| {
                    Error(ApiError::invalid(format!(
                        "label filter {p:?} must be key=value"
                    )))
                })
        })
        .collect()
}

/// The control plane's scope of a request (`x-warren-scope`): the project subtrees it may act
/// on. None: no limit (the control plane's own calls).
fn scope_of(headers: &HeaderMap) -> Option<String> {
    headers
        .get(warren_types::project::SCOPE_HEADER)
        .and_then(|v| v.to_str().ok())
        .map(str::to_string)
}

/// Middleware: a request about one sandbox (`/v1/sandboxes/{id}...`) from a caller whose
/// scope does not hold the sandbox's project is answered 404 when the caller may not see it
/// either (ids of other projects' sandboxes do not leak), 403 when it may see it but not do
/// this.
async fn scoped(State(n): S, req: Request, next: Next) -> Response {
    let scope = scope_of(req.headers());
    let visible = req
        .headers()
        .get(warren_types::project::VISIBLE_HEADER)
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    if scope.is_none() && visible.is_none() {
        return next.run(req).await;
    }
    // Limited: a missing list is an empty one (fail closed).
    let scope = scope.unwrap_or_default();
    let visible = visible.unwrap_or_default();
    let raw = req
        .uri()
        .path()
        .strip_prefix("/v1/sandboxes/")
        .map(|rest| rest.split('/').next().unwrap_or(""));
    if let Some(raw) = raw {
        // Only a plain id: an escaped one (which the handler would decode) is not checked
        // here, so it is refused.
        let Ok(id) = raw.parse::<SandboxId>() else {
            return Error(ApiError::new(
                ErrorCode::SandboxNotFound,
                format!("sandbox {raw:?} not found"),
            ))
            .into_response();
        };
        if let Ok(sb) = n.get(&id) {
            let may = sb.in_scope(Some(&scope));
            let sees = may || sb.in_scope(Some(&visible));
            if !sees {
                return Error(ApiError::new(
                    ErrorCode::SandboxNotFound,
                    format!("sandbox {id} not found"),
                ))
                .into_response();
            }
            if !may {
                return Error(ApiError::new(
                    ErrorCode::PermissionDenied,
                    format!(
                        "this key may see sandbox {id} (project {}) but not do this to it",
                        sb.record.project
                    ),
                ))
                .into_response();
            }
        }
    }
    next.run(req).await
}

async fn list(
    State(n): S,
    headers: HeaderMap,
    Query(q): Query<ListQuery>,
) -> Result<Json<SandboxList>, Error> {
    let labels = q
        .label
        .as_deref()
        .map(parse_labels)
        .transpose()?
        .unwrap_or_default();
    let f = ListFilter {
        scope: scope_of(&headers),
        task: q.task,
        labels,
        state: q.state,
    };
    Ok(Json(SandboxList {
        sandboxes: n.list(&f),
    }))
}

async fn get_one(State(n): S, Path(id): Path<String>) -> Result<Json<SandboxView>, Error> {
    let id = parse_id(&n, &id)?;
    Ok(Json(n.get(&id)?.view(&n.id, &n.cfg.pool)))
}

async fn kill(State(n): S, Path(id): Path<String>) -> Result<StatusCode, Error> {
    let id = parse_id(&n, &id)?;
    n.kill(&id).await?;
    Ok(StatusCode::NO_CONTENT)
}

async fn pause(State(n): S, Path(id): Path<String>) -> Result<Json<SandboxView>, Error> {
    let id = parse_id(&n, &id)?;
    Ok(Json(n.pause(&id).await?))
}

async fn resume(State(n): S, Path(id): Path<String>) -> Result<Json<SandboxView>, Error> {
    let id = parse_id(&n, &id)?;
    Ok(Json(n.resume(&id).await?))
}

async fn set_timeout(
    State(n): S,
    Path(id): Path<String>,
    Json(req): Json<SetTimeout>,
) -> Result<Json<SandboxView>, Error> {
    let id = parse_id(&n, &id)?;
    Ok(Json(n.set_timeout(&id, req.timeout).await?))
}

async fn metrics(
    State(n): S,
    Path(id): Path<String>,
) -> Result<Json<warren_types::api::SandboxMetrics>, Error> {
    let id = parse_id(&n, &id)?;
    let node = n.clone();
    let m = tokio::task::spawn_blocking(move || node.metrics(&id))
        .await
        .map_err(|e| Error(ApiError::internal(format!("metrics task: {e}"))))??;
    Ok(Json(m))
}

async fn get_network(
    State(n): S,
    Path(id): Path<String>,
) -> Result<Json<warren_types::net::NetworkStatus>, Error> {
    let id = parse_id(&n, &id)?;
    Ok(Json(n.get(&id)?.network_status()))
}

async fn put_network(
    State(n): S,
    Path(id): Path<String>,
    Json(req): Json<warren_types::net::NetworkPolicy>,
) -> Result<Json<warren_types::net::NetworkStatus>, Error> {
    let id = parse_id(&n, &id)?;
    Ok(Json(n.set_network(&id, req).await?))
}

/// `?resume=false`: a paused sandbox is refused rather than resumed (the control plane's
/// unauthenticated `<port>-<id>` route asks so).
#[derive(Deserialize)]
struct ConnectQuery {
    #[serde(default = "yes")]
    resume: bool,
}

fn yes() -> bool {
    true
}

async fn connect_port(
    State(n): S,
    Path((id, port)): Path<(String, u16)>,
    Query(q): Query<ConnectQuery>,
    mut req: Request,
) -> Result<Response, Error> {
    let id = parse_id(&n, &id)?;
    warren_http::tunnel::check(req.headers())?;
    let (stream, busy, permit) = n.connect_port(&id, port, q.resume).await?;
    let stop = permit.stop.clone();
    Ok(warren_http::tunnel::accept(
        &mut req,
        stream,
        (busy, permit),
        async move { stop.cancelled().await },
    ))
}

async fn put_task_network(
    State(n): S,
    Path(task): Path<String>,
    headers: HeaderMap,
    Json(req): Json<warren_types::net::NetworkPolicy>,
) -> Result<Json<warren_types::api::TaskNetworkResult>, Error> {
    Ok(Json(
        n.set_task_network(&task, req, scope_of(&headers).as_deref())
            .await?,
    ))
}

async fn commit(
    State(n): S,
    Path(id): Path<String>,
    headers: HeaderMap,
) -> Result<(StatusCode, Json<Layer>), Error> {
    let id = parse_id(&n, &id)?;
    let creator = headers
        .get("x-warren-creator")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("admin")
        .to_string();
    Ok((StatusCode::CREATED, Json(n.commit(&id, &creator).await?)))
}

async fn image_stats(State(n): S) -> Json<ImageStats> {
    Json(n.image_stats())
}

async fn trajectory(State(n): S, Path(id): Path<String>) -> Result<Response, Error> {
    let id = parse_id(&n, &id)?;
    let sb = n.get(&id)?;
    if !sb.record.trajectory {
        return Err(Error(ApiError::invalid(format!(
            "sandbox {id} does not record its trajectory: create it with \"trajectory\": true"
        ))));
    }
    // Streamed, one entry at a time: a log can hold gigabytes.
    let (tx, rx) = tokio::sync::mpsc::channel(8);
    tokio::task::spawn_blocking(move || sb.trajectory.stream_trajectory(tx));
    let body = Body::from_stream(futures_util::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|b| (b, rx))
    }));
    Ok(([(header::CONTENT_TYPE, warren_http::NDJSON)], body).into_response())
}

async fn tasks(State(n): S, headers: HeaderMap) -> Json<TaskList> {
    Json(TaskList {
        tasks: n.tasks(scope_of(&headers).as_deref()),
    })
}

/// Parses a task action from a path.
pub fn parse_task_action(action: &str) -> Result<TaskAction, Error> {
    match action {
        "pause" => Ok(TaskAction::Pause),
        "resume" => Ok(TaskAction::Resume),
        "stop" => Ok(TaskAction::Stop),
        _ => Err(Error(ApiError::new(
            ErrorCode::NotFound,
            format!("no task action {action:?}: use pause, resume or stop"),
        ))),
    }
}

async fn task_action(
    State(n): S,
    Path((task, action)): Path<(String, String)>,
    headers: HeaderMap,
) -> Result<Json<TaskResult>, Error> {
    let action = parse_task_action(&action)?;
    Ok(Json(
        n.task_action(&task, action, scope_of(&headers).as_deref())
            .await,
    ))
}

fn wants_stream(headers: &HeaderMap, req: &ExecRequest) -> bool {
    req.stream
        || headers
            .get(header::ACCEPT)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.contains(warren_http::NDJSON))
}

async fn exec(
    State(n): S,
    Path(id): Path<String>,
    headers: HeaderMap,
    Json(req): Json<ExecRequest>,
) -> Result<Response, Error> {
    let id = parse_id(&n, &id)?;
    let req = image_defaults(&n, &id, req);
    let p = exec::prepare(&req, Some(DEFAULT_EXEC_TIMEOUT))?;
    if wants_stream(&headers, &req) {
        n.get(&id)?;
        return Ok(warren_http::ndjson::from_receiver(n.exec_stream(&id, p)));
    }
    Ok(Json(n.exec(&id, p).await?).into_response())
}

/// Fills in the user and working directory of the sandbox's image where the request has none.
fn image_defaults(n: &Node, id: &SandboxId, mut req: ExecRequest) -> ExecRequest {
    if let Ok(sb) = n.get(id)
        && req.role != Some(warren_types::api::Role::Grader)
    {
        if req.user.is_none() {
            req.user = sb.record.default_user.clone();
        }
        if req.cwd.is_none() {
            req.cwd = sb.record.default_cwd.clone();
        }
    }
    req
}

async fn spawn(
    State(n): S,
    Path(id): Path<String>,
    Json(req): Json<ExecRequest>,
) -> Result<(StatusCode, Json<ProcessInfo>), Error> {
    let id = parse_id(&n, &id)?;
    let req = image_defaults(&n, &id, req);
    let p = exec::prepare(&req, None)?;
    Ok((StatusCode::CREATED, Json(n.spawn_process(&id, p).await?)))
}

async fn processes(State(n): S, Path(id): Path<String>) -> Result<Json<ProcessList>, Error> {
    let id = parse_id(&n, &id)?;
    Ok(Json(ProcessList {
        processes: n.processes(&id).await?,
    }))
}

async fn process(
    State(n): S,
    Path((id, pid)): Path<(String, u64)>,
) -> Result<Json<ProcessInfo>, Error> {
    let id = parse_id(&n, &id)?;
    Ok(Json(n.wait_process(&id, pid, Some(0)).await?))
}

async fn forget(State(n): S, Path((id, pid)): Path<(String, u64)>) -> Result<StatusCode, Error> {
    let id = parse_id(&n, &id)?;
    n.forget_process(&id, pid).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// `POST .../processes/{pid}/wait` parameters.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WaitQuery {
    /// Seconds to wait at most (default: until it exits).
    pub timeout: Option<f64>,
}

async fn wait(
    State(n): S,
    Path((id, pid)): Path<(String, u64)>,
    Query(q): Query<WaitQuery>,
) -> Result<Json<ProcessInfo>, Error> {
    let id = parse_id(&n, &id)?;
    let ms = match q.timeout {
        Some(t) if !t.is_finite() || t < 0.0 => {
            return Err(Error(ApiError::invalid(
                "timeout must be a positive number of seconds",
            )));
        }
        Some(t) => Some((t * 1000.0) as u64),
        None => None,
    };
    Ok(Json(n.wait_process(&id, pid, ms).await?))
}

async fn signal(
    State(n): S,
    Path((id, pid)): Path<(String, u64)>,
    Json(req): Json<SignalRequest>,
) -> Result<StatusCode, Error> {
    let id = parse_id(&n, &id)?;
    n.signal_process(&id, pid, &req.signal).await?;
    Ok(StatusCode::NO_CONTENT)
}

async fn stdin(
    State(n): S,
    Path((id, pid)): Path<(String, u64)>,
    Json(req): Json<StdinRequest>,
) -> Result<StatusCode, Error> {
    let id = parse_id(&n, &id)?;
    let data = exec::text_or_base64(req.data.as_deref(), req.data_b64.as_deref(), "data")?;
    n.send_input(&id, pid, &data.unwrap_or_default(), req.close)
        .await?;
    Ok(StatusCode::NO_CONTENT)
}

async fn resize(
    State(n): S,
    Path((id, pid)): Path<(String, u64)>,
    Json(req): Json<PtySize>,
) -> Result<StatusCode, Error> {
    let id = parse_id(&n, &id)?;
    n.resize_terminal(&id, pid, req).await?;
    Ok(StatusCode::NO_CONTENT)
}

async fn output(State(n): S, Path((id, pid)): Path<(String, u64)>) -> Result<Response, Error> {
    let id = parse_id(&n, &id)?;
    // A process that does not exist is a 404, not an error event in a 200 stream.
    n.wait_process(&id, pid, Some(0)).await?;
    Ok(warren_http::ndjson::from_receiver(n.attach(&id, pid)))
}

/// File operation parameters.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileQuery {
    /// Path in the sandbox (absolute, or relative to the user's home).
    pub path: String,
    /// Acting user (default `user`).
    pub user: Option<String>,
    /// For uploads: permission bits in octal, e.g. `755`.
    pub mode: Option<String>,
    /// For removal: remove directories and their contents.
    #[serde(default)]
    pub recursive: bool,
    /// For uploads: metadata to set on the file, a JSON object of strings.
    pub metadata: Option<String>,
}

async fn read_file(
    State(n): S,
    Path(id): Path<String>,
    Query(q): Query<FileQuery>,
) -> Result<Response, Error> {
    let id = parse_id(&n, &id)?;
    let (entry, stream) = n.read_file(&id, q.path, q.user).await?;
    Ok(Response::builder()
        .header(header::CONTENT_TYPE, "application/octet-stream")
        .header("x-warren-file-size", entry.size)
        .header("x-warren-file-mode", format!("{:o}", entry.mode))
        .body(Body::from_stream(stream))
        .unwrap_or_default())
}

/// Parses an octal mode such as `755` or `0o644`.
pub fn parse_mode(m: &str) -> Result<u32, Error> {
    let digits = m.trim_start_matches("0o");
    u32::from_str_radix(digits, 8)
        .ok()
        .filter(|v| *v <= 0o7777)
        .ok_or_else(|| {
            Error(ApiError::invalid(format!(
                "mode {m:?} must be octal permission bits such as 644 or 755"
            )))
        })
}

async fn write_file(
    State(n): S,
    Path(id): Path<String>,
    Query(q): Query<FileQuery>,
    headers: HeaderMap,
    body: Body,
) -> Result<Json<warren_types::api::FileEntry>, Error> {
    let id = parse_id(&n, &id)?;
    let mode = q.mode.as_deref().map(parse_mode).transpose()?;
    let metadata = match q.metadata.as_deref() {
        None | Some("") => BTreeMap::new(),
        Some(m) => {
            let m: BTreeMap<String, String> = serde_json::from_str(m).map_err(|e| {
                Error(ApiError::invalid(format!(
                    "metadata must be a JSON object of strings: {e}"
                )))
            })?;
            warren_types::api::check_file_metadata(&m).map_err(|e| Error(ApiError::invalid(e)))?
        }
    };
    check_declared_size(&n, &headers)?;
    Ok(Json(
        n.write_file(&id, q.path, q.user, mode, metadata, body.into_data_stream())
            .await?,
    ))
}

async fn download_tar(
    State(n): S,
    Path(id): Path<String>,
    Query(q): Query<FileQuery>,
) -> Result<Response, Error> {
    let id = parse_id(&n, &id)?;
    let (_, stream) = n.download_tar(&id, q.path, q.user).await?;
    Ok(Response::builder()
        .header(header::CONTENT_TYPE, "application/x-tar")
        .body(Body::from_stream(stream))
        .unwrap_or_default())
}

async fn upload_tar(
    State(n): S,
    Path(id): Path<String>,
    Query(q): Query<FileQuery>,
    headers: HeaderMap,
    body: Body,
) -> Result<Json<warren_types::api::FileEntry>, Error> {
    let id = parse_id(&n, &id)?;
    check_declared_size(&n, &headers)?;
    Ok(Json(
        n.upload_tar(&id, q.path, q.user, body.into_data_stream())
            .await?,
    ))
}

/// Refuses a body whose declared size is over `max_upload` before reading it.
fn check_declared_size(n: &Node, headers: &HeaderMap) -> Result<(), Error> {
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|len| len > n.cfg.max_upload.bytes()) {
        return Err(Error(ApiError::new(
            ErrorCode::PayloadTooLarge,
            format!(
                "the upload is larger than the {} allowed (max_upload)",
                n.cfg.max_upload
            ),
        )));
    }
    Ok(())
}

async fn remove(
    State(n): S,
    Path(id): Path<String>,
    Query(q): Query<FileQuery>,
) -> Result<StatusCode, Error> {
    let id = parse_id(&n, &id)?;
    n.remove(&id, q.path, q.user, q.recursive).await?;
    Ok(StatusCode::NO_CONTENT)
}

async fn list_dir(
    State(n): S,
    Path(id): Path<String>,
    Query(q): Query<FileQuery>,
) -> Result<Json<FileList>, Error> {
    let id = parse_id(&n, &id)?;
    Ok(Json(FileList {
        entries: n.list_dir(&id, q.path, q.user).await?,
    }))
}

async fn stat(
    State(n): S,
    Path(id): Path<String>,
    Query(q): Query<FileQuery>,
) -> Result<Json<warren_types::api::FileEntry>, Error> {
    let id = parse_id(&n, &id)?;
    Ok(Json(n.stat(&id, q.path, q.user).await?))
}

async fn mkdir(
    State(n): S,
    Path(id): Path<String>,
    Json(req): Json<MkdirRequest>,
) -> Result<Json<warren_types::api::FileEntry>, Error> {
    let id = parse_id(&n, &id)?;
    Ok(Json(n.mkdir(&id, req.path, req.user, req.parents).await?))
}

async fn rename(
    State(n): S,
    Path(id): Path<String>,
    Json(req): Json<RenameRequest>,
) -> Result<Json<warren_types::api::FileEntry>, Error> {
    let id = parse_id(&n, &id)?;
    Ok(Json(n.rename(&id, req.from, req.to, req.user).await?))
}

async fn watch_create(
    State(n): S,
    Path(id): Path<String>,
    Json(req): Json<warren_types::api::WatchRequest>,
) -> Result<(StatusCode, Json<warren_types::api::WatchInfo>), Error> {
    let id = parse_id(&n, &id)?;
    let watch_id = n.watch_create(&id, req).await?;
    Ok((
        StatusCode::CREATED,
        Json(warren_types::api::WatchInfo { watch_id }),
    ))
}

/// `GET .../watches/{watch}/events` parameters.
#[derive(Debug, Deserialize)]
struct WatchEventsQuery {
    /// Seconds to wait for an event when there is none (at most 60; default none).
    wait: Option<f64>,
}

async fn watch_events(
    State(n): S,
    Path((id, watch)): Path<(String, u64)>,
    Query(q): Query<WatchEventsQuery>,
) -> Result<Json<warren_types::api::WatchEvents>, Error> {
    let id = parse_id(&n, &id)?;
    let ms = match q.wait {
        Some(t) if !t.is_finite() || !(0.0..=60.0).contains(&t) => {
            return Err(Error(ApiError::invalid("wait must be 0 to 60 seconds")));
        }
        Some(t) => (t * 1000.0) as u64,
        None => 0,
    };
    Ok(Json(n.watch_events(&id, watch, ms).await?))
}

async fn watch_remove(
    State(n): S,
    Path((id, watch)): Path<(String, u64)>,
) -> Result<StatusCode, Error> {
    let id = parse_id(&n, &id)?;
    n.watch_remove(&id, watch).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// The one place a node error becomes an HTTP answer: the domain below knows nothing of HTTP.
impl From<crate::error::NodeError> for Error {
    fn from(e: crate::error::NodeError) -> Self {
        Error(e.to_api())
    }
}
