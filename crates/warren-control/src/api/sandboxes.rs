//! Sandbox lifecycle: create, list, get, pause, resume, kill.

use std::sync::Arc;

use axum::body::Body;
use axum::http::{HeaderMap, Method, Uri};
use axum::response::Response;
use warren_http::{Error, Json, Path, Query};
use warren_types::api::{
    CreateSandbox, Gathered, Sandbox, SandboxList, SandboxState, SetTimeout, TrajectoryEntry,
};
use warren_types::error::{ApiError, ErrorBody, ErrorCode};
use warren_types::net::{NetworkPolicy, NetworkStatus};

use super::forward::forward_json;
use super::{S, pass};
use crate::create_keys::{self, Claim};
use crate::fanout::{self, Policy};
use crate::node_api::SandboxFilter;
use crate::scheduler::{self, InFlight};

/// Create a container sandbox.
///
/// Placed on a node by power-of-k choice; the node's admission check has the last word, and a
/// refusal sends the request to the next candidate. With `Idempotency-Key`, a retried request
/// returns the sandbox the first one made (status 200 instead of 201).
#[utoipa::path(post, path = "/v1/sandboxes", tag = "sandboxes",
    request_body = CreateSandbox,
    params(("Idempotency-Key" = Option<String>, Header, description = "Makes retries safe: the same key returns the same sandbox.")),
    responses(
        (status = 201, description = "Created and ready for commands (paused, if its task was paused while the create was in flight: any operation resumes it).", body = Sandbox),
        (status = 200, description = "An earlier request with this Idempotency-Key made it.", body = Sandbox),
        (status = 400, description = "Bad request: the message says which field.", body = ErrorBody),
        (status = 404, description = "Unknown image.", body = ErrorBody),
        (status = 410, description = "The sandbox's task was stopped while this create was in flight: the sandbox was killed as it started, or not started.", body = ErrorBody),
        (status = 429, description = "No node has room: retry after Retry-After seconds, or ask for less.", body = ErrorBody),
    ),
    security(("api_key" = [])))]
