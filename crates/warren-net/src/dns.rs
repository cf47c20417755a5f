//! The DNS proxy: each sandbox's only resolver.
//!
//! It listens on UDP and TCP (RFC 7766 framing) on the node addresses it is given, asks the
//! node's [`Policy`] about every query, forwards allowed ones to one upstream resolver and
//! answers with the question's CNAME chain and addresses only, minus any address a sandbox
//! must never reach (DNS rebinding). The node learns each allowed answer before the sandbox
//! does ([`Policy::resolved`]), so it can open its firewall for those addresses first.
//!
//! What a sandbox gets, by query:
//!
//! | query | answer |
//! |---|---|
//! | from an address that is no sandbox's | REFUSED, nothing recorded |
//! | a name the policy denies, or one no rule can match (bytes other than letters, digits, `-`, `_`) | NXDOMAIN (with Extended DNS Error 18 "Prohibited" under EDNS), [`Policy::refused`] |
//! | an allowed name, type A, AAAA or CNAME | forwarded; the filtered answer, or SERVFAIL |
//! | an allowed name, type ANY, AXFR or IXFR | NOTIMP |
//! | an allowed name, any other type (MX, TXT, SRV, HTTPS, SVCB, ...) | NOERROR, no records |
//! | unreadable, or a response | nothing |
//! | another opcode, class or EDNS version, or not one question | NOTIMP, NOTIMP, BADVERS, FORMERR |
//!
//! Only A, AAAA and CNAME are forwarded because addresses are all a sandbox may use (a domain
//! rule allows TCP to a name's addresses), and every other type is a way around the filter:
//! HTTPS/SVCB carry address hints that would skip the rebinding filter and the firewall's
//! opening, and name targets the policy never saw; MX/SRV name other hosts; TXT is a data
//! channel. An empty NOERROR is what a name without such records gets, so clients fall back to
//! A/AAAA (RFC 9460 clients do without HTTPS records). ANY gets NOTIMP as RFC 8482 allows.
//!
//! Every resource a sandbox can make the proxy spend is bounded (see [`Limits`]): query sizes,
//! TCP read, idle and write times, queries per connection, connections and upstream queries in
//! flight per source and in total, a per-source query rate and a per-source rate of
//! [`Policy::refused`] events. Over the in-flight limits a query gets SERVFAIL at once (cheap,
//! no larger than the query, and the client's stub gives up fast instead of retrying for
//! seconds); over the rate limit it is dropped (answering a flood is what the limit prevents).

#[doc(hidden)]
pub mod fuzz;
pub(crate) mod limits;
mod lookup;
mod message;
mod serve;
#[cfg(test)]
mod tests;
mod upstream;

use std::io;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use hickory_proto::op::{Message, ResponseCode};
use hickory_proto::rr::RecordType;
use tokio::net::{TcpListener, UdpSocket};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tracing::debug;
use warren_types::net::Cidr;

use limits::Sources;
pub(crate) use lookup::{Lookup, lookup};
use message::Parsed;

/// The shortest DNS message: its header.
const HEADER_LEN: usize = 12;
/// The largest answer over TCP (its 2-byte length).
const TCP_LIMIT: usize = 65535;
/// Extended DNS Error 15, "Blocked": an allowed name's answer lost addresses to the rebinding
/// filter.
const EDE_BLOCKED: u16 = 15;
const EDE_REBINDING_TEXT: &str =
    "warren: addresses a sandbox may never reach were removed from this answer";

/// What the policy says about a query.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Decision {
    /// The source is a sandbox that may resolve the name.
    Allow,
    /// The source is a sandbox that may not resolve the name.
    Deny,
    /// The source address is no sandbox's.
    Unknown,
}

/// Why a name was refused, for the incident log.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// The sandbox's policy does not allow the name.
    Denied,
    /// The name holds bytes no policy pattern can match (anything but letters, digits, `-` and
    /// `_`, such as a `.` inside a label); the name given is escaped (`\DDD`).
    BadName,
    /// The name is allowed, but its answer held these addresses, inside the ranges a sandbox
    /// may never reach; they were removed from the answer.
    Rebinding(Vec<IpAddr>),
}

