//! One redirected connection: its first bytes read and judged, the name dialled, the two
//! sides spliced — or a refusal the client sees at once.

use std::io;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::{Instant, timeout};
use tracing::debug;

use super::hello::{HelloReader, Progress};
use super::http::{self, Framing, Requests};
use super::live::Entry;
use super::splice::{self, End};
use super::{Refusal, Shared, bump};
use crate::dns;
use crate::dns::limits::Guard;

/// The first byte of a TLS handshake record.
const TLS_HANDSHAKE: u8 = 22;
/// Addresses of a name tried, at most.
const MAX_ATTEMPTS: usize = 4;
/// How long a refused HTTP client has to take its answer.
const ANSWER_TIME: Duration = Duration::from_secs(1);
/// What is read and discarded of a refused HTTP client's request after the answer (so that
/// closing does not reset the answer away).
const ANSWER_DRAIN: usize = 64 * 1024;

/// The connection's original destination, before the firewall's redirect; None when it was
/// not redirected (its destination is the proxy's own address) or conntrack has no entry.
pub(super) fn original_dst(s: &TcpStream) -> Option<SocketAddr> {
    use rustix::net::sockopt;
    let local = s.local_addr().ok()?;
    let orig = match local {
        SocketAddr::V4(_) => SocketAddr::V4(sockopt::ip_original_dst(s).ok()?),
        SocketAddr::V6(_) => SocketAddr::V6(sockopt::ipv6_original_dst(s).ok()?),
    };
    (orig != local).then_some(orig)
}

/// Closes `s` with a reset (`SO_LINGER` 0): the client fails at once.
pub(super) fn reset(s: TcpStream) {
    let _ = rustix::net::sockopt::set_socket_linger(&s, Some(Duration::ZERO));
    drop(s);
}

/// What the first bytes were.
enum First {
    Tls(super::hello::Hello),
    /// A request head (its length in the buffer).
    Http(http::Head, usize),
}

/// Why reading the first bytes stopped.
enum Stop {
    /// The client closed (or failed) before sending anything to judge: nothing to report.
    Closed,
    Refused(Refusal),
}

/// Reads into `buf` (its length is the bound) until a whole ClientHello or request head is
/// there; `filled` says how much was read.
async fn read_first(
    stream: &mut TcpStream,
    buf: &mut [u8],
    filled: &mut usize,
) -> Result<First, Stop> {
    let max = buf.len();
    let mut hello = HelloReader::new(max);
    let mut scanned = 0;
    loop {
        let Some(free) = buf.get_mut(*filled..).filter(|f| !f.is_empty()) else {
            return Err(Stop::Refused(Refusal::TooLarge));
        };
        let n = match stream.read(free).await {
            Ok(0) | Err(_) => return Err(Stop::Closed),
            Ok(n) => n,
        };
        *filled += n;
        let read = buf.get(..*filled).unwrap_or_default();
        if read.first() == Some(&TLS_HANDSHAKE) {
            match hello.advance(read) {
                Progress::More => {}
                Progress::Done(h) => return Ok(First::Tls(h)),
                Progress::Refuse(r) => return Err(Stop::Refused(r)),
            }
        } else {
            if let Some(end) = http::head_end(read, scanned) {
                let head = read.get(..end).unwrap_or_default();
                return http::parse_head(head)
                    .map(|h| First::Http(h, end))
                    .map_err(Stop::Refused);
            }
            scanned = read.len();
            if read.len() >= max {
                return Err(Stop::Refused(Refusal::TooLarge));
            }
        }
    }
}

/// A connection judged allowed and connected to its name.
struct Allowed {
    name: String,
    upstream: TcpStream,
    /// Its place among the live connections (a policy change cuts it through this).
    entry: Entry,
    /// What goes to the upstream first: the bytes read while judging (for plain HTTP, what
    /// the framing let through of them).
    first: Vec<u8>,
    /// Plain HTTP: the reader of its later requests.
    requests: Option<Requests>,
}

/// A connection refused while judged.
struct Refused {
    name: Option<String>,
    why: Refusal,
    /// The client speaks plain HTTP and may get an answer.
    http: bool,
}

impl Refused {
    fn new(name: Option<&str>, why: Refusal, http: bool) -> Refused {
        Refused {
            name: name.map(String::from),
            why,
            http,
        }
    }
}