pub async fn create(
    axum::extract::State(c): S,
    axum::Extension(who): axum::Extension<Arc<crate::iam::Principal>>,
    mut headers: HeaderMap,
    Json(mut req): Json<CreateSandbox>,
) -> Result<Response, Error> {
    // Its project: the key's unless it names one, where the key must hold sandbox.create.
    let project = req.project.clone().unwrap_or_else(|| who.project.clone());
    warren_types::project::check_path(&project).map_err(|e| Error(ApiError::invalid(e)))?;
    if !who.allows(crate::iam::Perm::SandboxCreate, &project) {
        return Err(Error(ApiError::new(
            ErrorCode::PermissionDenied,
            format!(
                "identity {} (key {}) does not hold sandbox.create on {project}",
                who.identity, who.key_id
            ),
        )));
    }
    super::project_must_exist(&c, &project).await?;
    // Quotas of the project and its ancestors, against what the nodes hold.
    let quotas = c.iam.quotas().await.map_err(|e| Error(e.into()))?;
    let reserved = if quotas
        .keys()
        .any(|q| warren_types::project::within(&project, q))
    {
        let ask = crate::nodes::Totals {
            sandboxes: 1,
            cpu: u64::from(req.cpu.unwrap_or(10)),
            memory: req.memory.map(|m| m.bytes()).unwrap_or(64 << 20),
        };
        Some(
            c.usage
                .reserve(&c.nodes, &quotas, &project, ask)
                .map_err(Error)?,
        )
    } else {
        None
    };
    // Images other than the built-in one are resolved here, from the catalog: nodes get
    // layers. Each must be the project's or an ancestor's.
    req.resolved = if req.image.trim() == "host" {
        None
    } else {
        Some(
            c.catalog
                .resolve_for(&req.image, &project)
                .await
                .map_err(super::images::image_error)?,
        )
    };
    req.project = Some(project);
    // Idempotency keys are per project: the same key from two projects makes two sandboxes
    // (and never hands one project the other's).
    if let Some(k) = headers.get("idempotency-key").and_then(|v| v.to_str().ok()) {
        use sha2::Digest;
        let mut h = sha2::Sha256::new();
        h.update(req.project.as_deref().unwrap_or_default().as_bytes());
        h.update([0]);
        h.update(k.as_bytes());
        let derived: String = h.finalize().iter().map(|b| format!("{b:02x}")).collect();
        if let Ok(v) = axum::http::HeaderValue::from_str(&derived) {
            headers.insert("idempotency-key", v);
        }
    }
    let key = headers.get("idempotency-key").and_then(|v| v.to_str().ok());
    check_selector(&req.node_selector)?;
    // The requests (a node's defaults are 64Mi and 10m), for the overlay and eligibility.
    let ask = scheduler::Ask {
        memory: req
            .memory
            .map(|m| m.bytes())
            .unwrap_or(64 << 20)
            .min(1 << 50),
        cpu: u64::from(req.cpu.unwrap_or(10)),
        backend: req.backend.unwrap_or_default(),
        selector: &req.node_selector,
        burst_above: c.cfg.burst_above(&req.image),
    };
    let nodes = c.nodes.snapshot();
    if nodes.is_empty() {
        return Err(Error(ApiError::new(
            ErrorCode::Unavailable,
            "no nodes are registered: start a node daemon (warren node --join URL)",
        )));
    }
    let mut order = scheduler::candidates(
        &nodes,
        c.cfg.schedule_k,
        c.cfg.schedule_attempts,
        &ask,
        None,
        &mut rand::rng(),
    );
    // A keyed create on several nodes: placed by load, its node recorded in the database, so
    // a retry through any replica goes where the first went (see `create_keys`).
    let mut recorded = None;
    if let Some(k) = key
        && nodes.len() > 1
        && let Some(first) = order.first()
    {
        match create_keys::claim(&c.db, k, &first.id).await {
            Claim::Ours => recorded = Some(k),
            Claim::Theirs(id) => match c.nodes.get(&id) {
                Some(n) => order = vec![n],
                None => recorded = None,
            },
            Claim::Unavailable => {
                // Without the database: an order fixed by the key, idempotent across replicas.
                order = scheduler::candidates(
                    &nodes,
                    c.cfg.schedule_k,
                    c.cfg.schedule_attempts,
                    &ask,
                    Some(k),
                    &mut rand::rng(),
                );
            }
        }
    } else if key.is_some() {
        order = scheduler::candidates(
            &nodes,
            c.cfg.schedule_k,
            c.cfg.schedule_attempts,
            &ask,
            key,
            &mut rand::rng(),
        );
    }
    if order.is_empty() {
        no_candidate(&nodes, &ask, &req)?;
        let cordoned = nodes.iter().filter(|n| n.is_cordoned()).count();
        return Err(Error(ApiError::new(
            ErrorCode::Unavailable,
            format!(
                "no node takes new sandboxes: of {} nodes, {} do not answer and {cordoned} are \
                 cordoned; check the node daemons (warren node ls)",
                nodes.len(),
                nodes.iter().filter(|n| !n.is_up()).count()
            ),
        )));
    }
    let mut last = None;
    let mut all_full = true;
    let mut prev: Option<&Arc<crate::nodes::NodeEntry>> = None;
    for node in &order {
        if let (Some(k), Some(p)) = (recorded, prev) {
            create_keys::moved(&c.db, k, &p.id, &node.id).await;
        }
        prev = Some(node);
        let inflight = c
            .cfg
            .schedule_overlay
            .then(|| InFlight::new(node.clone(), &ask));
        match forward_json(node, Method::POST, "/v1/sandboxes", &headers, &req).await {
            // Full (429) or too busy to finish now (503): the next candidate may do it.
            Ok(resp) if matches!(resp.status().as_u16(), 429 | 503) => {
                all_full &= resp.status().as_u16() == 429;
                last = Some(Ok(resp));
            }
            Ok(resp) => {
                if resp.status() == axum::http::StatusCode::CREATED
                    && let Some(f) = inflight
                {
                    f.placed();
                }
                return match reserved {
                    Some(r) if resp.status() == axum::http::StatusCode::CREATED => {
                        made(resp, r).await
                    }
                    _ => Ok(resp),
                };
            }
            Err(e) => {
                tracing::warn!(node_id = %node.id, "create: {}", e.0.message);
                all_full = false;
                last = Some(Err(e));
            }
        }
    }
    // Every node said it is full (none made the sandbox): a retry with this key is placed
    // afresh. (A node too busy to finish, or one that did not answer, may still make it: its
    // record stays.)
    if let (Some(k), Some(p), true) = (key.filter(|_| nodes.len() > 1), prev, all_full) {
        create_keys::refused(&c.db, k, &p.id).await;
    }
    last.unwrap_or_else(|| Err(Error(ApiError::capacity("no node accepted the sandbox", 2))))
}

