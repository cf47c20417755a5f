//! The transparent proxy: what a sandbox's domain rules allow on ports 80 and 443, judged by
//! the name each connection asks for rather than the address it dials.
//!
//! Many sites share one CDN address, so allowing the addresses `pypi.org` resolves to allows
//! every site behind them. The node's firewall therefore redirects new TCP connections to
//! ports 80 and 443 of sandboxes with domain rules (`redirect to :port` in a NAT prerouting
//! chain) here. For each connection the proxy:
//!
//! 1. takes the original destination from conntrack (`SO_ORIGINAL_DST`); a connection that
//!    was not redirected is refused;
//! 2. reads, within [`Limits::first_bytes_timeout`] and [`Limits::max_head`] bytes, a whole
//!    TLS ClientHello (first byte 22, on any port) and its server name, or else a whole
//!    HTTP/1 request head and its host (the Host field or an absolute-form target; `CONNECT`
//!    refused). The name is normalised: lower case, no trailing dot, no port. No name, an IP
//!    literal, a name no rule could match, or bytes that are neither are refused;
//! 3. asks the node ([`Policy::decide`]) whether the sandbox at the source address may reach
//!    that name on the original port;
//! 4. resolves the name itself, with the node's upstream resolver (the DNS proxy's exchange:
//!    a fresh id and port per query; answers kept for their TTL, at most 5 minutes, see
//!    [`Limits::dns_cache`]): A for an IPv4 client, AAAA for an IPv6 one, the other family
//!    when that gives nothing usable. Addresses inside [`Config::never`] (DNS
//!    rebinding) and those the sandbox's deny rules refuse ([`Policy::may_dial`]) are dropped.
//!    So whatever address the sandbox dialled — one its `/etc/hosts` made up, another site's
//!    on the same CDN — the proxy reaches the name's own. The address the client dialled is
//!    tried first when it is among the name's (it keeps the client's choice among them);
//! 5. connects (at most four addresses, within [`Limits::connect_timeout`]), writes the bytes
//!    it read, and splices both directions with [`Limits::buffer`] bytes each way, until both
//!    sides close or nothing moves for [`Limits::idle_timeout`].
//!
//! A plain HTTP connection serves one host: every later request's head is found (the bodies
//! between are framed strictly) and must name the first request's host, else the connection
//! is cut (a server behind one address may serve other names too).
//!
//! A refused connection is reset (`SO_LINGER` 0, then close), never left hanging; a plain
//! HTTP request refused by the policy gets a short `403` (`502` when its name has no
//! reachable address) with the reason, then the connection is closed. Each refusal is
//! reported to [`Policy::refused`] (at most [`Limits::events_per_source`] a second per
//! source).
//!
//! A policy change reaches open connections through [`Proxy::recheck`]: every live
//! connection whose sandbox's generation ([`Policy::current`]) moved is judged again with
//! [`Policy::decide`], and those no longer allowed are reset.
//!
//! What the proxy cannot see: anything inside TLS. The SNI is what the client says it wants;
//! the HTTP Host inside the encrypted stream may name another site served by the same
//! server (domain fronting: most large CDNs now refuse a Host that differs from the SNI, not
//! all). With Encrypted Client Hello the SNI is only the client-facing server's public name,
//! which is why hellos carrying the extension are refused by default ([`Config::refuse_ech`]).
//! After a plain HTTP request asking to `Upgrade`, the connection is not read any more.
//!
//! What the node does around it: redirects (`iifname "wv*" tcp dport { 80, 443 } redirect to
//! :P`, per family to the port of [`Proxy::local_addrs`], for the sandboxes with domain rules
//! and not to destinations their CIDR rules allow already, which would otherwise need a
//! name); accepts the redirected connections in its input chain after the source check
//! (`ct status dnat`); passes the firewall's always-denied ranges less the exemptions as
//! [`Config::never`], as it does to the DNS proxy; and calls [`Proxy::recheck`] after every
//! policy change, a sandbox's removal included. The proxy's own connections leave from the
//! node, outside the sandboxes' chains.

mod cache;
mod conn;
#[doc(hidden)]
pub mod fuzz;
mod hello;
mod http;
mod listen;
mod live;
mod name;
mod splice;

