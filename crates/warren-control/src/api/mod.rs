//! The public REST API under `/v1`.
//!
//! Every route except `/v1/health` and `/v1/openapi.json` needs an API key. Requests about a
//! sandbox go to the node its id names; bodies are checked here first, so a malformed request
//! is refused without a round trip.

pub mod access;
pub(crate) mod cluster;
pub(crate) mod commands;
pub(crate) mod events;
pub(crate) mod files;
pub(crate) mod fncall;
pub use fncall::{WarmCalls, keyless_router};
pub mod forward;
pub(crate) mod iam;
pub(crate) mod images;
pub mod ports;
pub(crate) mod sandboxes;
pub(crate) mod system;
pub(crate) mod tasks;

use std::sync::Arc;

use axum::extract::DefaultBodyLimit;
use axum::routing::{get, post, put};
use axum::{Router, middleware};

use crate::Control;

/// Largest JSON body (exec stdin travels in it), bytes.
pub const MAX_JSON_BODY: usize = 64 << 20;

type S = axum::extract::State<Arc<Control>>;

/// A 404 that says how to make the project, unless it exists.
pub(crate) async fn project_must_exist(
    c: &Control,
    project: &str,
) -> Result<(), warren_http::Error> {
    let exists = c
        .iam
        .project_exists(project)
        .await
        .map_err(|e| warren_http::Error(e.into()))?;
    if exists {
        return Ok(());
    }
    Err(warren_http::Error(warren_types::error::ApiError::new(
        warren_types::error::ErrorCode::NotFound,
        format!("no project {project}: create it first (warren project create {project})"),
    )))
}

/// The public API.
pub fn router(c: Arc<Control>) -> Router {
    let authed = Router::new()
        .route("/v1/nodes", get(system::nodes))
        .route("/v1/nodes/{node}", axum::routing::delete(cluster::remove))
        .route("/v1/nodes/{node}/cordon", post(cluster::cordon))
        .route("/v1/nodes/{node}/uncordon", post(cluster::uncordon))
        .route(
            "/v1/sandboxes",
            post(sandboxes::create).get(sandboxes::list),
        )
        .route(
            "/v1/sandboxes/{id}",
            get(sandboxes::get).delete(sandboxes::kill),
        )
        .route("/v1/sandboxes/{id}/pause", post(sandboxes::pause))
        .route("/v1/sandboxes/{id}/resume", post(sandboxes::resume))
        .route("/v1/sandboxes/{id}/timeout", post(sandboxes::set_timeout))
        .route(
            "/v1/sandboxes/{id}/network",
            get(sandboxes::get_network).put(sandboxes::set_network),
        )
        .route("/v1/tasks/{task}/network", put(tasks::set_network))
        .route(
            "/v1/sandboxes/{id}/ports/{port}/connect",
            get(ports::connect),
        )
        .route("/v1/sandboxes/{id}/trajectory", get(sandboxes::trajectory))
        .route("/v1/sandboxes/{id}/metrics", get(sandboxes::metrics))
        .route("/v1/images", get(images::list))
        .route("/v1/images/stats", get(images::stats))
        .route("/v1/images/pull", post(images::pull))
        .route("/v1/layers", get(images::layers))
        .route("/v1/layers/prune", post(images::prune))
        .route(
            "/v1/images/{*name}",
            get(images::get).delete(images::remove),
        )
        .route("/v1/sandboxes/{id}/commit", post(images::commit))
        .route("/v1/tasks", get(tasks::list))
        .route("/v1/events", get(events::list))
        .route("/v1/tasks/{task}/{action}", post(tasks::act))
        .route("/v1/sandboxes/{id}/exec", post(commands::exec))
        .route(
            "/v1/sandboxes/{id}/processes",
            post(commands::start).get(commands::list),
        )
        .route(
            "/v1/sandboxes/{id}/processes/{pid}",
            get(commands::get).delete(commands::forget),
        )
        .route(
            "/v1/sandboxes/{id}/processes/{pid}/wait",
            post(commands::wait),
        )
        .route(
            "/v1/sandboxes/{id}/processes/{pid}/signal",
            post(commands::signal),
        )
        .route(
            "/v1/sandboxes/{id}/processes/{pid}/output",
            get(commands::output),
        )
        .route(
            "/v1/sandboxes/{id}/processes/{pid}/stdin",
            post(commands::stdin),
        )
        .route(
            "/v1/sandboxes/{id}/processes/{pid}/resize",
            post(commands::resize),
        )
        .route(
            "/v1/sandboxes/{id}/files",
            get(files::read).put(files::write).delete(files::remove),
        )
        .route("/v1/sandboxes/{id}/files/list", get(files::list))
        .route(
            "/v1/sandboxes/{id}/files/tar",
            get(files::download_tar).put(files::upload_tar),
        )
        .route("/v1/sandboxes/{id}/files/stat", get(files::stat))
        .route("/v1/sandboxes/{id}/files/mkdir", post(files::mkdir))
        .route("/v1/sandboxes/{id}/files/rename", post(files::rename))
        .route("/v1/sandboxes/{id}/watches", post(files::watch_create))
        .route(
            "/v1/sandboxes/{id}/watches/{watch}",
            axum::routing::delete(files::watch_remove),
        )
        .route("/v1/fncall/run", post(fncall::run))
        .route("/v1/fncall/batch", post(fncall::batch))
        .route("/v1/fncall/languages", get(fncall::languages))
        .route("/run_code", post(fncall::run_code))
        .route("/v1/whoami", get(iam::whoami))
        .route(
            "/v1/projects",
            get(iam::list_projects).post(iam::create_project),
        )
        .route(
            "/v1/projects/{*path}",
            axum::routing::delete(iam::delete_project).put(iam::set_quota),
        )
        .route(
            "/v1/identities",
            get(iam::list_identities).post(iam::create_identity),
        )
        .route("/v1/keys", get(iam::list_keys).post(iam::create_key))
        .route("/v1/keys/{id}", axum::routing::delete(iam::revoke_key))
        .route(
            "/v1/bindings",
            get(iam::list_bindings)
                .post(iam::grant)
                .delete(iam::revoke_grant),
        )
        .route("/v1/audit", get(iam::audit))
        .route(
            "/v1/sandboxes/{id}/watches/{watch}/events",
            get(files::watch_events),
        )
        .route_layer(middleware::from_fn_with_state(c.clone(), access::authorize))
        .layer(DefaultBodyLimit::max(MAX_JSON_BODY));
    // Image uploads are streamed to disk with their own limit (max_image_upload).
    let uploads = Router::new()
        .route(
            "/v1/images",
            post(images::import).layer(DefaultBodyLimit::disable()),
        )
        .route_layer(middleware::from_fn_with_state(c.clone(), access::authorize));
    Router::new()
        .route("/v1/health", get(system::health))
        .route("/v1/openapi.json", get(system::openapi))
        // Nodes join with the cluster token, not an API key.
        .route(
            "/v1/cluster/nodes",
            post(cluster::register).layer(DefaultBodyLimit::max(64 << 10)),
        )
        .merge(uploads)
        .merge(authed)
        .fallback(warren_http::not_found)
        // `<port>-<id>.<sandbox_domain>` goes to the sandbox's port before anything else.
        .layer(middleware::from_fn_with_state(c.clone(), ports::host_route))
        // A request refused before its body was read (no key, a bad path, a sandbox port that
        // is not exposed) still gets its answer, not a reset connection.
        .layer(middleware::from_fn(warren_http::drain::unread_body))
        .with_state(c)
}

