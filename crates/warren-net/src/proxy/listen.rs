//! The listeners: bound where the firewall redirects to, each accepted connection given a
//! slot of its source's (or reset) and served on a task of its own.

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinSet;
use tracing::debug;

use super::{Refusal, Shared, bump, conn};

/// The backlog of each listener: connections the kernel completes before the proxy accepts
/// them (a burst of a sandbox's connections waits there, not refused).
const BACKLOG: i32 = 1024;

/// A listening socket on `addr`: IPv4 with `IP_FREEBIND` (the gateway address exists only
/// while some sandbox interface carries it, and the proxy listens from the start), IPv6
/// v6-only (so `[::]` takes no IPv4 through mapped addresses) and free-bound too.
pub(super) fn bind(addr: SocketAddr) -> io::Result<std::net::TcpListener> {
    use rustix::net::{AddressFamily, SocketFlags, SocketType, sockopt};
    let family = if addr.is_ipv4() {
        AddressFamily::INET
    } else {
        AddressFamily::INET6
    };
    let fd = rustix::net::socket_with(family, SocketType::STREAM, SocketFlags::CLOEXEC, None)?;
    if addr.is_ipv4() {
        sockopt::set_ip_freebind(&fd, true)?;
    } else {
        sockopt::set_ipv6_v6only(&fd, true)?;
        sockopt::set_ipv6_freebind(&fd, true)?;
    }
    // A restarted node binds again over connections still in TIME_WAIT.
    sockopt::set_socket_reuseaddr(&fd, true)?;
    rustix::net::bind(&fd, &addr)?;
    rustix::net::listen(&fd, BACKLOG)?;
    Ok(std::net::TcpListener::from(fd))
}

/// Accepts connections on one listener until stopped.
pub(super) async fn serve(
    shared: Arc<Shared>,
    listener: TcpListener,
    mut stop: watch::Receiver<bool>,
) {
    // The connections; at most `conns_total` (each holds a slot).
    let mut conns = JoinSet::new();
    loop {
        let (stream, peer) = tokio::select! {
            _ = stop.changed() => break,
            Some(_) = conns.join_next(), if !conns.is_empty() => continue,
            r = listener.accept() => match r {
                Ok(r) => r,
                Err(e) => {
                    // Out of file descriptors, typically: wait for some to close.
                    debug!("proxy accept: {e}");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        bump(&shared.stats.accepted);
        let src = peer.ip();
        let Some(slot) = shared.sources.tcp(src) else {
            let dst = conn::original_dst(&stream).unwrap_or(peer);
            shared.refusal(src, dst, None, &Refusal::TooMany);
            conn::reset(stream);
            continue;
        };
        conns.spawn(conn::serve(Arc::clone(&shared), stream, src, slot));
    }
    conns.shutdown().await;
}