/// Serves one accepted connection from `src`, holding its slot until it ends.
pub(super) async fn serve(shared: Arc<Shared>, mut client: TcpStream, src: IpAddr, _slot: Guard) {
    let _ = client.set_nodelay(true);
    let Some(dst) = original_dst(&client) else {
        let local = client.local_addr().unwrap_or(SocketAddr::from(([0; 4], 0)));
        let r = Refused::new(None, Refusal::NotRedirected, false);
        return refuse(&shared, client, src, local, r).await;
    };
    let a = match judge(&shared, &mut client, src, dst).await {
        Ok(a) => a,
        Err(None) => return,
        Err(Some(r)) => return refuse(&shared, client, src, dst, r).await,
    };
    let Allowed {
        name,
        mut upstream,
        entry,
        first,
        requests,
    } = a;
    let l = &shared.config.limits;
    bump(&shared.stats.spliced);
    match timeout(l.connect_timeout, upstream.write_all(&first)).await {
        Ok(Ok(())) => {}
        _ => return reset(client),
    }
    drop(first);

    let why = match splice::splice(&mut client, &mut upstream, requests, &entry.cut, l).await {
        End::Closed => return,
        End::Idle => return bump(&shared.stats.idle_closed),
        End::Broken => None,
        End::Cut => Some(Refusal::PolicyChanged),
        End::Refused(why) => Some(why),
    };
    if let Some(why) = why {
        let shown = match &why {
            Refusal::HostChanged(n) => n,
            _ => &name,
        };
        shared.refusal(src, dst, Some(shown), &why);
    }
    reset(client);
    reset(upstream);
}

/// Reads the first bytes of `client`, asks the policy, and dials the name. Err(None): the
/// client left before saying anything.
async fn judge(
    shared: &Shared,
    client: &mut TcpStream,
    src: IpAddr,
    dst: SocketAddr,
) -> Result<Allowed, Option<Refused>> {
    let l = &shared.config.limits;
    let mut buf = vec![0u8; l.max_head];
    let mut filled = 0;
    let first = timeout(
        l.first_bytes_timeout,
        read_first(client, &mut buf, &mut filled),
    )
    .await
    .unwrap_or(Err(Stop::Refused(Refusal::Timeout)));
    let http = filled > 0 && buf.first() != Some(&TLS_HANDSHAKE);
    let (name, head) = match first {
        Ok(First::Tls(h)) => {
            bump(&shared.stats.tls);
            if h.ech && shared.config.refuse_ech {
                return Err(Some(Refused::new(Some(&h.name), Refusal::Ech, false)));
            }
            (h.name, None)
        }
        Ok(First::Http(head, end)) => {
            bump(&shared.stats.http);
            (head.name, Some((head.framing, end)))
        }
        Err(Stop::Closed) => return Err(None),
        Err(Stop::Refused(why)) => return Err(Some(Refused::new(None, why, http))),
    };
    let refused = |why| Some(Refused::new(Some(&name), why, http));

    let policy = &shared.policy;
    let port = dst.port();
    let generation = policy
        .decide(src, &name, port)
        .ok_or_else(|| refused(Refusal::Denied))?;
    let entry = shared.live.insert(src, &name, port, generation);
    // A policy change between the decision and the entry: its recheck may have missed this
    // connection, so look again now that a later one cannot.
    if policy.current(src) != Some(generation) {
        let g = policy
            .decide(src, &name, port)
            .ok_or_else(|| refused(Refusal::Denied))?;
        entry.set_generation(g);
    }

    let read = buf.get(..filled).unwrap_or_default();
    let (first, requests) = match head {
        None => (read.to_vec(), None),
        Some((framing, end)) => {
            // A refusal here is of a pipelined later request: reset, no answer.
            let (out, r) = first_requests(&name, framing, read, end, l.max_head)
                .map_err(|why| Some(Refused::new(Some(&name), why, false)))?;
            (out, Some(r))
        }
    };
    drop(buf);

    let upstream = tokio::select! {
        r = dial(shared, src, &name, dst) => r,
        _ = entry.cut.notified() => Err(Refusal::PolicyChanged),
    }
    .map_err(refused)?;
    Ok(Allowed {
        name,
        upstream,
        entry,
        first,
        requests,
    })
}

/// The bytes of a plain HTTP connection that go out first — its first head, and what
/// followed it that the framing lets through — and the reader of its later requests.
fn first_requests(
    name: &str,
    framing: Framing,
    read: &[u8],
    end: usize,
    max_head: usize,
) -> Result<(Vec<u8>, Requests), Refusal> {
    let mut requests = Requests::after(name.to_string(), framing, max_head);
    let (head, rest) = read.split_at(end.min(read.len()));
    let mut out = head.to_vec();
    requests.feed(rest, &mut out)?;
    Ok((out, requests))
}

/// Counts and reports a refusal, then closes the client: a short HTTP answer for a plain
/// HTTP client when the refusal has one, else a reset.
async fn refuse(shared: &Shared, client: TcpStream, src: IpAddr, dst: SocketAddr, r: Refused) {
    shared.refusal(src, dst, r.name.as_deref(), &r.why);
    match r.why.http_status().filter(|_| r.http) {
        Some(status) => answer(client, status, &r.why).await,
        None => reset(client),
    }
}

