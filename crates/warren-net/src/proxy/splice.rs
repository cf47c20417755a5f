//! Both directions of an allowed connection, until both sides close, it idles, the policy
//! cuts it, or a later plain HTTP request is refused.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::Notify;
use tokio::time::Instant;

use super::http::Requests;
use super::{Limits, Refusal};

/// How a spliced connection ended.
#[derive(Debug)]
pub(super) enum End {
    /// Both sides closed.
    Closed,
    /// Nothing moved for the idle timeout.
    Idle,
    /// One side failed (a reset, say): the other is to be reset too.
    Broken,
    /// The policy no longer allows it.
    Cut,
    /// A later request of the client's is refused.
    Refused(Refusal),
}

/// Why one direction stopped early.
enum Stopped {
    Io,
    Refused(Refusal),
}

/// Copies between `client` and `upstream` with a buffer of `limits.buffer` bytes each way;
/// what the client sends goes through `requests` first when it is plain HTTP.
pub(super) async fn splice(
    client: &mut TcpStream,
    upstream: &mut TcpStream,
    requests: Option<Requests>,
    cut: &Notify,
    limits: &Limits,
) -> End {
    let start = Instant::now();
    let last = AtomicU64::new(0);
    let touch = || {
        let ms = u64::try_from(start.elapsed().as_millis()).unwrap_or(u64::MAX);
        last.store(ms, Ordering::Relaxed);
    };
    let (mut cr, mut cw) = client.split();
    let (mut ur, mut uw) = upstream.split();
    let up = pump(&mut cr, &mut uw, requests, limits.buffer, &touch);
    let down = pump(&mut ur, &mut cw, None, limits.buffer, &touch);
    tokio::select! {
        r = async { tokio::try_join!(up, down) } => match r {
            Ok(_) => End::Closed,
            Err(Stopped::Io) => End::Broken,
            Err(Stopped::Refused(why)) => End::Refused(why),
        },
        _ = cut.notified() => End::Cut,
        _ = idle(start, &last, limits.idle_timeout) => End::Idle,
    }
}

/// One direction: reads, (checks,) writes, until end of stream, which it passes on as a
/// half-close.
async fn pump<R, W>(
    r: &mut R,
    w: &mut W,
    mut requests: Option<Requests>,
    size: usize,
    touch: &impl Fn(),
) -> Result<(), Stopped>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let mut buf = vec![0u8; size];
    let mut checked = Vec::new();
    loop {
        let n = r.read(&mut buf).await.map_err(|_| Stopped::Io)?;
        touch();
        if n == 0 {
            let _ = w.shutdown().await;
            return Ok(());
        }
        let read = buf.get(..n).unwrap_or_default();
        let data = match requests.as_mut() {
            Some(q) => {
                checked.clear();
                q.feed(read, &mut checked).map_err(Stopped::Refused)?;
                &checked[..]
            }
            None => read,
        };
        w.write_all(data).await.map_err(|_| Stopped::Io)?;
        touch();
    }
}

/// Returns once `last` (milliseconds after `start`) is `limit` old.
async fn idle(start: Instant, last: &AtomicU64, limit: Duration) {
    loop {
        let at = start + Duration::from_millis(last.load(Ordering::Relaxed)) + limit;
        if Instant::now() >= at {
            return;
        }
        tokio::time::sleep_until(at).await;
    }
}