/// A create counted against quotas made its sandbox: reads the answer for its id (so the
/// count moves to the view once the view shows it) and gives the answer back.
async fn made(resp: Response, r: crate::quota::Reserved) -> Result<Response, Error> {
    let (parts, body) = resp.into_parts();
    let bytes = axum::body::to_bytes(body, 16 << 20).await.map_err(|e| {
        Error(ApiError::internal(format!(
            "reading the node's answer: {e}"
        )))
    })?;
    if let Ok(sb) = serde_json::from_slice::<Sandbox>(&bytes) {
        r.made(sb.id);
    }
    Ok(Response::from_parts(parts, Body::from(bytes)))
}

/// Why no node is a candidate, when no node of the cluster could ever be: none has the
/// backend, or none with it has the selector's labels (400). Otherwise Ok: they are down or
/// cordoned.
fn no_candidate(
    nodes: &[Arc<crate::nodes::NodeEntry>],
    ask: &scheduler::Ask,
    req: &CreateSandbox,
) -> Result<(), Error> {
    let backend = ask.backend;
    if !nodes
        .iter()
        .any(|n| n.with_report(|i| scheduler::has_backend(i, backend)))
    {
        return Err(Error(ApiError::invalid(format!(
            "no node of this cluster has the {backend} backend: leave backend out for containers"
        ))));
    }
    if !nodes.iter().any(|n| {
        n.with_report(|i| scheduler::has_backend(i, backend) && scheduler::matches(i, ask.selector))
    }) {
        return Err(Error(ApiError::invalid(format!(
            "no node of this cluster with the {backend} backend has the labels {}: see the \
             nodes' labels with warren node ls, or leave node_selector out",
            req.node_selector
                .iter()
                .map(|(k, v)| format!("{k}={v}"))
                .collect::<Vec<_>>()
                .join(",")
        ))));
    }
    Ok(())
}

/// Most labels in a node selector.
const MAX_SELECTOR: usize = 16;

/// A node selector's shape: node labels are checked the same way when a node starts.
fn check_selector(sel: &std::collections::BTreeMap<String, String>) -> Result<(), Error> {
    if sel.len() > MAX_SELECTOR {
        return Err(Error(ApiError::invalid(format!(
            "node_selector has {} labels; at most {MAX_SELECTOR} are allowed",
            sel.len()
        ))));
    }
    for (k, v) in sel {
        let ok = !k.is_empty()
            && k.len() <= 63
            && k.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"._-:/".contains(&b));
        if !ok {
            return Err(Error(ApiError::invalid(format!(
                "node_selector key {k:?} is not valid: use 1 to 63 letters, digits and . _ - : /"
            ))));
        }
        if v.len() > 256 || v.contains('\0') {
            return Err(Error(ApiError::invalid(format!(
                "node_selector {k:?}: the value must be at most 256 bytes without NUL"
            ))));
        }
    }
    Ok(())
}

