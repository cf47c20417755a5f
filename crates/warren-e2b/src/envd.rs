//! The in-sandbox side: what E2B's envd serves on port 49983, reached through the gateway's
//! one URL and routed by headers (`E2b-Sandbox-Id`, `E2b-Sandbox-Port`).
//!
//! Served: `GET /health` (204 while the sandbox runs; 502 with E2B's "was not found" when it
//! does not, which is how `is_running()` turns false), `process.Process` (see `process`), and
//! `/files` and `filesystem.Filesystem` (see `files`). Every call but `/health` must carry the
//! sandbox's access token (`X-Access-Token`, answered at create and connect), checked before
//! its body is read, or, for `/files`, a signed URL with the routing headers naming its
//! sandbox (the signature checked against that sandbox's recent tokens only). Each call is
//! made on behalf of the Warren key the token names: Warren refuses it once that key is
//! revoked or has lost the sandbox, and audits what it runs under that key.

use std::sync::Arc;

use axum::Router;
use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde_json::json;
use warren_sdk::Sandbox;

use crate::{Gateway, connect, files, keys, process};

/// envd's port: the only one the gateway serves.
pub const ENVD_PORT: u16 = 49983;

/// `/health`: open to all, as E2B's is.
pub(crate) fn health_routes() -> Router<Arc<Gateway>> {
    Router::new().route("/health", get(health))
}

/// The token check of every other data-plane route, before its body is read; its refusal in
/// the form the route answers in (a stream's end message, a unary error, `/files`' JSON).
pub(crate) async fn require_token(
    State(gw): State<Arc<Gateway>>,
    req: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    let mut req = req;
    let signed = req.uri().path() == "/files"
        && req.uri().query().is_some_and(|q| q.contains("signature="))
        && !req.headers().contains_key("x-access-token");
    if signed {
        // A signed file URL carries no token, only a hash of one: the sandbox must be named
        // (its routing headers), and the signature is checked against that sandbox's recent
        // tokens. Found, the request goes on as one with that token.
        let (uri, method) = (req.uri().clone(), req.method().clone());
        let named = match target(req.headers()) {
            Ok(Some((id, _))) => id,
            Ok(None) => return files_error((StatusCode::BAD_REQUEST, UNNAMED_SIGNED.into())),
            // Answered below, as for any request.
            Err(_) => String::new(),
        };
        if !named.is_empty() {
            match signed_token(&gw, &uri, &method, &named) {
                Ok(token) => {
                    let h = req.headers_mut();
                    // The user is the signed one (`username`, or the default user): a user
                    // named in `Authorization` was not signed and must not replace it.
                    h.remove(axum::http::header::AUTHORIZATION);
                    match axum::http::HeaderValue::from_str(&token) {
                        Ok(v) => {
                            h.insert("x-access-token", v);
                        }
                        Err(_) => return files_error(signature_mismatch(&named)),
                    }
                }
                Err(e) => return files_error(e),
            }
        }
    }
    // As E2B's proxy answers: a port other than envd's is "not open", an impossible id "not
    // found" (the SDK reads both by their words).
    match target(req.headers()) {
        Ok(Some((id, port))) if port != ENVD_PORT => {
            return proxy_error(&id, "The sandbox is running but port is not open");
        }
        Err(Refusal::NoSuchSandbox(id)) => return proxy_error(&id, "The sandbox was not found"),
        _ => {}
    }
    match sandbox_for(&gw, req.headers()) {
        Ok(_) => next.run(req).await,
        Err(e) if req.uri().path() == "/files" => files_error((e.code.http_status(), e.message)),
        Err(e) => {
            let streaming = req
                .headers()
                .get(axum::http::header::CONTENT_TYPE)
                .and_then(|v| v.to_str().ok())
                .is_some_and(|v| v.starts_with(connect::STREAM_JSON));
            if streaming {
                process::stream_error(e)
            } else {
                process::unary(Err(e))
            }
        }
    }
}

/// A signed file URL's query.
#[derive(Debug, serde::Deserialize)]
struct SignedQuery {
    path: Option<String>,
    username: Option<String>,
    signature: String,
    signature_expiration: Option<i64>,
}

/// The refusal of a signed URL that names no sandbox.
const UNNAMED_SIGNED: &str = "a signed file URL must name its sandbox: send E2b-Sandbox-Id: \
     <sandbox id> and E2b-Sandbox-Port: 49983 with it (a URL made under E2B_SANDBOX_URL carries \
     no sandbox id), or send X-Access-Token instead of the signature";

fn signature_mismatch(id: &str) -> (StatusCode, String) {
    (
        StatusCode::UNAUTHORIZED,
        format!(
            "the signature does not match this URL (path, user, operation and expiry are \
             signed) for sandbox {id}'s access token; if the gateway restarted since the URL \
             was made, connect to the sandbox (Sandbox.connect) and make the URL again"
        ),
    )
}

