//! Forwarding a request to the node that owns a sandbox, and its answer back.

use std::sync::Arc;

use axum::body::Body;
use axum::http::{HeaderMap, Method, Response, header};
use futures_util::TryStreamExt;
use warren_http::Error;
use warren_types::error::{ApiError, ErrorCode};
use warren_types::id::SandboxId;

use crate::Control;
use crate::nodes::NodeEntry;

/// Request headers passed on to nodes.
const PASS_REQUEST: &[header::HeaderName] =
    &[header::CONTENT_TYPE, header::CONTENT_LENGTH, header::ACCEPT];
/// Response headers passed back to clients.
const PASS_RESPONSE: &[&str] = &[
    "content-type",
    "retry-after",
    "x-warren-file-size",
    "x-warren-file-mode",
];

/// Parses a sandbox id from a path and finds its node.
pub fn route(c: &Control, raw: &str) -> Result<(SandboxId, Arc<NodeEntry>), Error> {
    let id: SandboxId = raw.parse().map_err(|e| {
        Error(ApiError::invalid(format!(
            "{e}; sandbox ids are what create returned"
        )))
    })?;
    let node = c.nodes.get(&id.node()).ok_or_else(|| {
        Error(ApiError::new(
            ErrorCode::SandboxNotFound,
            format!(
                "sandbox {id} not found: it belongs to node {}, which is not part of this cluster",
                id.node()
            ),
        ))
    })?;
    Ok((id, node))
}

/// Sends a request to `node` and streams its answer back, status and body as they are.
pub async fn forward(
    node: &NodeEntry,
    method: Method,
    path_and_query: &str,
    headers: &HeaderMap,
    body: reqwest::Body,
) -> Result<Response<Body>, Error> {
    let mut rb = node.client.request(
        reqwest::Method::from_bytes(method.as_str().as_bytes()).unwrap_or(reqwest::Method::GET),
        path_and_query,
    );
    for h in PASS_REQUEST {
        if let Some(v) = headers.get(h) {
            rb = rb.header(h.as_str(), v.as_bytes());
        }
    }
    // Set by the access check alone (it drops clients' own): the projects the request may
    // reach.
    for h in [
        warren_types::project::SCOPE_HEADER,
        warren_types::project::VISIBLE_HEADER,
    ] {
        if let Some(v) = headers.get(h) {
            rb = rb.header(h, v.as_bytes());
        }
    }
    if let Some(v) = headers.get("idempotency-key") {
        rb = rb.header("idempotency-key", v.as_bytes());
    }
    let resp = rb
        .body(body)
        .send()
        .await
        .map_err(|e| unavailable(node, &e))?;
    let mut out = Response::builder().status(resp.status().as_u16());
    for h in PASS_RESPONSE {
        if let Some(v) = resp.headers().get(*h) {
            out = out.header(*h, v.as_bytes());
        }
    }
    let stream = resp.bytes_stream().map_err(std::io::Error::other);
    out.body(Body::from_stream(stream))
        .map_err(|e| Error(ApiError::internal(format!("building the response: {e}"))))
}

/// A node that could not be reached.
pub fn unavailable(node: &NodeEntry, e: &dyn std::fmt::Display) -> Error {
    Error(ApiError::new(
        ErrorCode::Unavailable,
        format!(
            "node {} ({}) does not answer: {e}; retry shortly",
            node.id,
            node.client.endpoint()
        ),
    ))
}

/// Forwards a JSON value as the body.
pub async fn forward_json<T: serde::Serialize>(
    node: &NodeEntry,
    method: Method,
    path_and_query: &str,
    headers: &HeaderMap,
    value: &T,
) -> Result<Response<Body>, Error> {
    let mut headers = headers.clone();
    headers.insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static("application/json"),
    );
    headers.remove(header::CONTENT_LENGTH);
    let body = serde_json::to_vec(value).map_err(|e| Error(ApiError::internal(e.to_string())))?;
    forward(
        node,
        method,
        path_and_query,
        &headers,
        reqwest::Body::from(body),
    )
    .await
}
