//! TCP streams over HTTP: `GET .../ports/{port}/connect` with `Connection: upgrade` and
//! `Upgrade: tcp` is answered `101 Switching Protocols`, and the connection then carries the
//! bytes of a TCP connection to a sandbox's exposed port. The control plane opens one to a
//! node for each request of its `<port>-<id>.<domain>` route.

use axum::extract::Request;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::Response;
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite};
use warren_types::error::ApiError;

/// The `Upgrade` protocol of a tunnel.
pub const PROTOCOL: &str = "tcp";

/// Whether the request asks for a tunnel (`Connection: upgrade`, `Upgrade: tcp`), or why not.
pub fn check(headers: &HeaderMap) -> Result<(), ApiError> {
    let has = |name: header::HeaderName, want: &str| {
        headers.get_all(name).iter().any(|v| {
            v.to_str()
                .is_ok_and(|s| s.split(',').any(|t| t.trim().eq_ignore_ascii_case(want)))
        })
    };
    if has(header::CONNECTION, "upgrade") && has(header::UPGRADE, PROTOCOL) {
        Ok(())
    } else {
        Err(ApiError::invalid(
            "this route opens a TCP stream to the sandbox's port: send `Connection: upgrade` \
             and `Upgrade: tcp` (or use the port's host address from the sandbox's network \
             status)",
        ))
    }
}

/// Answers `req` with `101 Switching Protocols` and, once the client's side is upgraded,
/// copies bytes both ways between it and `stream` until either closes or `stop` completes;
/// `guard` is dropped then (it can mark the sandbox busy and hold a place meanwhile).
pub fn accept<S, G, F>(req: &mut Request, mut stream: S, guard: G, stop: F) -> Response
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    G: Send + 'static,
    F: std::future::Future<Output = ()> + Send + 'static,
{
    let on = hyper::upgrade::on(req);
    tokio::spawn(async move {
        tokio::select! {
            _ = async {
                if let Ok(up) = on.await {
                    let mut up = TokioIo::new(up);
                    let _ = tokio::io::copy_bidirectional(&mut up, &mut stream).await;
                }
            } => {}
            () = stop => {}
        }
        drop(guard);
    });
    Response::builder()
        .status(StatusCode::SWITCHING_PROTOCOLS)
        .header(header::CONNECTION, "upgrade")
        .header(header::UPGRADE, PROTOCOL)
        .body(axum::body::Body::empty())
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tunnel_needs_both_headers() {
        let mut h = HeaderMap::new();
        assert!(check(&h).is_err());
        h.insert(header::CONNECTION, "keep-alive, Upgrade".parse().unwrap());
        assert!(check(&h).is_err());
        h.insert(header::UPGRADE, "TCP".parse().unwrap());
        assert!(check(&h).is_ok());
        h.insert(header::UPGRADE, "websocket".parse().unwrap());
        let e = check(&h).unwrap_err();
        assert!(e.message.contains("Upgrade: tcp"), "{}", e.message);
    }
}
