//! Sandbox lifecycle: create, list, get, pause, resume, kill.

use axum::body::Body;
use axum::http::{HeaderMap, Method, Uri};
use axum::response::Response;
use warren_http::{Error, Json, Path, Query};
use warren_types::api::{
    BackendKind, CreateSandbox, Gathered, Sandbox, SandboxList, SandboxState, SetTimeout,
    TrajectoryEntry,
};
use warren_types::error::{ApiError, ErrorBody, ErrorCode};
use warren_types::net::{NetworkPolicy, NetworkStatus};

use super::forward::forward_json;
use super::{S, pass};
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
        (status = 201, description = "Created and ready for commands.", body = Sandbox),
        (status = 200, description = "An earlier request with this Idempotency-Key made it.", body = Sandbox),
        (status = 400, description = "Bad request: the message says which field.", body = ErrorBody),
        (status = 404, description = "Unknown image.", body = ErrorBody),
        (status = 429, description = "No node has room: retry after Retry-After seconds, or ask for less.", body = ErrorBody),
    ),
    security(("api_key" = [])))]
pub async fn create(
    axum::extract::State(c): S,
    headers: HeaderMap,
    Json(mut req): Json<CreateSandbox>,
) -> Result<Response, Error> {
    // Images other than the built-in one are resolved here, from the catalog: nodes get layers.
    req.resolved = if req.image.trim() == "host" {
        None
    } else {
        Some(
            c.catalog
                .resolve(&req.image)
                .await
                .map_err(super::images::image_error)?,
        )
    };
    let key = headers.get("idempotency-key").and_then(|v| v.to_str().ok());
    // The request (a node's default is 64Mi), for the overlay and eligibility.
    let memory = req
        .memory
        .map(|m| m.bytes())
        .unwrap_or(64 << 20)
        .min(1 << 50);
    let nodes = c.nodes.all();
    if nodes.is_empty() {
        return Err(Error(ApiError::new(
            ErrorCode::Unavailable,
            "no nodes are registered: start a node daemon",
        )));
    }
    // Only nodes that have the backend asked for (a node from before backends were reported
    // runs containers).
    let backend = req.backend.unwrap_or_default();
    let nodes: Vec<_> = nodes
        .into_iter()
        .filter(|n| {
            let b = n.info().backends;
            b.contains(&backend) || (b.is_empty() && backend == BackendKind::Container)
        })
        .collect();
    if nodes.is_empty() {
        return Err(Error(ApiError::invalid(format!(
            "no node of this cluster has the {backend} backend: leave backend out for containers"
        ))));
    }
    let order = scheduler::candidates(&nodes, c.cfg.schedule_k, memory, key);
    if order.is_empty() {
        return Err(Error(ApiError::new(
            ErrorCode::Unavailable,
            "no node answers: check the node daemons",
        )));
    }
    let mut last = None;
    for node in order {
        let _inflight = InFlight::new(node.clone(), memory);
        match forward_json(&node, Method::POST, "/v1/sandboxes", &headers, &req).await {
            // Full (429) or too busy to finish now (503): the next candidate may do it.
            Ok(resp) if matches!(resp.status().as_u16(), 429 | 503) => last = Some(Ok(resp)),
            Ok(resp) => return Ok(resp),
            Err(e) => {
                tracing::warn!(node_id = %node.id, "create: {}", e.0.message);
                last = Some(Err(e));
            }
        }
    }
    last.unwrap_or_else(|| Err(Error(ApiError::capacity("no node accepted the sandbox", 2))))
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
/// Every node is asked; a node that does not answer is named in `unreachable` (its sandboxes
/// are missing from the list), and when no node answers the call fails with 503.
#[utoipa::path(get, path = "/v1/sandboxes", tag = "sandboxes", params(ListQuery),
    responses((status = 200, body = Gathered<SandboxList>), (status = 400, body = ErrorBody),
        (status = 503, description = "No node answered.", body = ErrorBody)),
    security(("api_key" = [])))]
pub async fn list(
    axum::extract::State(c): S,
    Query(q): Query<ListQuery>,
) -> Result<Json<Gathered<SandboxList>>, Error> {
    let filter = SandboxFilter {
        task: q.task,
        label: q.label,
        state: q.state,
    };
    let filter = &filter;
    let parts = fanout::ask(
        c.nodes.all(),
        |n| async move { n.api().sandboxes(filter).await },
    )
    .await
    .under(Policy::Partial, "listing sandboxes")?;
    let mut all: Vec<Sandbox> = parts.answer.into_iter().flat_map(|l| l.sandboxes).collect();
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
/// other policy (400). Rules that allow what no sandbox may reach (the node, other sandboxes,
/// loopback, link-local and metadata addresses) are refused (400).
#[utoipa::path(put, path = "/v1/sandboxes/{id}/network", tag = "network",
    params(("id" = String, Path, description = "Sandbox id.")),
    request_body = NetworkPolicy,
    responses((status = 200, body = NetworkStatus), (status = 400, body = ErrorBody),
        (status = 404, body = ErrorBody)),
    security(("api_key" = [])))]
pub async fn set_network(
    axum::extract::State(c): S,
    Path(id): Path<String>,
    uri: Uri,
    headers: HeaderMap,
    Json(req): Json<NetworkPolicy>,
) -> Result<Response, Error> {
    req.parse()
        .map_err(|e| Error(ApiError::invalid(format!("network: {e}"))))?;
    super::pass_json_as(&c, &id, Method::PUT, &uri, &headers, &req).await
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