use std::io;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use warren_types::net::Cidr;

use crate::dns::limits::Sources;
use cache::Cache;
use live::Live;

/// What the proxy asks the node; implemented by the node (tests implement it too).
///
/// The methods are called on the proxy's tokio worker threads, inline: they should return
/// quickly (a table lookup), not block on I/O.
pub trait Policy: Send + Sync + 'static {
    /// Whether the sandbox whose address is `src` may connect to `name` (lower case, no
    /// trailing dot, no port) on TCP port `port`: its policy generation if so; None if not,
    /// or if `src` is no sandbox's.
    fn decide(&self, src: IpAddr, name: &str, port: u16) -> Option<u64>;

    /// The policy generation of the sandbox whose address is `src` now; None if there is
    /// none. A live connection decided under another generation is judged again by
    /// [`Proxy::recheck`].
    fn current(&self, src: IpAddr) -> Option<u64>;

    /// Whether the sandbox at `src` may reach `addr` on `port` as far as its deny rules go
    /// (the always-denied ranges are [`Config::never`], checked by the proxy).
    fn may_dial(&self, src: IpAddr, addr: IpAddr, port: u16) -> bool;

    /// A connection from `src` to `dst` (its original destination; the proxy's own address
    /// when it is unknown) asking for `name` was refused or cut: for the incident log. At
    /// most [`Limits::events_per_source`] a second per source; the rest are counted in
    /// [`Counters::events_suppressed`].
    fn refused(&self, src: IpAddr, dst: SocketAddr, name: Option<&str>, why: &Refusal);
}

/// Why a connection was refused or cut.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// The sandbox's policy does not allow the name on this port (or the source is no
    /// sandbox's).
    Denied,
    /// No name to judge: a ClientHello without a server name, an HTTP request without a
    /// host.
    NoName,
    /// The name is an IP address.
    IpLiteral(String),
    /// The name holds bytes no rule can match (shown escaped, cut at 256 bytes).
    BadName(String),
    /// Neither a TLS ClientHello nor an HTTP/1 request, or one that could be read two ways.
    Malformed(&'static str),
    /// The ClientHello or request head is longer than [`Limits::max_head`].
    TooLarge,
    /// The ClientHello or request head did not arrive within
    /// [`Limits::first_bytes_timeout`].
    Timeout,
    /// An HTTP `CONNECT` request.
    Tunnel,
    /// A ClientHello with an Encrypted Client Hello extension, while [`Config::refuse_ech`].
    Ech,
    /// A later HTTP request on the connection names this other host.
    HostChanged(String),
    /// The name resolved only to these addresses, which no sandbox may reach (DNS
    /// rebinding).
    Rebinding(Vec<IpAddr>),
    /// The name resolved only to these addresses, which the sandbox's deny rules refuse.
    DeniedAddress(Vec<IpAddr>),
    /// The name has no address, or the resolver did not answer in time.
    Unresolved,
    /// None of the name's addresses accepted a connection in time.
    Unreachable,
    /// The source has [`Limits::conns_per_source`] connections open, or the proxy
    /// [`Limits::conns_total`].
    TooMany,
    /// The connection was not redirected to the proxy by the firewall.
    NotRedirected,
    /// The sandbox's policy changed and no longer allows the connection.
    PolicyChanged,
}