/// `GET /v1/sandboxes` filters.
#[derive(Debug, Default, serde::Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct ListQuery {
    /// Only this task's sandboxes.
    pub task: Option<String>,
    /// Only sandboxes with all these labels, as `key=value,key2=value2`.
    #[param(pattern = "^(([^,=]*=[^,]*)?,)*([^,=]*=[^,]*)?$")]
    pub label: Option<String>,
    /// Only sandboxes in this state.
    pub state: Option<SandboxState>,
}

/// List sandboxes, oldest first.
///
/// Every node is asked. A node that does not answer is named in `unreachable`, and its
/// sandboxes are listed as last heard, in state `unknown` (filtered by task and labels as
/// heard); when no node answers the call fails with 503.
#[utoipa::path(get, path = "/v1/sandboxes", tag = "sandboxes", params(ListQuery),
    responses((status = 200, body = Gathered<SandboxList>), (status = 400, body = ErrorBody),
        (status = 503, description = "No node answered.", body = ErrorBody)),
    security(("api_key" = [])))]
pub async fn list(
    axum::extract::State(c): S,
    headers: HeaderMap,
    Query(q): Query<ListQuery>,
) -> Result<Json<Gathered<SandboxList>>, Error> {
    let scope = super::access::scope_of(&headers);
    let labels = parse_label_filter(q.label.as_deref())?;
    // Nodes have no sandbox in state unknown: they are asked for none.
    let ask_nodes = q.state != Some(SandboxState::Unknown);
    let filter = SandboxFilter {
        scope: scope.clone(),
        task: q.task.clone(),
        label: q.label.clone(),
        state: q.state,
    };
    let filter = &filter;
    // Nodes that did not answer the last poll are not waited for: their sandboxes are listed
    // from the view, as unknown.
    let (up, down): (Vec<_>, Vec<_>) = c.nodes.all().into_iter().partition(|n| n.is_up());
    if up.is_empty() && !down.is_empty() {
        return Err(Error(ApiError::new(
            ErrorCode::Unavailable,
            format!(
                "listing sandboxes: none of the {} nodes answered the last poll; check the node \
                 daemons (warren node ls)",
                down.len()
            ),
        )));
    }
    let mut parts = fanout::ask(up.clone(), |n| async move {
        if ask_nodes {
            n.api().sandboxes(filter).await
        } else {
            Ok(SandboxList::default())
        }
    })
    .await
    .under(Policy::Partial, "listing sandboxes")?;
    for n in &down {
        parts.unreachable.push(warren_types::api::NodeFailure {
            node: n.id.clone(),
            error: super::forward::unavailable(n, &"it did not answer the last poll").0,
        });
    }
    let mut all: Vec<Sandbox> = parts.answer.into_iter().flat_map(|l| l.sandboxes).collect();
    if q.state.is_none_or(|s| s == SandboxState::Unknown) {
        for f in &parts.unreachable {
            let n = up.iter().chain(&down).find(|n| n.id == f.node);
            if let Some(n) = n {
                all.extend(n.unknown_sandboxes(|sb| {
                    scope
                        .as_deref()
                        .is_none_or(|s| warren_types::project::in_scope_list(s, &sb.project))
                        && q.task.as_ref().is_none_or(|t| sb.task.as_ref() == Some(t))
                        && labels
                            .iter()
                            .all(|(k, v)| sb.labels.get(*k).map(String::as_str) == Some(*v))
                }));
            }
        }
    }
    all.sort_by(|a, b| {
        a.created_at
            .cmp(&b.created_at)
            .then_with(|| a.id.cmp(&b.id))
    });
    Ok(Json(Gathered {
        answer: SandboxList { sandboxes: all },
        unreachable: parts.unreachable,
    }))
}

