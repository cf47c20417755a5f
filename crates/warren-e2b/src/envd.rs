//! The in-sandbox side: what E2B's envd serves on port 49983, reached through the gateway's
//! one URL and routed by headers (`E2b-Sandbox-Id`, `E2b-Sandbox-Port`).
//!
//! Served so far: `GET /health` (204 while the sandbox runs; 502 with E2B's "was not found"
//! when it does not, which is how `is_running()` turns false). Processes, files and watches
//! are to come (the gateway reports envd 0.1.0 meanwhile).

use std::sync::Arc;

use axum::Router;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use serde_json::json;

use crate::Gateway;

/// envd's port: the only one the gateway serves.
pub const ENVD_PORT: u16 = 49983;

pub(crate) fn routes() -> Router<Arc<Gateway>> {
    Router::new().route("/health", get(health))
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
        let bad = |m: String| {
            (
                StatusCode::BAD_REQUEST,
                axum::Json(json!({"code": 400, "message": m})),
            )
                .into_response()
        };
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
        Err(e) => (
            StatusCode::SERVICE_UNAVAILABLE,
            axum::Json(json!({"code": 503, "message": e.to_string()})),
        )
            .into_response(),
    }
}
