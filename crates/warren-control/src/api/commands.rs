//! Commands: exec (plain and streaming) and background processes.

use axum::body::Body;
use axum::http::{HeaderMap, Method, Uri};
use axum::response::Response;
use warren_http::{Error, Json, Path};
use warren_types::api::{
    ExecEvent, ExecRequest, ExecResult, ProcessInfo, ProcessList, PtySize, SignalRequest,
    StdinRequest,
};
use warren_types::error::ErrorBody;

use super::{S, pass, pass_json};

/// Run a command and wait for it.
///
/// Give `cmd` (run by `/bin/sh -c`) or `argv`. The reply carries exit code, output (up to
/// `max_output` per stream, with the total byte counts and truncation flags) and whether the
/// timeout killed it. A program that does not exist gives exit code 127, not an error.
///
/// With `"stream": true` (or `Accept: application/x-ndjson`) the reply is a stream of
/// newline-delimited JSON events ([`ExecEvent`]): `start`, `stdout`/`stderr` chunks (base64),
/// then `exit` (or `error`).
///
/// Legal on a running sandbox; a paused one is resumed first.
#[utoipa::path(post, path = "/v1/sandboxes/{id}/exec", tag = "commands",
    params(("id" = String, Path, description = "Sandbox id.")),
    request_body = ExecRequest,
    responses(
        (status = 200, description = "The command ran (whatever its exit code): its result; with `stream` (or `Accept: application/x-ndjson`), newline-delimited events as it runs.",
            content((ExecResult = "application/json"), (ExecEvent = "application/x-ndjson"))),
        (status = 400, body = ErrorBody), (status = 404, body = ErrorBody), (status = 410, body = ErrorBody),
        (status = 429, description = "A `pty` past the sandbox's 256 terminals.", body = ErrorBody),
    ),
    security(("api_key" = [])))]
pub async fn exec(
    axum::extract::State(c): S,
    Path(id): Path<String>,
    uri: Uri,
    headers: HeaderMap,
    Json(req): Json<ExecRequest>,
) -> Result<Response, Error> {
    pass_json(&c, &id, &uri, &headers, &req).await
}

/// Start a background command; it runs until it exits, is signalled, or times out (no
/// timeout unless given).
#[utoipa::path(post, path = "/v1/sandboxes/{id}/processes", tag = "commands",
    params(("id" = String, Path, description = "Sandbox id.")),
    request_body = ExecRequest,
    responses((status = 201, body = ProcessInfo), (status = 400, body = ErrorBody), (status = 404, body = ErrorBody),
        (status = 429, description = "A `pty` past the sandbox's 256 terminals.", body = ErrorBody)),
    security(("api_key" = [])))]
pub async fn start(
    axum::extract::State(c): S,
    Path(id): Path<String>,
    uri: Uri,
    headers: HeaderMap,
    Json(req): Json<ExecRequest>,
) -> Result<Response, Error> {
    pass_json(&c, &id, &uri, &headers, &req).await
}

/// List the sandbox's processes: running ones, and finished ones not yet collected.
#[utoipa::path(get, path = "/v1/sandboxes/{id}/processes", tag = "commands",
    params(("id" = String, Path, description = "Sandbox id.")),
    responses((status = 200, body = ProcessList), (status = 404, body = ErrorBody)),
    security(("api_key" = [])))]
pub async fn list(
    axum::extract::State(c): S,
    Path(id): Path<String>,
    uri: Uri,
    headers: HeaderMap,
) -> Result<Response, Error> {
    pass(&c, &id, Method::GET, &uri, &headers, Body::empty()).await
}

/// One process.
#[utoipa::path(get, path = "/v1/sandboxes/{id}/processes/{pid}", tag = "commands",
    params(("id" = String, Path, description = "Sandbox id."), ("pid" = u64, Path, description = "Process id from start.")),
    responses((status = 200, body = ProcessInfo), (status = 404, body = ErrorBody)),
    security(("api_key" = [])))]
pub async fn get(
    axum::extract::State(c): S,
    Path((id, _pid)): Path<(String, u64)>,
    uri: Uri,
    headers: HeaderMap,
) -> Result<Response, Error> {
    pass(&c, &id, Method::GET, &uri, &headers, Body::empty()).await
}

/// Forget a process and its kept output (a running one keeps running).
#[utoipa::path(delete, path = "/v1/sandboxes/{id}/processes/{pid}", tag = "commands",
    params(("id" = String, Path, description = "Sandbox id."), ("pid" = u64, Path, description = "Process id.")),
    responses((status = 204, description = "Forgotten."), (status = 404, body = ErrorBody)),
    security(("api_key" = [])))]