/// Answers a refused HTTP request with `status` and the reason, then closes: the rest of the
/// request is read and discarded for a moment first, so the close does not reset the answer
/// away.
async fn answer(mut client: TcpStream, status: &str, why: &Refusal) {
    let body = format!("warren: {why}\n");
    let msg = format!(
        "HTTP/1.1 {status}\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: {}\r\n\
         Connection: close\r\n\r\n{body}",
        body.len()
    );
    let deadline = Instant::now() + ANSWER_TIME;
    let sent = async {
        client.write_all(msg.as_bytes()).await?;
        client.shutdown().await?;
        let mut sink = [0u8; 4096];
        let mut drained = 0;
        while drained < ANSWER_DRAIN {
            match client.read(&mut sink).await? {
                0 => break,
                n => drained += n,
            }
        }
        Ok::<(), io::Error>(())
    };
    if !matches!(tokio::time::timeout_at(deadline, sent).await, Ok(Ok(()))) {
        reset(client);
    }
}

/// Resolves `name` and connects to one of its addresses on the original port: the client's
/// family first, the other when that gives nothing usable.
async fn dial(
    shared: &Shared,
    src: IpAddr,
    name: &str,
    dst: SocketAddr,
) -> Result<TcpStream, Refusal> {
    let c = &shared.config;
    let l = &c.limits;
    let port = dst.port();
    let mut rebinding = Vec::new();
    let mut denied = Vec::new();
    let mut unreachable = false;
    for v6 in [dst.is_ipv6(), !dst.is_ipv6()] {
        let found = match shared.cache.get(name, v6) {
            Some(f) => f,
            None => {
                let spoofed = &shared.stats.spoofed;
                match dns::lookup(c.upstream, name, v6, l.resolve_timeout, &c.never, spoofed).await
                {
                    Ok(f) => {
                        shared.cache.put(name, v6, &f);
                        f
                    }
                    Err(e) => {
                        debug!(%src, name, v6, "proxy: resolving: {e}");
                        continue;
                    }
                }
            }
        };
        rebinding.extend(found.dropped);
        let mut addrs: Vec<IpAddr> = Vec::with_capacity(found.addrs.len());
        for a in found.addrs {
            if shared.policy.may_dial(src, a, port) {
                addrs.push(a);
            } else {
                denied.push(a);
            }
        }
        // The address the client dialled goes first when it is one of the name's.
        if let Some(i) = addrs.iter().position(|&a| a == dst.ip()) {
            addrs[..=i].rotate_right(1);
        }
        addrs.truncate(MAX_ATTEMPTS);
        if addrs.is_empty() {
            continue;
        }
        match connect_any(&addrs, port, l.connect_timeout, c.mark).await {
            Some(s) => return Ok(s),
            None => unreachable = true,
        }
    }
    Err(if unreachable {
        Refusal::Unreachable
    } else if !rebinding.is_empty() {
        Refusal::Rebinding(rebinding)
    } else if !denied.is_empty() {
        Refusal::DeniedAddress(denied)
    } else {
        Refusal::Unresolved
    })
}

/// Connects to the first of `addrs` that answers, each given an equal share of the time
/// left; each connection carries `mark`.
async fn connect_any(
    addrs: &[IpAddr],
    port: u16,
    within: Duration,
    mark: Option<u32>,
) -> Option<TcpStream> {
    let deadline = Instant::now() + within;
    for (i, &a) in addrs.iter().enumerate() {
        let left = deadline.saturating_duration_since(Instant::now());
        let share = left / u32::try_from(addrs.len() - i).unwrap_or(1);
        let socket = match marked_socket(a, mark) {
            Ok(s) => s,
            Err(e) => {
                debug!(%a, port, "proxy: a socket to connect with: {e}");
                return None;
            }
        };
        match timeout(share, socket.connect(SocketAddr::new(a, port))).await {
            Ok(Ok(s)) => {
                let _ = s.set_nodelay(true);
                return Some(s);
            }
            Ok(Err(e)) => debug!(%a, port, "proxy: connecting: {e}"),
            Err(_) => debug!(%a, port, "proxy: connecting: timed out"),
        }
    }
    None
}

/// A TCP socket for an address of `a`'s family, carrying `mark` (`SO_MARK`, which needs
/// `CAP_NET_ADMIN`: the node has it).
fn marked_socket(a: IpAddr, mark: Option<u32>) -> std::io::Result<tokio::net::TcpSocket> {
    let domain = if a.is_ipv6() {
        socket2::Domain::IPV6
    } else {
        socket2::Domain::IPV4
    };
    let s = socket2::Socket::new(domain, socket2::Type::STREAM, Some(socket2::Protocol::TCP))?;
    if let Some(m) = mark {
        s.set_mark(m)?;
    }
    s.set_nonblocking(true)?;
    s.set_cloexec(true)?;
    Ok(tokio::net::TcpSocket::from_std_stream(s.into()))
}