impl Refusal {
    /// The HTTP status a plain HTTP client gets for it; None: a reset.
    fn http_status(&self) -> Option<&'static str> {
        match self {
            Refusal::Denied
            | Refusal::NoName
            | Refusal::IpLiteral(_)
            | Refusal::BadName(_)
            | Refusal::Tunnel
            | Refusal::Rebinding(_)
            | Refusal::DeniedAddress(_) => Some("403 Forbidden"),
            Refusal::Unresolved | Refusal::Unreachable => Some("502 Bad Gateway"),
            _ => None,
        }
    }
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Refusal::Denied => f.write_str(
                "the sandbox's network policy does not allow this name on this port: add a \
                 domain rule for it",
            ),
            Refusal::NoName => f.write_str(
                "no name to check: TLS without a server name (SNI), or HTTP without a Host; \
                 connect by name",
            ),
            Refusal::IpLiteral(a) => write!(
                f,
                "{a} is an address, and domain rules allow names: connect by name, or add a \
                 cidr rule"
            ),
            Refusal::BadName(n) => write!(f, "{n:?} is not a name any rule can match"),
            Refusal::Malformed(why) => write!(f, "{why}"),
            Refusal::TooLarge => {
                f.write_str("the TLS ClientHello or HTTP request head is too long")
            }
            Refusal::Timeout => {
                f.write_str("no whole TLS ClientHello or HTTP request head in time")
            }
            Refusal::Tunnel => {
                f.write_str("HTTP CONNECT is not allowed: connect to the name itself")
            }
            Refusal::Ech => f.write_str(
                "TLS Encrypted Client Hello hides the name the policy must check: turn ECH off",
            ),
            Refusal::HostChanged(n) => write!(
                f,
                "a later request on this connection asks for {n}, another host than the \
                 first: open a connection per host"
            ),
            Refusal::Rebinding(a) => write!(
                f,
                "the name resolves only to addresses no sandbox may reach ({})",
                list(a)
            ),
            Refusal::DeniedAddress(a) => write!(
                f,
                "the name resolves only to addresses the policy's deny rules refuse ({})",
                list(a)
            ),
            Refusal::Unresolved => f.write_str("the name has no address the node could find"),
            Refusal::Unreachable => f.write_str("none of the name's addresses answered in time"),
            Refusal::TooMany => f.write_str("too many connections open at once"),
            Refusal::NotRedirected => f.write_str("not a connection the firewall redirected"),
            Refusal::PolicyChanged => {
                f.write_str("the sandbox's network policy changed and no longer allows it")
            }
        }
    }
}

fn list(addrs: &[IpAddr]) -> String {
    let v: Vec<String> = addrs.iter().take(8).map(|a| a.to_string()).collect();
    v.join(", ")
}

/// The longest timeout a configuration may set (longer would hold slots for good, and
/// deadlines past it need not be representable).
const MAX_TIMEOUT: Duration = Duration::from_secs(86_400);

/// Bounds on everything a sandbox can make the proxy spend.
///
/// Each connection holds two sockets (and a third while its name is resolved): the process's
/// file limit must exceed `3 * conns_total` and the listeners. Memory per connection is at
/// most `max_head + 2 * buffer` bytes (48 KiB by default) plus the kernel's socket buffers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Bytes read before deciding: a whole ClientHello or request head must fit (longer is
    /// refused), and so must each later request head on a plain HTTP connection. Default
    /// 16 KiB (a post-quantum ClientHello is about 2 KiB).
    pub max_head: usize,
    /// Bytes buffered per direction while splicing. Default 16 KiB.
    pub buffer: usize,
    /// How long the ClientHello or first request head may take to arrive (slow senders are
    /// reset). Default 5 s.
    pub first_bytes_timeout: Duration,
    /// How long the upstream resolver may take per query. Default 2 s.
    pub resolve_timeout: Duration,
    /// How long connecting to the name's addresses may take, all attempts together. Default
    /// 5 s.
    pub connect_timeout: Duration,
    /// How long a spliced connection may pass no byte either way before it is closed (a
    /// writer stuck on a peer that does not read counts as idle). Default 300 s.
    pub idle_timeout: Duration,
    /// Connections open at once per source address; more are reset. Default 128.
    pub conns_per_source: usize,
    /// Connections open at once in total; more are reset. Default 2048.
    pub conns_total: usize,
    /// [`Policy::refused`] events a second per source address (and in a burst). Default 20.
    pub events_per_source: u32,
    /// Source addresses tracked at once; when all are busy, connections from new addresses
    /// are reset. Default 65536.
    pub max_sources: usize,
    /// Names whose answers are kept (for their TTL, at most 5 minutes), so that a sandbox's
    /// connections to one name do not each wait for the resolver; 0 keeps none. Default 4096.
    pub dns_cache: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_head: 16 * 1024,
            buffer: 16 * 1024,
            first_bytes_timeout: Duration::from_secs(5),
            resolve_timeout: Duration::from_secs(2),
            connect_timeout: Duration::from_secs(5),
            idle_timeout: Duration::from_secs(300),
            conns_per_source: 128,
            conns_total: 2048,
            events_per_source: 20,
            max_sources: 65536,
            dns_cache: 4096,
        }
    }
}