/// `key=value,key2=value2` as pairs.
fn parse_label_filter(s: Option<&str>) -> Result<Vec<(&str, &str)>, Error> {
    let mut out = Vec::new();
    for part in s.unwrap_or("").split(',').filter(|p| !p.is_empty()) {
        match part.split_once('=') {
            Some((k, v)) => out.push((k, v)),
            None => {
                return Err(Error(ApiError::invalid(format!(
                    "label filter {part:?} must be key=value"
                ))));
            }
        }
    }
    Ok(out)
}

/// Get one sandbox.
#[utoipa::path(get, path = "/v1/sandboxes/{id}", tag = "sandboxes",
    params(("id" = String, Path, description = "Sandbox id.")),
    responses((status = 200, body = Sandbox), (status = 400, body = ErrorBody), (status = 404, body = ErrorBody)),
    security(("api_key" = [])))]
pub async fn get(
    axum::extract::State(c): S,
    Path(id): Path<String>,
    uri: Uri,
    headers: HeaderMap,
) -> Result<Response, Error> {
    pass(&c, &id, Method::GET, &uri, &headers, Body::empty()).await
}

/// Kill a sandbox and release everything it held. Legal in every state.
#[utoipa::path(delete, path = "/v1/sandboxes/{id}", tag = "sandboxes",
    params(("id" = String, Path, description = "Sandbox id.")),
    responses((status = 204, description = "Killed."), (status = 404, body = ErrorBody)),
    security(("api_key" = [])))]
pub async fn kill(
    axum::extract::State(c): S,
    Path(id): Path<String>,
    uri: Uri,
    headers: HeaderMap,
) -> Result<Response, Error> {
    pass(&c, &id, Method::DELETE, &uri, &headers, Body::empty()).await
}

/// Pause (freeze) a sandbox: its processes stop, memory is kept. Any later operation on it
/// resumes it first. Pausing a paused sandbox is a no-op.
#[utoipa::path(post, path = "/v1/sandboxes/{id}/pause", tag = "sandboxes",
    params(("id" = String, Path, description = "Sandbox id.")),
    responses((status = 200, body = Sandbox), (status = 404, body = ErrorBody)),
    security(("api_key" = [])))]
pub async fn pause(
    axum::extract::State(c): S,
    Path(id): Path<String>,
    uri: Uri,
    headers: HeaderMap,
) -> Result<Response, Error> {
    pass(&c, &id, Method::POST, &uri, &headers, Body::empty()).await
}

/// Resume a paused sandbox. Resuming a running sandbox is a no-op.
#[utoipa::path(post, path = "/v1/sandboxes/{id}/resume", tag = "sandboxes",
    params(("id" = String, Path, description = "Sandbox id.")),
    responses((status = 200, body = Sandbox), (status = 404, body = ErrorBody)),
    security(("api_key" = [])))]
pub async fn resume(
    axum::extract::State(c): S,
    Path(id): Path<String>,
    uri: Uri,
    headers: HeaderMap,
) -> Result<Response, Error> {
    pass(&c, &id, Method::POST, &uri, &headers, Body::empty()).await
}

/// Give a sandbox a new absolute lifetime, counted from now (extend or shorten it). Legal in
/// every state; a paused sandbox stays paused.
#[utoipa::path(post, path = "/v1/sandboxes/{id}/timeout", tag = "sandboxes",
    params(("id" = String, Path, description = "Sandbox id.")),
    request_body = SetTimeout,
    responses((status = 200, body = Sandbox), (status = 400, body = ErrorBody), (status = 404, body = ErrorBody)),
    security(("api_key" = [])))]
pub async fn set_timeout(
    axum::extract::State(c): S,
    Path(id): Path<String>,
    uri: Uri,
    headers: HeaderMap,
    Json(req): Json<SetTimeout>,
) -> Result<Response, Error> {
    super::pass_json(&c, &id, &uri, &headers, &req).await
}

/// The sandbox's network: its mode, addresses, gateway (its only DNS resolver) and policy.
#[utoipa::path(get, path = "/v1/sandboxes/{id}/network", tag = "network",
    params(("id" = String, Path, description = "Sandbox id.")),
    responses((status = 200, body = NetworkStatus), (status = 404, body = ErrorBody)),
    security(("api_key" = [])))]