/// What the proxy asks the node about each query; implemented by the node (tests implement it
/// too).
///
/// The methods are called on the proxy's tokio worker threads, inline: they should return
/// quickly (a table lookup, a netlink message), not block on slow I/O.
pub trait Policy: Send + Sync + 'static {
    /// The sandbox that owns source address `src`, and whether it may resolve `name` (lower
    /// case, no trailing dot). Returns [`Decision::Unknown`] for an address that is no
    /// sandbox's (answer REFUSED, record nothing).
    fn decide(&self, src: IpAddr, name: &str) -> Decision;

    /// An allowed name resolved: these addresses (after rebinding filtering) for `ttl`
    /// seconds. Called before the answer is sent to the sandbox, so that the node can open the
    /// firewall first. Not called for an answer without addresses.
    fn resolved(&self, src: IpAddr, name: &str, addrs: &[IpAddr], ttl: u32);

    /// A name was refused (or an answer's addresses dropped for rebinding): for the incident
    /// log. At most [`Limits::events_per_source`] a second per source; the rest are counted in
    /// [`Counters::events_suppressed`].
    fn refused(&self, src: IpAddr, name: &str, why: Refusal);
}

/// Bounds on everything a sandbox can make the proxy spend.
///
/// Each upstream query in flight holds a socket of its own (a fresh port), and each TCP
/// connection one: the process's file limit must exceed `inflight_total + tcp_conns_total`
/// and the listeners (the defaults need about 1600, over the usual soft limit of 1024). Short
/// of descriptors, queries get SERVFAIL and connections wait; nothing fails for good.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Largest UDP query read, in bytes (longer ones are dropped); also the UDP payload size
    /// advertised to clients and the most a UDP answer may be. Default 4096.
    pub max_udp_query: usize,
    /// Largest TCP query, in bytes; a longer length prefix closes the connection. Default
    /// 65535 (all the framing allows).
    pub max_tcp_query: usize,
    /// How long a TCP connection may wait for its next query before it is closed. Default
    /// 10 s.
    pub tcp_idle_timeout: Duration,
    /// How long a TCP query may take to arrive once its first byte has (slow senders are
    /// closed), and an answer to be written. Default 5 s.
    pub tcp_read_timeout: Duration,
    /// Queries answered on one TCP connection before it is closed. Default 100.
    pub tcp_queries_per_conn: usize,
    /// TCP connections open at once per source address. Default 8.
    pub tcp_conns_per_source: usize,
    /// TCP connections open at once in total. Default 512.
    pub tcp_conns_total: usize,
    /// Upstream queries in flight at once per source address (more get SERVFAIL). Default 64.
    pub inflight_per_source: usize,
    /// Upstream queries in flight at once in total (more get SERVFAIL). Default 1024.
    pub inflight_total: usize,
    /// Queries a second per source address, sustained (more are dropped). Default 200.
    pub rate_per_source: u32,
    /// Queries per source address in a burst. Default 400.
    pub burst_per_source: u32,
    /// [`Policy::refused`] events a second per source address (and in a burst). Default 100.
    pub events_per_source: u32,
    /// Source addresses tracked at once; when all are busy, queries from new addresses are
    /// dropped. Default 65536.
    pub max_sources: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_udp_query: 4096,
            max_tcp_query: 65535,
            tcp_idle_timeout: Duration::from_secs(10),
            tcp_read_timeout: Duration::from_secs(5),
            tcp_queries_per_conn: 100,
            tcp_conns_per_source: 8,
            tcp_conns_total: 512,
            inflight_per_source: 64,
            inflight_total: 1024,
            rate_per_source: 200,
            burst_per_source: 400,
            events_per_source: 100,
            max_sources: 65536,
        }
    }
}