/// Forwards a request about sandbox `id` as it came (method, path, query, body).
pub(crate) async fn pass(
    c: &Control,
    id: &str,
    method: axum::http::Method,
    uri: &axum::http::Uri,
    headers: &axum::http::HeaderMap,
    body: axum::body::Body,
) -> Result<axum::response::Response, warren_http::Error> {
    let (_, node) = forward::route(c, id)?;
    let pq = uri
        .path_and_query()
        .map(|p| p.as_str())
        .unwrap_or(uri.path());
    let body = reqwest::Body::wrap_stream(body.into_data_stream());
    forward::forward(&node, method, pq, headers, body).await
}

/// Forwards a checked JSON body about sandbox `id` (a POST).
pub(crate) async fn pass_json<T: serde::Serialize>(
    c: &Control,
    id: &str,
    uri: &axum::http::Uri,
    headers: &axum::http::HeaderMap,
    value: &T,
) -> Result<axum::response::Response, warren_http::Error> {
    pass_json_as(c, id, axum::http::Method::POST, uri, headers, value).await
}

/// Forwards a checked JSON body about sandbox `id` with `method`.
pub(crate) async fn pass_json_as<T: serde::Serialize>(
    c: &Control,
    id: &str,
    method: axum::http::Method,
    uri: &axum::http::Uri,
    headers: &axum::http::HeaderMap,
    value: &T,
) -> Result<axum::response::Response, warren_http::Error> {
    let (_, node) = forward::route(c, id)?;
    let pq = uri
        .path_and_query()
        .map(|p| p.as_str())
        .unwrap_or(uri.path());
    forward::forward_json(&node, method, pq, headers, value).await
}
