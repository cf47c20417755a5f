//! Exposed ports through the control plane: a TCP stream to a sandbox's exposed port
//! (`GET /v1/sandboxes/{id}/ports/{port}/connect`, an HTTP upgrade), and, where
//! `sandbox_domain` is set, the `<port>-<sandbox id>.<domain>` host route, which carries each
//! HTTP request (websocket upgrades included) to that port. Both go through the node's API,
//! which dials the sandbox: the node's own host ports need not be reachable from here.

use std::sync::Arc;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use hyper_util::rt::TokioIo;
use warren_http::{Error, Path};
use warren_types::error::{ApiError, ErrorBody, ErrorCode};

use super::{S, forward};
use crate::Control;
use crate::nodes::NodeEntry;

/// Largest error answer read from a node that refused a tunnel.
const MAX_REFUSAL: usize = 64 << 10;

/// Open a TCP stream to an exposed port of the sandbox: send `Connection: upgrade` and
/// `Upgrade: tcp`; the answer is `101 Switching Protocols` and the connection then carries
/// the bytes of a TCP connection to the port (a paused sandbox is resumed first). The port
/// must be in the sandbox's network policy's `expose` (404 otherwise); 503 when nothing in
/// the sandbox accepts connections on it.
#[utoipa::path(get, path = "/v1/sandboxes/{id}/ports/{port}/connect", tag = "network",
    params(("id" = String, Path, description = "Sandbox id."),
        ("port" = u16, Path, description = "An exposed port of the sandbox.", minimum = 1)),
    responses((status = 101, description = "Switched to a TCP stream to the port."),
        (status = 400, body = ErrorBody), (status = 404, body = ErrorBody),
        (status = 429, description = "The port, its node or the control plane carries as many streams as it may.", body = ErrorBody),
        (status = 503, body = ErrorBody)),
    security(("api_key" = [])))]
pub async fn connect(
    State(c): S,
    Path((id, port)): Path<(String, u16)>,
    mut req: Request,
) -> Result<Response, Error> {
    warren_http::tunnel::check(req.headers()).map_err(Error)?;
    let (id, node) = forward::route(&c, &id)?;
    let id = id.to_string();
    let permit = c
        .tunnels
        .clone()
        .try_acquire_owned()
        .map_err(|_| too_many())?;
    let scope = Scope::of(req.headers());
    let up = open(&node, &id, port, true, Some(&scope)).await?;
    Ok(warren_http::tunnel::accept(
        &mut req,
        up,
        permit,
        std::future::pending(),
    ))
}

/// Streams through the control plane to exposed ports, at once.
pub const MAX_TUNNELS: usize = 16_384;

/// How long a service in a sandbox has to answer a request of the `<port>-<id>` route.
const ANSWER_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(60);

fn too_many() -> Error {
    Error(ApiError::capacity(
        format!(
            "the control plane carries {MAX_TUNNELS} streams to sandboxes' ports already: retry \
             shortly"
        ),
        1,
    ))
}

/// Asks the node of sandbox `id` for a stream to its exposed `port` (`resume`: a paused
/// sandbox is resumed first; else refused).
/// The subtrees a request may act on and see, as the access check set them.
struct Scope {
    scope: String,
    visible: String,
}

impl Scope {
    fn of(h: &axum::http::HeaderMap) -> Scope {
        let get = |n: &str| {
            h.get(n)
                .and_then(|v| v.to_str().ok())
                .unwrap_or("")
                .to_string()
        };
        Scope {
            scope: get(warren_types::project::SCOPE_HEADER),
            visible: get(warren_types::project::VISIBLE_HEADER),
        }
    }
}