/// The proxy's configuration.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Config {
    /// Addresses to listen on, UDP and TCP on each (the same port). Each must be a specific
    /// address, not `0.0.0.0` or `::`: answers leave from the address the query came to. Port
    /// 0 picks a free port (see [`DnsProxy::local_addrs`]).
    pub listen: Vec<SocketAddr>,
    /// The resolver allowed queries are forwarded to.
    pub upstream: SocketAddr,
    /// How long the upstream has to answer (UDP and a TCP retry together) before the sandbox
    /// gets SERVFAIL. Default 2 s.
    pub upstream_timeout: Duration,
    /// Least TTL of an answer, in seconds (shorter ones are raised, so the firewall does not
    /// close before the sandbox connects). Default 30.
    pub min_ttl: u32,
    /// Greatest TTL of an answer, in seconds (longer ones are lowered, so an address stays
    /// open at most that long). Default 600.
    pub max_ttl: u32,
    /// Addresses an answer must never hold (DNS rebinding): the node's own, the control
    /// plane's, other sandboxes', loopback, link-local and cloud metadata. Always added:
    /// `0.0.0.0/8`, `::` and IPv4-mapped IPv6 (`::ffff:0:0/96`).
    pub never: Vec<Cidr>,
    /// Resource bounds.
    pub limits: Limits,
}

impl Config {
    /// A configuration with the default timeout, TTL bounds and limits, and no `never` ranges
    /// beyond the built-in ones.
    pub fn new(listen: Vec<SocketAddr>, upstream: SocketAddr) -> Config {
        Config {
            listen,
            upstream,
            upstream_timeout: Duration::from_secs(2),
            min_ttl: 30,
            max_ttl: 600,
            never: Vec::new(),
            limits: Limits::default(),
        }
    }

    fn check(&self) -> Result<(), String> {
        let l = &self.limits;
        if self.listen.is_empty() {
            return Err("no listen address".into());
        }
        if let Some(a) = self.listen.iter().find(|a| a.ip().is_unspecified()) {
            return Err(format!(
                "listen address {a} is unspecified: give the node's address on the sandbox \
                 network, so answers leave from the address queries came to"
            ));
        }
        if self.min_ttl > self.max_ttl {
            return Err(format!(
                "min_ttl {} is more than max_ttl {}",
                self.min_ttl, self.max_ttl
            ));
        }
        if self.upstream_timeout.is_zero() {
            return Err("upstream_timeout is zero".into());
        }
        if !(512..=65535).contains(&l.max_udp_query) {
            return Err("limits.max_udp_query must be 512 to 65535".into());
        }
        if !(HEADER_LEN..=65535).contains(&l.max_tcp_query) {
            return Err("limits.max_tcp_query must be 12 to 65535".into());
        }
        let zero = [
            ("tcp_idle_timeout", l.tcp_idle_timeout.is_zero()),
            ("tcp_read_timeout", l.tcp_read_timeout.is_zero()),
            ("tcp_queries_per_conn", l.tcp_queries_per_conn == 0),
            ("inflight_per_source", l.inflight_per_source == 0),
            ("inflight_total", l.inflight_total == 0),
            ("rate_per_source", l.rate_per_source == 0),
            ("burst_per_source", l.burst_per_source == 0),
            ("max_sources", l.max_sources == 0),
        ];
        if let Some((name, _)) = zero.iter().find(|(_, z)| *z) {
            return Err(format!("limits.{name} is zero: nothing would be answered"));
        }
        Ok(())
    }
}

/// The proxy's counters, for tests and metrics: a snapshot of [`DnsProxy::counters`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counters {
    /// Messages received (UDP datagrams, TCP messages), before any check.
    pub queries: u64,
    /// Queries for names the policy allowed.
    pub allowed: u64,
    /// Queries for names refused: denied by the policy, or no rule could match them.
    pub refused: u64,
    /// Queries from addresses that are no sandbox's (REFUSED).
    pub unknown_source: u64,
    /// Addresses removed from answers as rebinding.
    pub rebinding_dropped: u64,
    /// Upstream exchanges that failed (timeout, socket error, unusable answer, an rcode other
    /// than NOERROR and NXDOMAIN): SERVFAIL.
    pub upstream_errors: u64,
    /// Messages dropped by the per-source rate limit, or because the source table was full
    /// (a TCP connection is closed then, and counts once).
    pub rate_limited: u64,
    /// Queries answered SERVFAIL because too many upstream queries were in flight.
    pub overloaded: u64,
    /// Messages answered FORMERR, NOTIMP (opcode, class) or BADVERS, or dropped unread.
    pub malformed: u64,
    /// Upstream packets ignored: another id or question, or unreadable.
    pub spoofed: u64,
    /// TCP connections closed on arrival: too many of the source's, or in total.
    pub tcp_rejected: u64,
    /// [`Policy::refused`] events not reported, over the per-source event rate.
    pub events_suppressed: u64,
}