pub async fn get_network(
    axum::extract::State(c): S,
    Path(id): Path<String>,
    uri: Uri,
    headers: HeaderMap,
) -> Result<Response, Error> {
    pass(&c, &id, Method::GET, &uri, &headers, Body::empty()).await
}

/// Replace the sandbox's network policy. New connections follow it at once; an open
/// connection is judged again at its next packet, and one the new policy no longer allows is
/// reset. Addresses an allowed domain resolved to stay allowed while the new policy still
/// allows that domain. `{"mode": "none"}` denies everything (a sandbox created with an
/// interface keeps it); a sandbox created with mode `none` has no interface and takes no
/// other policy (400). Rules that allow only what no sandbox may reach (the node, other
/// sandboxes, the control plane, private networks, loopback, link-local and metadata
/// addresses, unless the node exempts a range) are refused (400); `0.0.0.0/0` and `::/0` allow
/// the public internet.
#[utoipa::path(put, path = "/v1/sandboxes/{id}/network", tag = "network",
    params(("id" = String, Path, description = "Sandbox id.")),
    request_body = NetworkPolicy,
    responses((status = 200, body = NetworkStatus), (status = 400, body = ErrorBody),
        (status = 404, body = ErrorBody)),
    security(("api_key" = [])))]
pub async fn set_network(
    axum::extract::State(c): S,
    axum::Extension(who): axum::Extension<Arc<crate::iam::Principal>>,
    from: super::iam::Source,
    Path(id): Path<String>,
    uri: Uri,
    headers: HeaderMap,
    Json(req): Json<NetworkPolicy>,
) -> Result<Response, Error> {
    req.parse()
        .map_err(|e| Error(ApiError::invalid(format!("network: {e}"))))?;
    let resp = super::pass_json_as(&c, &id, Method::PUT, &uri, &headers, &req).await?;
    if resp.status().is_success() {
        super::iam::audited(
            &c,
            &who,
            &from,
            "network.set",
            &format!("sandbox {id}"),
            None,
            Some(&super::iam::policy_detail(&req)),
        )
        .await;
    }
    Ok(resp)
}

/// What the sandbox uses now: CPU time and its share of the CPU limit, memory (and page
/// cache) against the memory limit, disk against the quota. Measured when asked; a paused
/// sandbox's figures are those it was paused with.
#[utoipa::path(get, path = "/v1/sandboxes/{id}/metrics", tag = "sandboxes",
    params(("id" = String, Path, description = "Sandbox id.")),
    responses((status = 200, body = warren_types::api::SandboxMetrics),
        (status = 400, body = ErrorBody), (status = 404, body = ErrorBody)),
    security(("api_key" = [])))]
pub async fn metrics(
    axum::extract::State(c): S,
    Path(id): Path<String>,
    uri: Uri,
    headers: HeaderMap,
) -> Result<Response, Error> {
    pass(&c, &id, Method::GET, &uri, &headers, Body::empty()).await
}

/// The sandbox's trajectory log: every exec and file write, as JSON lines
/// ([`TrajectoryEntry`]), oldest first. Only for sandboxes created with `"trajectory": true`.
/// Pass the entries as `replay` to create a sandbox that rebuilds this one's state and answers
/// the same leading operations with these results.
#[utoipa::path(get, path = "/v1/sandboxes/{id}/trajectory", tag = "sandboxes",
    params(("id" = String, Path, description = "Sandbox id.")),
    responses((status = 200, body = TrajectoryEntry, content_type = "application/x-ndjson"),
        (status = 400, body = ErrorBody), (status = 404, body = ErrorBody)),
    security(("api_key" = [])))]
pub async fn trajectory(
    axum::extract::State(c): S,
    Path(id): Path<String>,
    uri: Uri,
    headers: HeaderMap,
) -> Result<Response, Error> {
    pass(&c, &id, Method::GET, &uri, &headers, Body::empty()).await
}