/// The proxy's configuration.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Config {
    /// Addresses to listen on, where the firewall redirects to. An IPv4 address is bound
    /// with `IP_FREEBIND` (the gateway exists only while some sandbox interface carries it);
    /// an IPv6 one is v6-only, so `[::]:port` takes IPv6 alone. Port 0 picks a free port
    /// (see [`Proxy::local_addrs`]).
    pub listen: Vec<SocketAddr>,
    /// The resolver the proxy asks for the names it dials.
    pub upstream: SocketAddr,
    /// Addresses the proxy never dials, whatever a name resolves to: the node's own, the
    /// control plane's, the pools, loopback, link-local and cloud metadata (the firewall's
    /// always-denied ranges). Always added: `0.0.0.0/8`, `::` and IPv4-mapped IPv6.
    pub never: Vec<Cidr>,
    /// Refuse ClientHellos that carry an Encrypted Client Hello extension. Default true: with
    /// ECH the server name is only the public name of whoever terminates TLS, so a client
    /// with a hard-coded ECH configuration could reach any site behind it. Sandboxes get no
    /// ECH configurations from the node's resolver (it answers no HTTPS records), but
    /// Chromium sends a GREASE ECH extension regardless: set false to let browsers through.
    pub refuse_ech: bool,
    /// The packet mark (`SO_MARK`) of the proxy's own connections, so the node's firewall can
    /// refuse those to the node itself or to always-denied ranges whatever the resolver said
    /// (an address the node gained after `never` was made, say). None: unmarked.
    pub mark: Option<u32>,
    /// Resource bounds.
    pub limits: Limits,
}

impl Config {
    /// A configuration with the default limits, `refuse_ech`, and no `never` ranges beyond
    /// the built-in ones.
    pub fn new(listen: Vec<SocketAddr>, upstream: SocketAddr) -> Config {
        Config {
            listen,
            upstream,
            never: Vec::new(),
            refuse_ech: true,
            mark: None,
            limits: Limits::default(),
        }
    }

    fn check(&self) -> Result<(), String> {
        let l = &self.limits;
        if self.listen.is_empty() {
            return Err("no listen address".into());
        }
        if l.max_head < 1024 {
            return Err("limits.max_head must be at least 1024 bytes".into());
        }
        let zero = [
            ("buffer", l.buffer == 0),
            ("first_bytes_timeout", l.first_bytes_timeout.is_zero()),
            ("resolve_timeout", l.resolve_timeout.is_zero()),
            ("connect_timeout", l.connect_timeout.is_zero()),
            ("idle_timeout", l.idle_timeout.is_zero()),
            ("conns_per_source", l.conns_per_source == 0),
            ("conns_total", l.conns_total == 0),
            ("max_sources", l.max_sources == 0),
        ];
        if let Some((name, _)) = zero.iter().find(|(_, z)| *z) {
            return Err(format!("limits.{name} is zero: nothing would get through"));
        }
        let times = [
            ("first_bytes_timeout", l.first_bytes_timeout),
            ("resolve_timeout", l.resolve_timeout),
            ("connect_timeout", l.connect_timeout),
            ("idle_timeout", l.idle_timeout),
        ];
        if let Some((name, _)) = times.iter().find(|(_, t)| *t > MAX_TIMEOUT) {
            return Err(format!(
                "limits.{name} is over a day: a connection would hold its slot that long"
            ));
        }
        Ok(())
    }
}