#[derive(Debug, Default)]
struct Stats {
    queries: AtomicU64,
    allowed: AtomicU64,
    refused: AtomicU64,
    unknown_source: AtomicU64,
    rebinding_dropped: AtomicU64,
    upstream_errors: AtomicU64,
    rate_limited: AtomicU64,
    overloaded: AtomicU64,
    malformed: AtomicU64,
    spoofed: AtomicU64,
    tcp_rejected: AtomicU64,
    events_suppressed: AtomicU64,
}

fn bump(c: &AtomicU64) {
    c.fetch_add(1, Ordering::Relaxed);
}

impl Stats {
    fn snapshot(&self) -> Counters {
        let r = |c: &AtomicU64| c.load(Ordering::Relaxed);
        Counters {
            queries: r(&self.queries),
            allowed: r(&self.allowed),
            refused: r(&self.refused),
            unknown_source: r(&self.unknown_source),
            rebinding_dropped: r(&self.rebinding_dropped),
            upstream_errors: r(&self.upstream_errors),
            rate_limited: r(&self.rate_limited),
            overloaded: r(&self.overloaded),
            malformed: r(&self.malformed),
            spoofed: r(&self.spoofed),
            tcp_rejected: r(&self.tcp_rejected),
            events_suppressed: r(&self.events_suppressed),
        }
    }
}

/// A running DNS proxy. Dropping it (or [`DnsProxy::stop`]) ends its tasks and closes its
/// sockets.
pub struct DnsProxy {
    addrs: Vec<SocketAddr>,
    shared: Arc<Shared>,
    tasks: Vec<JoinHandle<()>>,
    stop: watch::Sender<bool>,
}

impl std::fmt::Debug for DnsProxy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DnsProxy")
            .field("addrs", &self.addrs)
            .field("upstream", &self.shared.config.upstream)
            .finish_non_exhaustive()
    }
}

impl DnsProxy {
    /// Binds UDP and TCP on every listen address and spawns the proxy's tasks on the current
    /// tokio runtime. Fails on an invalid configuration (`InvalidInput`), outside a runtime,
    /// or when an address cannot be bound.
    pub fn start(config: Config, policy: Arc<dyn Policy>) -> io::Result<DnsProxy> {
        config
            .check()
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, format!("dns proxy: {e}")))?;
        let runtime = tokio::runtime::Handle::try_current()
            .map_err(|_| io::Error::other("dns proxy: DnsProxy::start needs a tokio runtime"))?;
        let mut bound = Vec::with_capacity(config.listen.len());
        for &addr in &config.listen {
            let (udp, tcp) = bind(addr)?;
            bound.push((udp.local_addr()?, udp, tcp));
        }
        let (stop, stopped) = watch::channel(false);
        let shared = Arc::new(Shared {
            sources: Arc::new(Sources::new(config.limits.clone())),
            config,
            policy,
            stats: Stats::default(),
        });
        let mut addrs = Vec::with_capacity(bound.len());
        let mut tasks = Vec::with_capacity(2 * bound.len());
        for (addr, udp, tcp) in bound {
            udp.set_nonblocking(true)?;
            tcp.set_nonblocking(true)?;
            let udp = Arc::new(UdpSocket::from_std(udp)?);
            let tcp = TcpListener::from_std(tcp)?;
            tasks.push(runtime.spawn(serve::serve_udp(Arc::clone(&shared), udp, stopped.clone())));
            tasks.push(runtime.spawn(serve::serve_tcp(Arc::clone(&shared), tcp, stopped.clone())));
            addrs.push(addr);
        }
        Ok(DnsProxy {
            addrs,
            shared,
            tasks,
            stop,
        })
    }

    /// The addresses it listens on (UDP and TCP on each), in the order of
    /// [`Config::listen`], with the ports picked for port 0.
    pub fn local_addrs(&self) -> &[SocketAddr] {
        &self.addrs
    }

    /// A snapshot of its counters.
    pub fn counters(&self) -> Counters {
        self.shared.stats.snapshot()
    }

    /// Stops it: no new query is read, queries in flight are abandoned, and the sockets are
    /// closed when this returns.
    pub async fn stop(mut self) {
        let _ = self.stop.send(true);
        for t in std::mem::take(&mut self.tasks) {
            let _ = t.await;
        }
    }
}

