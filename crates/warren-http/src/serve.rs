//! Serving a router with the limits a public server needs: a client has
//! [`HEADER_READ_TIMEOUT`] to send a request's headers (a slow-headers client cannot pin a
//! connection before authentication), and a keep-alive connection that stays idle as long
//! is closed. `axum::serve` sets neither.

use std::future::Future;
use std::time::Duration;

use axum::Router;
use axum::serve::Listener;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use tower::ServiceExt;

/// How long a client may take to send a request's headers, and how long a keep-alive
/// connection may wait for its next request.
pub const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);

/// The address of the client a request came from, as its listener saw it (`127.0.0.1:5234`;
/// a Unix socket's peers are unnamed): in each request's extensions, for the audit log.
#[derive(Debug, Clone)]
pub struct Peer(pub std::sync::Arc<str>);

/// Serves `router` on `listener` until `shutdown` resolves; then stops accepting, lets the
/// requests in flight finish (the caller bounds how long it waits) and returns.
pub async fn serve<L: Listener<Addr: std::fmt::Debug>>(
    mut listener: L,
    router: Router,
    shutdown: impl Future<Output = ()> + Send,
) {
    let graceful = GracefulShutdown::new();
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(HEADER_READ_TIMEOUT);
    builder
        .http2()
        .timer(TokioTimer::new())
        .keep_alive_interval(Some(HEADER_READ_TIMEOUT));
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            (io, addr) = listener.accept() => {
                let peer = Peer(format!("{addr:?}").into());
                let svc = TowerToHyperService::new(router.clone().map_request(
                    move |mut req: axum::extract::Request<hyper::body::Incoming>| {
                        req.extensions_mut().insert(peer.clone());
                        req
                    },
                ));
                let conn = builder.serve_connection_with_upgrades(TokioIo::new(io), svc);
                let conn = graceful.watch(conn.into_owned());
                tokio::spawn(async move {
                    let _ = conn.await;
                });
            }
            () = &mut shutdown => break,
        }
    }
    drop(listener);
    graceful.shutdown().await;
}