/// The access token of sandbox `id` that made the signature of this `/files` request (a
/// download for GET, an upload for POST): one of the few the gateway answered or accepted
/// for that sandbox lately, so a request costs a handful of hashes and no call to Warren.
fn signed_token(
    gw: &Gateway,
    uri: &axum::http::Uri,
    method: &axum::http::Method,
    id: &str,
) -> Result<String, (StatusCode, String)> {
    let unauthorized = |m: &str| (StatusCode::UNAUTHORIZED, m.to_string());
    let q = axum::extract::Query::<SignedQuery>::try_from_uri(uri)
        .map_err(|e| {
            (
                StatusCode::BAD_REQUEST,
                format!("the signed URL's query: {e}"),
            )
        })?
        .0;
    let operation = if method == axum::http::Method::GET {
        "read"
    } else {
        "write"
    };
    if let Some(exp) = q.signature_expiration
        && exp < crate::tokens::now()
    {
        return Err(unauthorized(
            "signature is already expired: make a new signed URL",
        ));
    }
    // `v1_` and the unpadded base64 of a SHA-256 digest: anything else matches no token.
    if !q.signature.starts_with("v1_") || q.signature.len() != 3 + 43 {
        return Err(unauthorized("not a v1 signature: E2B's v1 signatures only"));
    }
    let path = q.path.unwrap_or_default();
    let user = q.username.unwrap_or_default();
    // The signed string joins its fields with ':': a user name holding one could be read
    // another way.
    if user.contains(':') {
        return Err(unauthorized("a signed URL's username cannot contain ':'"));
    }
    gw.tokens
        .find(id, |token| {
            let want = keys::file_signature(&path, operation, &user, token, q.signature_expiration);
            keys::matches(&q.signature, &want)
        })
        .ok_or_else(|| signature_mismatch(id))
}

pub(crate) fn routes() -> Router<Arc<Gateway>> {
    Router::new()
        .route("/process.Process/{method}", post(process_call))
        .route("/filesystem.Filesystem/{method}", post(filesystem_call))
        .route(
            "/files",
            get(files_read)
                .post(files_write)
                .layer(axum::extract::DefaultBodyLimit::max(
                    files::MAX_UPLOAD + (1 << 20),
                )),
        )
}

/// `POST /filesystem.Filesystem/<method>` (all unary).
async fn filesystem_call(
    State(gw): State<Arc<Gateway>>,
    Path(method): Path<String>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    match sandbox_for(&gw, &headers) {
        Ok(sb) if method == "WatchDir" => {
            files::watch_stream(sb, process::keepalive(&headers), body).await
        }
        Ok(sb) => files::filesystem(sb, &method, body).await,
        Err(e) if method == "WatchDir" => process::stream_error(e),
        Err(e) => process::unary(Err(e)),
    }
}

/// `/files`' query.
#[derive(Debug, serde::Deserialize)]
struct FilesQuery {
    path: Option<String>,
    username: Option<String>,
}

/// The sandbox of a `/files` call, as the user its query names, or the HTTP error's status
/// and message.
fn files_sandbox(
    gw: &Gateway,
    headers: &HeaderMap,
    q: &FilesQuery,
) -> Result<Sandbox, (StatusCode, String)> {
    let sb = sandbox_for(gw, headers).map_err(|e| (e.code.http_status(), e.message))?;
    Ok(match q.username.as_deref().filter(|u| !u.is_empty()) {
        Some(u) => sb.as_user(u),
        None => sb,
    })
}

/// A `/files` error answer.
fn files_error((status, m): (StatusCode, String)) -> Response {
    (
        status,
        axum::Json(json!({"code": status.as_u16(), "message": m})),
    )
        .into_response()
}

async fn files_read(
    State(gw): State<Arc<Gateway>>,
    headers: HeaderMap,
    axum::extract::Query(q): axum::extract::Query<FilesQuery>,
) -> Response {
    match files_sandbox(&gw, &headers, &q) {
        Ok(sb) => files::read(sb, q.path).await,
        Err(e) => files_error(e),
    }
}