impl Drop for DnsProxy {
    fn drop(&mut self) {
        // A listener's task owns the tasks it spawned (a JoinSet): aborting it aborts them.
        for t in &self.tasks {
            t.abort();
        }
    }
}

/// A socket of `kind` bound to `addr` with `IP_FREEBIND`: the node's gateway address exists
/// only while some sandbox interface carries it, and the proxy listens from the start.
fn freebind(addr: SocketAddr, kind: rustix::net::SocketType) -> io::Result<std::os::fd::OwnedFd> {
    use rustix::net::{AddressFamily, SocketFlags, sockopt};
    let family = if addr.is_ipv4() {
        AddressFamily::INET
    } else {
        AddressFamily::INET6
    };
    let fd = rustix::net::socket_with(family, kind, SocketFlags::CLOEXEC, None)?;
    if addr.is_ipv4() {
        sockopt::set_ip_freebind(&fd, true)?;
    } else {
        sockopt::set_ipv6_freebind(&fd, true)?;
    }
    if kind == rustix::net::SocketType::STREAM {
        // A restarted node binds again over connections still in TIME_WAIT.
        sockopt::set_socket_reuseaddr(&fd, true)?;
    }
    rustix::net::bind(&fd, &addr)?;
    if kind == rustix::net::SocketType::STREAM {
        rustix::net::listen(&fd, 128)?;
    }
    Ok(fd)
}

/// Binds UDP and TCP on the same port of `addr`; for port 0, on a port free for both.
fn bind(addr: SocketAddr) -> io::Result<(std::net::UdpSocket, std::net::TcpListener)> {
    let tries = if addr.port() == 0 { 32 } else { 1 };
    let mut last = None;
    for _ in 0..tries {
        let udp = std::net::UdpSocket::from(freebind(addr, rustix::net::SocketType::DGRAM)?);
        let local = udp.local_addr()?;
        match freebind(local, rustix::net::SocketType::STREAM).map(std::net::TcpListener::from) {
            Ok(tcp) => return Ok((udp, tcp)),
            Err(e) if e.kind() == io::ErrorKind::AddrInUse => last = Some(e),
            Err(e) => return Err(e),
        }
    }
    Err(last.unwrap_or_else(|| io::Error::other("no port free for both UDP and TCP")))
}

/// What one message from a sandbox calls for.
enum Step {
    /// Send this answer.
    Reply(Vec<u8>),
    /// Send nothing.
    Drop,
    /// Ask the upstream.
    Forward(Box<Forward>),
}

/// An allowed query to forward.
struct Forward {
    /// The sandbox's query (one question).
    query: Message,
    /// Its name as the policy saw it.
    name: String,
    /// The longest answer it may get.
    limit: usize,
}

struct Shared {
    config: Config,
    policy: Arc<dyn Policy>,
    stats: Stats,
    sources: Arc<Sources>,
}

impl Shared {
    /// The UDP payload size advertised to clients.
    fn payload(&self) -> u16 {
        u16::try_from(self.config.limits.max_udp_query).unwrap_or(u16::MAX)
    }