/// The proxy's counters, for tests and metrics: a snapshot of [`Proxy::counters`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counters {
    /// Connections accepted, before any check.
    pub accepted: u64,
    /// Connections that began with a TLS ClientHello naming a server.
    pub tls: u64,
    /// Connections that began with an HTTP request head naming a host.
    pub http: u64,
    /// Connections allowed and connected to the name.
    pub spliced: u64,
    /// Connections refused or cut, for any reason (the counters below included).
    pub refused: u64,
    /// Connections reset on arrival: too many of the source's, or in total.
    pub over_limit: u64,
    /// Connections whose first bytes did not arrive in time.
    pub timed_out: u64,
    /// Connections whose name had no address, or none that answered.
    pub dial_failed: u64,
    /// Live connections cut because the policy changed.
    pub cut: u64,
    /// Spliced connections closed for idling.
    pub idle_closed: u64,
    /// Resolver packets ignored: another id or question, or unreadable.
    pub spoofed: u64,
    /// [`Policy::refused`] events not reported, over the per-source event rate.
    pub events_suppressed: u64,
}

#[derive(Debug, Default)]
struct Stats {
    accepted: AtomicU64,
    tls: AtomicU64,
    http: AtomicU64,
    spliced: AtomicU64,
    refused: AtomicU64,
    over_limit: AtomicU64,
    timed_out: AtomicU64,
    dial_failed: AtomicU64,
    cut: AtomicU64,
    idle_closed: AtomicU64,
    spoofed: AtomicU64,
    events_suppressed: AtomicU64,
}

fn bump(c: &AtomicU64) {
    c.fetch_add(1, Ordering::Relaxed);
}

impl Stats {
    fn snapshot(&self) -> Counters {
        let r = |c: &AtomicU64| c.load(Ordering::Relaxed);
        Counters {
            accepted: r(&self.accepted),
            tls: r(&self.tls),
            http: r(&self.http),
            spliced: r(&self.spliced),
            refused: r(&self.refused),
            over_limit: r(&self.over_limit),
            timed_out: r(&self.timed_out),
            dial_failed: r(&self.dial_failed),
            cut: r(&self.cut),
            idle_closed: r(&self.idle_closed),
            spoofed: r(&self.spoofed),
            events_suppressed: r(&self.events_suppressed),
        }
    }
}

struct Shared {
    config: Config,
    policy: Arc<dyn Policy>,
    stats: Stats,
    /// Connection slots and event buckets per source (the DNS proxy's table).
    sources: Arc<Sources>,
    /// The connections past their decision, for [`Proxy::recheck`].
    live: Arc<Live>,
    /// Names resolved lately.
    cache: Cache,
}

impl Shared {
    /// Counts a refusal and reports it to the policy, within the per-source event rate.
    fn refusal(&self, src: IpAddr, dst: SocketAddr, name: Option<&str>, why: &Refusal) {
        bump(&self.stats.refused);
        match why {
            Refusal::TooMany => bump(&self.stats.over_limit),
            Refusal::Timeout => bump(&self.stats.timed_out),
            Refusal::Unresolved | Refusal::Unreachable => bump(&self.stats.dial_failed),
            Refusal::PolicyChanged => bump(&self.stats.cut),
            _ => {}
        }
        if self.sources.admit_event(src) {
            self.policy.refused(src, dst, name, why);
        } else {
            bump(&self.stats.events_suppressed);
        }
    }
}

/// A running proxy. Dropping it (or [`Proxy::stop`]) ends its tasks and closes its sockets,
/// the spliced connections' too.
pub struct Proxy {
    addrs: Vec<SocketAddr>,
    shared: Arc<Shared>,
    tasks: Vec<JoinHandle<()>>,
    stop: watch::Sender<bool>,
}

impl std::fmt::Debug for Proxy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Proxy")
            .field("addrs", &self.addrs)
            .field("upstream", &self.shared.config.upstream)
            .finish_non_exhaustive()
    }
}