async fn files_write(
    State(gw): State<Arc<Gateway>>,
    headers: HeaderMap,
    axum::extract::Query(q): axum::extract::Query<FilesQuery>,
    req: axum::extract::Request,
) -> Response {
    use axum::extract::FromRequest;
    let sb = match files_sandbox(&gw, &headers, &q) {
        Ok(sb) => sb,
        Err(e) => return files_error(e),
    };
    let header = |name| {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .trim()
            .to_ascii_lowercase()
    };
    let gzip = match header(axum::http::header::CONTENT_ENCODING).as_str() {
        "" | "identity" => false,
        "gzip" => true,
        other => {
            return files_error((
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                format!("Content-Encoding {other:?} is not accepted: send gzip or none"),
            ));
        }
    };
    // Metadata for every file of the upload, from `X-Metadata-<key>` headers.
    let mut metadata = files::Metadata::new();
    for (name, value) in &headers {
        if let Some(key) = name.as_str().strip_prefix("x-metadata-") {
            let Ok(v) = value.to_str() else {
                return files_error((
                    StatusCode::BAD_REQUEST,
                    format!("metadata {key:?}: values are printable ASCII"),
                ));
            };
            metadata.insert(key.to_string(), v.to_string());
        }
    }
    let metadata = match warren_types::api::check_file_metadata(&metadata) {
        Ok(m) => m,
        Err(e) => return files_error((StatusCode::BAD_REQUEST, e)),
    };
    let kind = header(axum::http::header::CONTENT_TYPE);
    if kind.starts_with("multipart/form-data") {
        if gzip {
            return files_error((
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                "a gzip upload is an application/octet-stream body, not multipart".into(),
            ));
        }
        return match axum::extract::Multipart::from_request(req, &()).await {
            Ok(form) => files::write(sb, q.path, metadata, form).await,
            Err(e) => files_error((e.status(), e.body_text())),
        };
    }
    if kind.is_empty() || kind.starts_with("application/octet-stream") {
        return files::write_raw(sb, q.path, gzip, metadata, req.into_body()).await;
    }
    files_error((
        StatusCode::UNSUPPORTED_MEDIA_TYPE,
        format!(
            "Content-Type {kind:?} is not accepted: send multipart/form-data or \
             application/octet-stream"
        ),
    ))
}

/// The sandbox a data-plane call is for, as the user it names (`Authorization: Basic
/// base64("<user>:")`; none: Warren's default `user`), its access token checked.
pub(crate) fn sandbox_for(gw: &Gateway, headers: &HeaderMap) -> Result<Sandbox, connect::Error> {
    use connect::{Code, Error};
    let (id, port) = match target(headers) {
        Ok(Some(t)) => t,
        Ok(None) => {
            return Err(Error::new(
                Code::InvalidArgument,
                "no sandbox named: send E2b-Sandbox-Id and E2b-Sandbox-Port (E2B_SANDBOX_URL \
                 set to this gateway does)",
            ));
        }
        Err(Refusal::NoSuchSandbox(id)) => {
            return Err(Error::new(
                Code::NotFound,
                format!("sandbox {id} was not found"),
            ));
        }
        Err(Refusal::Missing(h)) => {
            return Err(Error::new(
                Code::InvalidArgument,
                format!("Missing header: {h}"),
            ));
        }
        Err(Refusal::BadPort(p)) => {
            return Err(Error::new(
                Code::InvalidArgument,
                format!("invalid sandbox port {p:?}"),
            ));
        }
    };
    if port != ENVD_PORT {
        return Err(Error::new(
            Code::Unavailable,
            format!("port {port} is not open: the gateway serves envd's ({ENVD_PORT})"),
        ));
    }
    let token = headers
        .get("x-access-token")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    let grant = gw
        .tokens
        .check(token, &id)
        .map_err(|e| Error::new(Code::Unauthenticated, e.to_string()))?;
    // Made on behalf of the token's key: Warren checks that key's current state and grants
    // on every call (a revoked key, or one that lost the sandbox, is refused there).
    let sb = gw
        .warren
        .on_behalf_of(&grant.key_id)
        .sandbox(&id)
        .map_err(|e| Error::new(Code::NotFound, e.to_string()))?;
    match basic_user(headers)? {
        Some(user) => Ok(sb.as_user(&user)),
        None => Ok(sb),
    }
}

/// The user of `Authorization: Basic base64("<user>:")`, if the header is there.
fn basic_user(headers: &HeaderMap) -> Result<Option<String>, connect::Error> {
    use base64::Engine;
    let Some(v) = headers.get(axum::http::header::AUTHORIZATION) else {
        return Ok(None);
    };
    let bad = || {
        connect::Error::new(
            connect::Code::Unauthenticated,
            "Authorization must be Basic base64(\"<user>:\")",
        )
    };
    let v = v.to_str().map_err(|_| bad())?;
    let b64 = v.strip_prefix("Basic ").ok_or_else(bad)?;
    let raw = base64::engine::general_purpose::STANDARD
        .decode(b64.trim())
        .map_err(|_| bad())?;
    let text = String::from_utf8(raw).map_err(|_| bad())?;
    let user = text.split(':').next().unwrap_or("");
    Ok((!user.is_empty()).then(|| user.to_string()))
}