    /// Reads a message of `src` (over TCP or UDP) and decides what it gets.
    fn step(&self, src: IpAddr, bytes: &[u8], tcp: bool) -> Step {
        let query = match message::parse_query(bytes) {
            Parsed::Query(m) => m,
            Parsed::Error(b) => {
                bump(&self.stats.malformed);
                return Step::Reply(b);
            }
            Parsed::Drop => {
                bump(&self.stats.malformed);
                return Step::Drop;
            }
        };
        let Some(q) = query.queries.first() else {
            return Step::Drop;
        };
        let limit = if tcp {
            TCP_LIMIT
        } else {
            message::udp_limit(&query, self.config.limits.max_udp_query)
        };
        let qtype = q.query_type();
        // A name no pattern can match is still shown to the policy (escaped), for it to say
        // whether `src` is a sandbox at all; whatever else it says, the name is refused.
        let (name, valid) = match message::policy_name(q.name()) {
            Ok(n) => (n, true),
            Err(n) => (n, false),
        };
        match self.policy.decide(src, &name) {
            Decision::Unknown => {
                bump(&self.stats.unknown_source);
                self.reply(&query, ResponseCode::Refused, limit)
            }
            _ if !valid => self.deny(src, &query, &name, Refusal::BadName, limit),
            Decision::Deny => self.deny(src, &query, &name, Refusal::Denied, limit),
            Decision::Allow => {
                bump(&self.stats.allowed);
                match qtype {
                    RecordType::A | RecordType::AAAA | RecordType::CNAME => {
                        Step::Forward(Box::new(Forward { query, name, limit }))
                    }
                    RecordType::ANY | RecordType::AXFR | RecordType::IXFR => {
                        self.reply(&query, ResponseCode::NotImp, limit)
                    }
                    _ => self.reply(&query, ResponseCode::NoError, limit),
                }
            }
        }
    }

    /// An answer without records.
    fn reply(&self, query: &Message, rcode: ResponseCode, limit: usize) -> Step {
        let m = message::response(query, rcode, Vec::new(), self.payload());
        message::encode(&m, limit).map_or(Step::Drop, Step::Reply)
    }

    fn deny(&self, src: IpAddr, query: &Message, name: &str, why: Refusal, limit: usize) -> Step {
        bump(&self.stats.refused);
        self.report(src, name, why);
        let mut m = message::response(query, ResponseCode::NXDomain, Vec::new(), self.payload());
        message::add_ede(&mut m, message::EDE_PROHIBITED, message::EDE_DENIED_TEXT);
        message::encode(&m, limit).map_or(Step::Drop, Step::Reply)
    }

    /// Reports a refusal to the policy, within the per-source event rate.
    fn report(&self, src: IpAddr, name: &str, why: Refusal) {
        if self.sources.admit_event(src) {
            self.policy.refused(src, name, why);
        } else {
            bump(&self.stats.events_suppressed);
        }
    }

    fn servfail(&self, query: &Message, limit: usize) -> Option<Vec<u8>> {
        let m = message::response(query, ResponseCode::ServFail, Vec::new(), self.payload());
        message::encode(&m, limit)
    }

    /// Asks the upstream, filters its answer, tells the policy, and returns the answer for
    /// the sandbox (SERVFAIL when the upstream failed).
    async fn forward(&self, src: IpAddr, fwd: &Forward) -> Option<Vec<u8>> {
        let (c, limit) = (&self.config, fwd.limit);
        let q = fwd.query.queries.first()?;
        let up =
            match upstream::resolve(c.upstream, q, c.upstream_timeout, &self.stats.spoofed).await {
                Ok(m) => m,
                Err(e) => {
                    bump(&self.stats.upstream_errors);
                    debug!(%src, name = %fwd.name, "dns upstream: {e}");
                    return self.servfail(&fwd.query, limit);
                }
            };
        let rcode = up.metadata.response_code;
        if !matches!(rcode, ResponseCode::NoError | ResponseCode::NXDomain) {
            bump(&self.stats.upstream_errors);
            debug!(%src, name = %fwd.name, "dns upstream answered {rcode}");
            return self.servfail(&fwd.query, limit);
        }
        let f = message::filter(q, &up, &c.never, c.min_ttl, c.max_ttl);
        let rebinding = !f.dropped.is_empty();
        if rebinding {
            let n = u64::try_from(f.dropped.len()).unwrap_or(u64::MAX);
            self.stats.rebinding_dropped.fetch_add(n, Ordering::Relaxed);
            self.report(src, &fwd.name, Refusal::Rebinding(f.dropped));
        }
        if !f.addrs.is_empty() {
            // Before the answer leaves: the node opens its firewall for these first.
            self.policy.resolved(src, &fwd.name, &f.addrs, f.ttl);
        }
        let mut m = message::response(&fwd.query, rcode, f.records, self.payload());
        if rebinding {
            message::add_ede(&mut m, EDE_BLOCKED, EDE_REBINDING_TEXT);
        }
        message::encode(&m, limit)
    }
}