impl Proxy {
    /// Binds every listen address and spawns the proxy's tasks on the current tokio runtime.
    /// Fails on an invalid configuration (`InvalidInput`), outside a runtime, or when an
    /// address cannot be bound.
    pub fn start(config: Config, policy: Arc<dyn Policy>) -> io::Result<Proxy> {
        config
            .check()
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, format!("proxy: {e}")))?;
        let runtime = tokio::runtime::Handle::try_current()
            .map_err(|_| io::Error::other("proxy: Proxy::start needs a tokio runtime"))?;
        let mut bound = Vec::with_capacity(config.listen.len());
        for &addr in &config.listen {
            let l = listen::bind(addr).map_err(|e| {
                io::Error::new(e.kind(), format!("proxy: listening on {addr}: {e}"))
            })?;
            bound.push(l);
        }
        let l = &config.limits;
        let sources = Sources::new(crate::dns::Limits {
            tcp_conns_per_source: l.conns_per_source,
            tcp_conns_total: l.conns_total,
            events_per_source: l.events_per_source,
            max_sources: l.max_sources,
            ..crate::dns::Limits::default()
        });
        let (stop, stopped) = watch::channel(false);
        let shared = Arc::new(Shared {
            sources: Arc::new(sources),
            live: Arc::new(Live::default()),
            cache: Cache::new(config.limits.dns_cache),
            config,
            policy,
            stats: Stats::default(),
        });
        let mut addrs = Vec::with_capacity(bound.len());
        let mut tasks = Vec::with_capacity(bound.len());
        for l in bound {
            addrs.push(l.local_addr()?);
            l.set_nonblocking(true)?;
            let l = TcpListener::from_std(l)?;
            tasks.push(runtime.spawn(listen::serve(Arc::clone(&shared), l, stopped.clone())));
        }
        Ok(Proxy {
            addrs,
            shared,
            tasks,
            stop,
        })
    }

    /// The addresses it listens on, in the order of [`Config::listen`], with the ports
    /// picked for port 0.
    pub fn local_addrs(&self) -> &[SocketAddr] {
        &self.addrs
    }

    /// A snapshot of its counters.
    pub fn counters(&self) -> Counters {
        self.shared.stats.snapshot()
    }

    /// How many connections are past their decision (being connected or spliced) now.
    pub fn live(&self) -> usize {
        self.shared.live.len()
    }

    /// Judges again every live connection whose sandbox's policy generation
    /// ([`Policy::current`]) differs from the one it was allowed under; those
    /// [`Policy::decide`] no longer allows are reset (and reported as
    /// [`Refusal::PolicyChanged`]). Call it after every policy change. Returns how many were
    /// cut.
    pub fn recheck(&self) -> usize {
        self.shared.live.recheck(self.shared.policy.as_ref(), None)
    }

    /// [`Proxy::recheck`] for the connections from `src` only.
    pub fn recheck_source(&self, src: IpAddr) -> usize {
        self.shared
            .live
            .recheck(self.shared.policy.as_ref(), Some(src))
    }

    /// Stops it: no new connection is accepted, and every connection is closed when this
    /// returns.
    pub async fn stop(mut self) {
        let _ = self.stop.send(true);
        for t in std::mem::take(&mut self.tasks) {
            let _ = t.await;
        }
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        // A listener's task owns its connections' tasks (a JoinSet): aborting it aborts them.
        for t in &self.tasks {
            t.abort();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn configurations_that_would_pass_nothing_or_hold_slots_forever_are_refused() {
        let upstream: SocketAddr = "127.0.0.1:53".parse().unwrap();
        let ok = Config::new(vec!["127.0.0.1:0".parse().unwrap()], upstream);
        assert_eq!(ok.check(), Ok(()));
        assert!(Config::new(vec![], upstream).check().is_err());
        let with = |f: fn(&mut Limits)| {
            let mut c = ok.clone();
            f(&mut c.limits);
            c.check().unwrap_err()
        };
        assert!(with(|l| l.conns_total = 0).contains("conns_total"));
        assert!(with(|l| l.max_head = 100).contains("max_head"));
        assert!(with(|l| l.idle_timeout = Duration::MAX).contains("over a day"));
    }

    #[test]
    fn refusals_say_what_to_do_and_plain_http_gets_a_status_for_policy_ones() {
        assert!(Refusal::Denied.to_string().contains("add a domain rule"));
        assert_eq!(Refusal::Denied.http_status(), Some("403 Forbidden"));
        assert_eq!(Refusal::Unresolved.http_status(), Some("502 Bad Gateway"));
        assert_eq!(
            Refusal::Timeout.http_status(),
            None,
            "slow senders are reset"
        );
        assert_eq!(Refusal::Malformed("x").http_status(), None);
    }
}