/// `POST /process.Process/<method>`. The body of `StreamInput` is read as it arrives; the
/// others' whole (one message, at most [`connect::MAX_MESSAGE`]).
async fn process_call(
    State(gw): State<Arc<Gateway>>,
    Path(method): Path<String>,
    headers: HeaderMap,
    body: axum::body::Body,
) -> Response {
    let streaming = matches!(method.as_str(), "Start" | "Connect" | "StreamInput");
    let sb = match sandbox_for(&gw, &headers) {
        Ok(sb) => sb,
        Err(e) if streaming => return process::stream_error(e),
        Err(e) => return process::unary(Err(e)),
    };
    if method == "StreamInput" {
        return process::stream_input(sb, body).await;
    }
    let body = match axum::body::to_bytes(body, connect::MAX_MESSAGE + 5).await {
        Ok(b) => b,
        Err(e) => {
            let e = connect::Error::new(
                connect::Code::ResourceExhausted,
                format!(
                    "the request body could not be read whole within {} bytes: {e}",
                    connect::MAX_MESSAGE + 5
                ),
            );
            return if streaming {
                process::stream_error(e)
            } else {
                process::unary(Err(e))
            };
        }
    };
    match method.as_str() {
        "Start" => process::start(sb, headers, body).await,
        "Connect" => process::attach(sb, headers, body).await,
        "List" => process::list(sb, body).await,
        "SendSignal" => process::signal(sb, body).await,
        "SendInput" => process::send_input(sb, body).await,
        "CloseStdin" => process::close_stdin(sb, body).await,
        "Update" => process::update(sb, body).await,
        other => process::unary(Err(connect::Error::new(
            connect::Code::Unimplemented,
            format!("process.Process has no method {other:?}"),
        ))),
    }
}

/// E2B's proxy answer for a sandbox that is gone or unreachable (the SDK matches the
/// message's words).
fn proxy_error(id: &str, message: &str) -> Response {
    (
        StatusCode::BAD_GATEWAY,
        axum::Json(json!({"sandboxId": id, "message": message, "code": 502})),
    )
        .into_response()
}

/// Why a data-plane request names no sandbox it can reach.
#[derive(Debug)]
pub(crate) enum Refusal {
    /// One of the two routing headers without the other.
    Missing(&'static str),
    /// A port header that is not a port.
    BadPort(String),
    /// An id no sandbox can have.
    NoSuchSandbox(String),
}

impl IntoResponse for Refusal {
    fn into_response(self) -> Response {
        let bad = |m: String| crate::json_error(StatusCode::BAD_REQUEST, m);
        match self {
            Refusal::Missing(h) => bad(format!("Missing header: {h}")),
            Refusal::BadPort(p) => bad(format!("invalid sandbox port {p:?}")),
            Refusal::NoSuchSandbox(id) => proxy_error(&id, "The sandbox was not found"),
        }
    }
}

/// Which sandbox and port a data-plane request is for. `Ok(None)`: no routing headers (a
/// request for the gateway itself).
pub(crate) fn target(headers: &HeaderMap) -> Result<Option<(String, u16)>, Refusal> {
    let header = |n: &str| headers.get(n).and_then(|v| v.to_str().ok());
    match (header("e2b-sandbox-id"), header("e2b-sandbox-port")) {
        (None, None) => Ok(None),
        (Some(_), None) => Err(Refusal::Missing("E2b-Sandbox-Port")),
        (None, Some(_)) => Err(Refusal::Missing("E2b-Sandbox-Id")),
        (Some(id), Some(port)) => {
            if id.is_empty()
                || id.len() > 64
                || !id
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
            {
                return Err(Refusal::NoSuchSandbox(id.chars().take(64).collect()));
            }
            let port: u16 = port
                .parse()
                .map_err(|_| Refusal::BadPort(port.chars().take(16).collect()))?;
            Ok(Some((id.to_string(), port)))
        }
    }
}

async fn health(State(gw): State<Arc<Gateway>>, headers: HeaderMap) -> Response {
    let (id, port) = match target(&headers) {
        Ok(Some(t)) => t,
        // The gateway's own health.
        Ok(None) => return StatusCode::NO_CONTENT.into_response(),
        Err(r) => return r.into_response(),
    };
    if port != ENVD_PORT {
        return proxy_error(&id, "The sandbox is running but port is not open");
    }
    match gw.warren.get(&id).await {
        // A paused sandbox answers as E2B's does: not running until connected.
        Ok(sb) if sb.state == warren_sdk::SandboxState::Running => {
            StatusCode::NO_CONTENT.into_response()
        }
        Ok(_) => proxy_error(&id, "The sandbox was not found"),
        Err(e) if e.is_not_found() => proxy_error(&id, "The sandbox was not found"),
        Err(e) => {
            tracing::warn!("E2B gateway: /health could not ask Warren: {e}");
            crate::json_error(
                StatusCode::SERVICE_UNAVAILABLE,
                "Warren did not answer the gateway; retry",
            )
        }
    }
}
