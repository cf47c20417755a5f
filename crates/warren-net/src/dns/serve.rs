//! The listeners: UDP datagrams and TCP connections (RFC 7766 framing), each message through
//! the rate limit, `Shared::step` and, for an allowed query, `Shared::forward`.

use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream, UdpSocket};
use tokio::sync::watch;
use tokio::task::JoinSet;
use tracing::debug;

use super::limits::Guard;
use super::{HEADER_LEN, Limits, Shared, Step, bump};

/// Serves UDP on one socket until stopped.
pub(super) async fn serve_udp(
    shared: Arc<Shared>,
    socket: Arc<UdpSocket>,
    mut stop: watch::Receiver<bool>,
) {
    // One byte more than the largest query: a datagram that fills it is too long.
    let mut buf = vec![0u8; shared.config.limits.max_udp_query + 1];
    // The forwarding tasks; at most `inflight_total` (each holds an in-flight slot).
    let mut tasks = JoinSet::new();
    loop {
        let (n, peer) = tokio::select! {
            _ = stop.changed() => break,
            Some(_) = tasks.join_next(), if !tasks.is_empty() => continue,
            r = socket.recv_from(&mut buf) => match r {
                Ok(r) => r,
                Err(e) => {
                    // Nothing on an unconnected UDP socket should fail for long; do not spin.
                    debug!("dns udp receive: {e}");
                    tokio::time::sleep(Duration::from_millis(1)).await;
                    continue;
                }
            },
        };
        let stats = &shared.stats;
        bump(&stats.queries);
        let src = peer.ip();
        if n >= buf.len() {
            bump(&stats.malformed);
            continue;
        }
        if !shared.sources.admit_query(src) {
            bump(&stats.rate_limited);
            continue;
        }
        let Some(bytes) = buf.get(..n) else {
            continue;
        };
        let reply = match shared.step(src, bytes, false) {
            Step::Drop => None,
            Step::Reply(b) => Some(b),
            Step::Forward(fwd) => match shared.sources.inflight(src) {
                Some(slot) => {
                    let (shared, socket) = (Arc::clone(&shared), Arc::clone(&socket));
                    tasks.spawn(async move {
                        let reply = shared.forward(src, &fwd).await;
                        drop(slot);
                        if let Some(b) = reply {
                            let _ = socket.send_to(&b, peer).await;
                        }
                    });
                    None
                }
                None => {
                    bump(&stats.overloaded);
                    shared.servfail(&fwd.query, fwd.limit)
                }
            },
        };
        if let Some(b) = reply {
            let _ = socket.send_to(&b, peer).await;
        }
    }
    tasks.shutdown().await;
}

/// Serves TCP on one listener until stopped.
pub(super) async fn serve_tcp(
    shared: Arc<Shared>,
    listener: TcpListener,
    mut stop: watch::Receiver<bool>,
) {
    // The connections; at most `tcp_conns_total` (each holds a TCP slot).
    let mut conns = JoinSet::new();
    loop {
        let (stream, peer) = tokio::select! {
            _ = stop.changed() => break,
            Some(_) = conns.join_next(), if !conns.is_empty() => continue,
            r = listener.accept() => match r {
                Ok(r) => r,
                Err(e) => {
                    // Out of file descriptors, typically: wait for some to close.
                    debug!("dns tcp accept: {e}");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        let Some(slot) = shared.sources.tcp(peer.ip()) else {
            bump(&shared.stats.tcp_rejected);
            continue;
        };
        conns.spawn(serve_conn(Arc::clone(&shared), stream, peer.ip(), slot));
    }
    conns.shutdown().await;
}

/// Serves one TCP connection: its queries one after the other (RFC 7766 allows it), each
/// answered before the next is read, until the client closes, idles, is slow, exceeds a limit
/// or sends something unreadable.
async fn serve_conn(shared: Arc<Shared>, mut stream: TcpStream, src: IpAddr, _slot: Guard) {
    let l = &shared.config.limits;
    let _ = stream.set_nodelay(true);
    for _ in 0..l.tcp_queries_per_conn {
        let Some(msg) = read_message(&mut stream, l).await else {
            return;
        };
        bump(&shared.stats.queries);
        if !shared.sources.admit_query(src) {
            bump(&shared.stats.rate_limited);
            return;
        }
        let reply = match shared.step(src, &msg, true) {
            Step::Drop => None,
            Step::Reply(b) => Some(b),
            Step::Forward(fwd) => match shared.sources.inflight(src) {
                Some(slot) => {
                    let reply = shared.forward(src, &fwd).await;
                    drop(slot);
                    reply
                }
                None => {
                    bump(&shared.stats.overloaded);
                    shared.servfail(&fwd.query, fwd.limit)
                }
            },
        };
        // Nothing to answer (an unreadable message): the framing may be lost too; close.
        let Some(reply) = reply else {
            return;
        };
        let Ok(len) = u16::try_from(reply.len()) else {
            return;
        };
        let mut framed = Vec::with_capacity(2 + reply.len());
        framed.extend_from_slice(&len.to_be_bytes());
        framed.extend_from_slice(&reply);
        match tokio::time::timeout(l.tcp_read_timeout, stream.write_all(&framed)).await {
            Ok(Ok(())) => {}
            _ => return,
        }
    }
}

/// The next length-prefixed message: its first byte within the idle timeout, the rest within
/// the read timeout. None (close) on end of stream, timeout, or a length under a header's or
/// over the limit.
async fn read_message(stream: &mut TcpStream, l: &Limits) -> Option<Vec<u8>> {
    let mut len = [0u8; 2];
    match tokio::time::timeout(l.tcp_idle_timeout, stream.read(&mut len[..1])).await {
        Ok(Ok(1)) => {}
        _ => return None,
    }
    let rest = async {
        stream.read_exact(&mut len[1..]).await.ok()?;
        let n = usize::from(u16::from_be_bytes(len));
        if !(HEADER_LEN..=l.max_tcp_query).contains(&n) {
            return None;
        }
        let mut body = vec![0u8; n];
        stream.read_exact(&mut body).await.ok()?;
        Some(body)
    };
    tokio::time::timeout(l.tcp_read_timeout, rest)
        .await
        .ok()
        .flatten()
}
