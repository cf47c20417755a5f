//! One exchange with the upstream resolver: UDP from a fresh socket, TCP when the answer is
//! truncated, the whole bounded by one timeout.

use std::fmt;
use std::io;
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use hickory_proto::op::{Message, Query};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpStream, UdpSocket};

use super::message;

/// The largest UDP answer read. The proxy asks for at most 1232 bytes; a longer datagram
/// (a server ignoring that) is asked again over TCP rather than read cut short.
const UDP_BUF: usize = 4096;

/// Why the upstream gave no usable answer.
#[derive(Debug)]
pub(super) enum UpstreamError {
    /// No answer within the timeout.
    Timeout,
    /// A socket error (the upstream refused or reset the connection, no route, ...).
    Io(io::Error),
    /// The query could not be encoded or the TCP answer does not match it.
    Unusable(&'static str),
}

impl fmt::Display for UpstreamError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            UpstreamError::Timeout => f.write_str("no answer in time"),
            UpstreamError::Io(e) => write!(f, "{e}"),
            UpstreamError::Unusable(why) => f.write_str(why),
        }
    }
}

impl From<io::Error> for UpstreamError {
    fn from(e: io::Error) -> Self {
        UpstreamError::Io(e)
    }
}

/// Asks `upstream` question `q`, over UDP and then TCP if the UDP answer is truncated, all
/// within `timeout`. Packets that do not answer this very query (another id or question)
/// are counted in `spoofed` and ignored while the time lasts.
pub(super) async fn resolve(
    upstream: SocketAddr,
    q: &Query,
    timeout: Duration,
    spoofed: &AtomicU64,
) -> Result<Message, UpstreamError> {
    match tokio::time::timeout(timeout, exchange(upstream, q, spoofed)).await {
        Ok(r) => r,
        Err(_) => Err(UpstreamError::Timeout),
    }
}

async fn exchange(
    upstream: SocketAddr,
    q: &Query,
    spoofed: &AtomicU64,
) -> Result<Message, UpstreamError> {
    // A fresh id from a CSPRNG for each upstream query: the sandbox's own id is never reused,
    // so a sandbox cannot line up forged answers with queries it makes the proxy send.
    let id = rand::random::<u16>();
    let query = message::upstream_query(id, q)
        .ok_or(UpstreamError::Unusable("the query does not encode"))?;
    if let Some(answer) = udp(upstream, &query, id, q, spoofed).await? {
        return Ok(answer);
    }
    let id = rand::random::<u16>();
    let query = message::upstream_query(id, q)
        .ok_or(UpstreamError::Unusable("the query does not encode"))?;
    tcp(upstream, &query, id, q).await
}

/// The UDP answer, or None when it is truncated (ask over TCP).
async fn udp(
    upstream: SocketAddr,
    query: &[u8],
    id: u16,
    q: &Query,
    spoofed: &AtomicU64,
) -> Result<Option<Message>, UpstreamError> {
    let local: SocketAddr = match upstream {
        SocketAddr::V4(_) => (Ipv4Addr::UNSPECIFIED, 0).into(),
        SocketAddr::V6(_) => (Ipv6Addr::UNSPECIFIED, 0).into(),
    };
    // A socket per query on port 0: Linux gives each a random ephemeral port, 16 more bits a
    // spoofer must guess besides the id. Connected, so the kernel drops datagrams from any
    // address but the upstream's.
    let socket = UdpSocket::bind(local).await?;
    socket.connect(upstream).await?;
    socket.send(query).await?;
    let mut buf = vec![0u8; UDP_BUF + 1];
    loop {
        let n = socket.recv(&mut buf).await?;
        let bytes = buf.get(..n).unwrap_or_default();
        if n > UDP_BUF && bytes.get(..2) == Some(&id.to_be_bytes()[..]) {
            return Ok(None);
        }
        match message::parse_upstream(bytes, id, q) {
            Some(m) if m.metadata.truncation => return Ok(None),
            Some(m) => return Ok(Some(m)),
            None => {
                spoofed.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
}

async fn tcp(
    upstream: SocketAddr,
    query: &[u8],
    id: u16,
    q: &Query,
) -> Result<Message, UpstreamError> {
    let len =
        u16::try_from(query.len()).map_err(|_| UpstreamError::Unusable("the query is too long"))?;
    let mut stream = TcpStream::connect(upstream).await?;
    stream.set_nodelay(true)?;
    let mut framed = Vec::with_capacity(2 + query.len());
    framed.extend_from_slice(&len.to_be_bytes());
    framed.extend_from_slice(query);
    stream.write_all(&framed).await?;
    let mut len = [0u8; 2];
    stream.read_exact(&mut len).await?;
    let mut body = vec![0u8; usize::from(u16::from_be_bytes(len))];
    stream.read_exact(&mut body).await?;
    message::parse_upstream(&body, id, q).ok_or(UpstreamError::Unusable(
        "the TCP answer does not answer the query",
    ))
}