/// Opens a stream to `port` of sandbox `id`; `scope` limits it to the caller's projects
/// (none: the public host route, which the sandbox's exposure itself allows).
async fn open(
    node: &NodeEntry,
    id: &str,
    port: u16,
    resume: bool,
    scope: Option<&Scope>,
) -> Result<reqwest::Upgraded, Error> {
    let mut rb = node.client.request(
        reqwest::Method::GET,
        &format!("/v1/sandboxes/{id}/ports/{port}/connect?resume={resume}"),
    );
    if let Some(s) = scope {
        rb = rb
            .header(warren_types::project::SCOPE_HEADER, s.scope.as_str())
            .header(warren_types::project::VISIBLE_HEADER, s.visible.as_str());
    }
    let resp = rb
        .header("connection", "upgrade")
        .header("upgrade", warren_http::tunnel::PROTOCOL)
        .send()
        .await
        .map_err(|e| forward::unavailable(node, &e))?;
    if resp.status() != reqwest::StatusCode::SWITCHING_PROTOCOLS {
        return Err(refusal(node, resp).await);
    }
    resp.upgrade()
        .await
        .map_err(|e| forward::unavailable(node, &e))
}

/// The node's error answer, passed on as it gave it.
async fn refusal(node: &NodeEntry, mut resp: reqwest::Response) -> Error {
    let status = resp.status();
    let mut body = Vec::new();
    while let Ok(Some(chunk)) = resp.chunk().await {
        body.extend_from_slice(&chunk);
        if body.len() > MAX_REFUSAL {
            break;
        }
    }
    match serde_json::from_slice::<ErrorBody>(&body) {
        Ok(b) => Error(b.error),
        Err(_) => Error(ApiError::new(
            ErrorCode::Unavailable,
            format!(
                "node {} answered a port connection with {status}; retry shortly",
                node.id
            ),
        )),
    }
}

/// The exposed port and sandbox a `Host` names under `domain`: `<port>-<id>.<domain>`, any
/// case, with or without the listener's port.
pub fn parse_host(host: &str, domain: &str) -> Option<(u16, String)> {
    let host = host.trim().to_ascii_lowercase();
    // `name:port`, never an IPv6 literal (those have no sandbox in them).
    let name = match host.rsplit_once(':') {
        Some((n, p)) if p.bytes().all(|b| b.is_ascii_digit()) => n,
        _ => host.as_str(),
    };
    let name = name.trim_end_matches('.');
    let domain = domain.trim().trim_matches('.').to_ascii_lowercase();
    let label = name.strip_suffix(&domain)?.strip_suffix('.')?;
    let (port, id) = label.split_once('-')?;
    if port.is_empty() || port.len() > 5 || !port.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let port: u16 = port.parse().ok().filter(|p| *p > 0)?;
    if id.is_empty() || !id.bytes().all(|b| b.is_ascii_alphanumeric()) {
        return None;
    }
    Some((port, id.to_string()))
}

/// Sends a request whose `Host` is `<port>-<id>.<sandbox_domain>` to that port; every other
/// request goes on to the API. No API key: an exposed port is public to whoever can reach the
/// control plane and knows the sandbox's id. Headers pass as they came, except a Warren API key
/// (`X-API-Key`, or an `Authorization` bearer that is a valid key), which is removed.
pub async fn host_route(State(c): State<Arc<Control>>, req: Request, next: Next) -> Response {
    let Some(domain) = c.cfg.sandbox_domain.as_deref() else {
        return next.run(req).await;
    };
    let host = req
        .headers()
        .get(header::HOST)
        .and_then(|v| v.to_str().ok())
        .or_else(|| req.uri().host());
    let Some((port, id)) = host.and_then(|h| parse_host(h, domain)) else {
        return next.run(req).await;
    };
    match proxy(&c, port, &id, req).await {
        Ok(r) => r,
        Err(e) => e.into_response(),
    }
}