pub async fn forget(
    axum::extract::State(c): S,
    Path((id, _pid)): Path<(String, u64)>,
    uri: Uri,
    headers: HeaderMap,
) -> Result<Response, Error> {
    pass(&c, &id, Method::DELETE, &uri, &headers, Body::empty()).await
}

/// Wait for a process to exit, at most `timeout` seconds; returns its state either way.
#[utoipa::path(post, path = "/v1/sandboxes/{id}/processes/{pid}/wait", tag = "commands",
    params(("id" = String, Path, description = "Sandbox id."), ("pid" = u64, Path, description = "Process id."),
        ("timeout" = Option<f64>, Query, minimum = 0, description = "Seconds to wait at most; default until it exits.")),
    responses((status = 200, body = ProcessInfo), (status = 404, body = ErrorBody)),
    security(("api_key" = [])))]
pub async fn wait(
    axum::extract::State(c): S,
    Path((id, _pid)): Path<(String, u64)>,
    uri: Uri,
    headers: HeaderMap,
) -> Result<Response, Error> {
    pass(&c, &id, Method::POST, &uri, &headers, Body::empty()).await
}

/// Send a signal to a process (and its process group).
#[utoipa::path(post, path = "/v1/sandboxes/{id}/processes/{pid}/signal", tag = "commands",
    params(("id" = String, Path, description = "Sandbox id."), ("pid" = u64, Path, description = "Process id.")),
    request_body = SignalRequest,
    responses((status = 204, description = "Sent."), (status = 400, body = ErrorBody), (status = 404, body = ErrorBody)),
    security(("api_key" = [])))]
pub async fn signal(
    axum::extract::State(c): S,
    Path((id, _pid)): Path<(String, u64)>,
    uri: Uri,
    headers: HeaderMap,
    Json(req): Json<SignalRequest>,
) -> Result<Response, Error> {
    pass_json(&c, &id, &uri, &headers, &req).await
}

/// Stream a process's output from its start (what is kept), then follow it to its exit, as
/// newline-delimited events. Use it to re-attach after a disconnect.
#[utoipa::path(get, path = "/v1/sandboxes/{id}/processes/{pid}/output", tag = "commands",
    params(("id" = String, Path, description = "Sandbox id."), ("pid" = u64, Path, description = "Process id.")),
    responses((status = 200, body = ExecEvent, content_type = "application/x-ndjson"), (status = 404, body = ErrorBody)),
    security(("api_key" = [])))]
pub async fn output(
    axum::extract::State(c): S,
    Path((id, _pid)): Path<(String, u64)>,
    uri: Uri,
    headers: HeaderMap,
) -> Result<Response, Error> {
    pass(&c, &id, Method::GET, &uri, &headers, Body::empty()).await
}

/// Send input to a process started with `stdin_open` or `pty`; with `close`, close its stdin
/// afterwards (the process then reads end of file). Answers once the input is written (a
/// process that does not read holds the answer until its pipe or terminal has room).
#[utoipa::path(post, path = "/v1/sandboxes/{id}/processes/{pid}/stdin", tag = "commands",
    params(("id" = String, Path, description = "Sandbox id."), ("pid" = u64, Path, description = "Process id.")),
    request_body = StdinRequest,
    responses((status = 204, description = "Written (and closed, with `close`)."), (status = 400, body = ErrorBody), (status = 404, body = ErrorBody),
        (status = 409, description = "The process did not read its input within 30 s (what it read was delivered).", body = ErrorBody)),
    security(("api_key" = [])))]
pub async fn stdin(
    axum::extract::State(c): S,
    Path((id, _pid)): Path<(String, u64)>,
    uri: Uri,
    headers: HeaderMap,
    Json(req): Json<StdinRequest>,
) -> Result<Response, Error> {
    pass_json(&c, &id, &uri, &headers, &req).await
}

/// Change the size of a process's terminal (a process started with `pty`); its programs get
/// `SIGWINCH`.
#[utoipa::path(post, path = "/v1/sandboxes/{id}/processes/{pid}/resize", tag = "commands",
    params(("id" = String, Path, description = "Sandbox id."), ("pid" = u64, Path, description = "Process id.")),
    request_body = PtySize,
    responses((status = 204, description = "Resized."), (status = 400, body = ErrorBody), (status = 404, body = ErrorBody)),
    security(("api_key" = [])))]
pub async fn resize(
    axum::extract::State(c): S,
    Path((id, _pid)): Path<(String, u64)>,
    uri: Uri,
    headers: HeaderMap,
    Json(req): Json<PtySize>,
) -> Result<Response, Error> {
    pass_json(&c, &id, &uri, &headers, &req).await
}