/// Carries one HTTP request to the port over a fresh stream, and its answer back; a `101`
/// answer (a websocket) joins the two upgraded connections.
async fn proxy(c: &Control, port: u16, id: &str, mut req: Request) -> Result<Response, Error> {
    let (_, node) = forward::route(c, id)?;
    // A Warren key sent along by mistake never reaches the sandbox (its agent is untrusted);
    // a service's own credentials pass. Every Authorization value is looked at, whatever its
    // case.
    let tokens: Vec<String> = req
        .headers()
        .get_all(header::AUTHORIZATION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .map(|v| {
            let v = v.trim();
            match v.split_once(' ') {
                Some((scheme, t)) if scheme.eq_ignore_ascii_case("bearer") => t.trim().to_string(),
                // HTTP Basic: a key may be its password (what /run_code takes).
                Some((scheme, t)) if scheme.eq_ignore_ascii_case("basic") => {
                    use base64::Engine;
                    base64::engine::general_purpose::STANDARD
                        .decode(t.trim())
                        .ok()
                        .and_then(|b| String::from_utf8(b).ok())
                        .and_then(|s| s.split_once(':').map(|(_, k)| k.trim().to_string()))
                        .unwrap_or_default()
                }
                _ => v.to_string(),
            }
        })
        .collect();
    let mut carries_key = false;
    for t in &tokens {
        // Warren's keys look so; any other that works is one too.
        carries_key |= t.starts_with("wrn_") || matches!(c.iam.authenticate(t).await, Ok(Some(_)));
    }
    if carries_key {
        req.headers_mut().remove(header::AUTHORIZATION);
    }
    req.headers_mut().remove("x-api-key");
    let permit = c
        .tunnels
        .clone()
        .try_acquire_owned()
        .map_err(|_| too_many())?;
    // Never resumes: whoever knows the address must not thaw a task its trainer paused.
    let up = open(&node, id, port, false, None).await?;
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(up))
        .await
        .map_err(|e| bad_gateway(port, id, &e))?;
    tokio::spawn(conn.with_upgrades());
    let client_up = req
        .headers()
        .contains_key(header::UPGRADE)
        .then(|| hyper::upgrade::on(&mut req));
    let mut resp = tokio::time::timeout(ANSWER_TIMEOUT, sender.send_request(req))
        .await
        .map_err(|_| {
            Error(ApiError::new(
                ErrorCode::Timeout,
                format!(
                    "port {port} of sandbox {id} did not answer within {} s",
                    ANSWER_TIMEOUT.as_secs()
                ),
            ))
        })?
        .map_err(|e| bad_gateway(port, id, &e))?;
    if resp.status() == StatusCode::SWITCHING_PROTOCOLS
        && let Some(client_up) = client_up
    {
        let server_up = hyper::upgrade::on(&mut resp);
        tokio::spawn(async move {
            if let (Ok(a), Ok(b)) = tokio::join!(client_up, server_up) {
                let (mut a, mut b) = (TokioIo::new(a), TokioIo::new(b));
                let _ = tokio::io::copy_bidirectional(&mut a, &mut b).await;
            }
            drop(permit);
        });
        return Ok(resp.map(Body::new));
    }
    // The answer's body may still be streaming: the place is held until it has been sent.
    Ok(resp.map(|b| {
        Body::new(Held {
            body: b,
            _permit: permit,
        })
    }))
}

/// An answer's body that holds a place among the control plane's streams until it has been
/// sent whole (or dropped).
struct Held<B> {
    body: B,
    _permit: tokio::sync::OwnedSemaphorePermit,
}

impl<B: http_body::Body + Unpin> http_body::Body for Held<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
        std::pin::Pin::new(&mut self.body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.body.size_hint()
    }
}

fn bad_gateway(port: u16, id: &str, e: &dyn std::fmt::Display) -> Error {
    Error(ApiError::new(
        ErrorCode::Unavailable,
        format!("port {port} of sandbox {id} did not answer the request as HTTP/1: {e}"),
    ))
}

#[cfg(test)]
mod tests {
    use super::parse_host;

    #[test]
    fn hosts_name_a_port_and_a_sandbox_under_the_domain() {
        let id = "abcdef0123456789abcd";
        let d = "sb.example.com";
        assert_eq!(
            parse_host(&format!("8000-{id}.sb.example.com"), d),
            Some((8000, id.into()))
        );
        assert_eq!(
            parse_host(
                &format!("8000-{}.SB.Example.com.:443", id.to_uppercase()),
                d
            ),
            Some((8000, id.into()))
        );
        for bad in [
            format!("8000-{id}.example.com"),
            format!("8000-{id}.xsb.example.com"),
            format!("x-{id}.sb.example.com"),
            format!("0-{id}.sb.example.com"),
            format!("70000-{id}.sb.example.com"),
            "8000-.sb.example.com".into(),
            format!("8000-{id}.evil.sb.example.com"),
            "sb.example.com".into(),
            "[::1]:8080".into(),
        ] {
            assert_eq!(parse_host(&bad, d), None, "{bad}");
        }
    }
}
