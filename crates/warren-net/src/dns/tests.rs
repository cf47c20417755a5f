//! The proxy end to end over loopback: a fake upstream (UDP and TCP on 127.0.0.1:0), a test
//! policy, clients bound to 127.0.0.1 (a sandbox), 127.0.0.3 (another sandbox) and 127.0.0.2
//! (no sandbox's).

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use hickory_proto::op::{Edns, Message, MessageType, OpCode, Query, ResponseCode};
use hickory_proto::rr::rdata::NS;
use hickory_proto::rr::rdata::opt::{EdnsCode, EdnsOption};
use hickory_proto::rr::{Name, RData, Record, RecordType};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpSocket, TcpStream, UdpSocket};
use tokio::task::JoinHandle;
use warren_types::net::{Cidr, DomainPattern, DomainSet};

use super::message::{self, addr_record, cname_record, fqdn};
use super::{Config, Counters, Decision, DnsProxy, Limits, Policy, Refusal};

const SANDBOX: IpAddr = IpAddr::V4(Ipv4Addr::new(127, 0, 0, 1));
const STRANGER: IpAddr = IpAddr::V4(Ipv4Addr::new(127, 0, 0, 2));
const SANDBOX2: IpAddr = IpAddr::V4(Ipv4Addr::new(127, 0, 0, 3));
const WAIT: Duration = Duration::from_secs(3);
const UPSTREAM_TIMEOUT: Duration = Duration::from_millis(400);

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

// ----- The fake upstream -----------------------------------------------------------------

/// What the fake upstream does with a name.
enum Zone {
    Answer(ResponseCode, Vec<Record>),
    /// Never answers.
    Silent,
    /// Over UDP: forged answers first (another id, another question, garbage), then the true
    /// one.
    Spoof,
}

fn zone(name: &str) -> Zone {
    let a = |n: &str, ttl, addr: &str| addr_record(n, ttl, ip(addr));
    let ok = |records| Zone::Answer(ResponseCode::NoError, records);
    match name {
        "pypi.org." => ok(vec![
            a("pypi.org", 300, "198.51.100.10"),
            a("pypi.org", 300, "2001:db8::10"),
        ]),
        "files.pythonhosted.org." => ok(vec![
            cname_record("files.pythonhosted.org", 300, "cdn.example.net"),
            a("cdn.example.net", 30, "198.51.100.20"),
        ]),
        "evil.allowed.test." => ok(vec![
            a("evil.allowed.test", 120, "127.0.0.1"),
            a("evil.allowed.test", 120, "198.51.100.30"),
            a("evil.allowed.test", 120, "169.254.169.254"),
            // Out of the chain: a poisoning attempt.
            a("pypi.org", 120, "203.0.113.66"),
        ]),
        "huge.allowed.test." => ok((0..100)
            .map(|i| addr_record("huge.allowed.test", 120, IpAddr::from([198, 51, 101, i])))
            .collect()),
        "long.allowed.test." => ok(vec![a("long.allowed.test", 86400, "198.51.100.50")]),
        "slow.allowed.test." => Zone::Silent,
        "spoof.allowed.test." => Zone::Spoof,
        "broken.allowed.test." => Zone::Answer(ResponseCode::ServFail, vec![]),
        _ => Zone::Answer(ResponseCode::NXDomain, vec![]),
    }
}

/// The fake upstream's answer to `q`, with an NS in authority and glue in additional (which
/// the proxy must strip).
fn upstream_answer(id: u16, q: &Query, rcode: ResponseCode, records: &[Record]) -> Message {
    let mut m = Message::response(id, OpCode::Query);
    m.metadata.recursion_desired = true;
    m.metadata.recursion_available = true;
    m.metadata.response_code = rcode;
    m.add_query(q.clone());
    m.answers = records
        .iter()
        .filter(|r| r.record_type() == q.query_type() || r.record_type() == RecordType::CNAME)
        .cloned()
        .collect();
    m.authorities = vec![Record::from_rdata(
        fqdn("allowed.test"),
        300,
        RData::NS(NS(fqdn("ns.allowed.test"))),
    )];
    m.additionals = vec![addr_record("ns.allowed.test", 300, ip("198.51.100.53"))];
    m
}

/// The packets the fake upstream sends for `query`, in order.
fn upstream_packets(query: &Message, tcp: bool) -> Vec<Vec<u8>> {
    let Some(q) = query.queries.first() else {
        return vec![];
    };
    let id = query.metadata.id;
    match zone(&q.name().to_ascii().to_ascii_lowercase()) {
        Zone::Silent => vec![],
        Zone::Answer(rcode, records) => {
            let m = upstream_answer(id, q, rcode, &records);
            let b = m.to_vec().unwrap();
            // A small-buffer upstream: over 512 bytes, UDP gets TC and no records.
            if !tcp && b.len() > 512 {
                vec![m.truncate().to_vec().unwrap()]
            } else {
                vec![b]
            }
        }
        Zone::Spoof => {
            let real = [addr_record("spoof.allowed.test", 100, ip("198.51.100.40"))];
            let good = upstream_answer(id, q, ResponseCode::NoError, &real);
            if tcp {
                return vec![good.to_vec().unwrap()];
            }
            let forged = [addr_record("spoof.allowed.test", 100, ip("198.51.100.66"))];
            let wrong_id = upstream_answer(id ^ 0x5555, q, ResponseCode::NoError, &forged);
            let other_q = Query::query(fqdn("other.allowed.test"), q.query_type());
            let wrong_q = upstream_answer(id, &other_q, ResponseCode::NoError, &forged);
            let mut garbage = id.to_be_bytes().to_vec();
            garbage.extend_from_slice(&[0x81, 0x80, 0, 1, 0, 9, 0, 0, 0, 0, 7]);
            vec![
                wrong_id.to_vec().unwrap(),
                wrong_q.to_vec().unwrap(),
                garbage,
                good.to_vec().unwrap(),
            ]
        }
    }
}

/// A query the fake upstream saw.
#[derive(Clone, Debug)]
struct Seen {
    name: String,
    qtype: RecordType,
    tcp: bool,
    id: u16,
    port: u16,
}

struct Upstream {
    addr: SocketAddr,
    seen: Arc<Mutex<Vec<Seen>>>,
    tasks: Vec<JoinHandle<()>>,
}

impl Drop for Upstream {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

impl Upstream {
    async fn start() -> Upstream {
        let (udp, tcp) = super::bind("127.0.0.1:0".parse().unwrap()).unwrap();
        udp.set_nonblocking(true).unwrap();
        tcp.set_nonblocking(true).unwrap();
        let udp = UdpSocket::from_std(udp).unwrap();
        let tcp = TcpListener::from_std(tcp).unwrap();
        let addr = udp.local_addr().unwrap();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let log = |seen: &Mutex<Vec<Seen>>, m: &Message, tcp, peer: SocketAddr| {
            if let Some(q) = m.queries.first() {
                seen.lock().unwrap().push(Seen {
                    name: q.name().to_ascii().to_ascii_lowercase(),
                    qtype: q.query_type(),
                    tcp,
                    id: m.metadata.id,
                    port: peer.port(),
                });
            }
        };
        let udp_seen = Arc::clone(&seen);
        let udp_task = tokio::spawn(async move {
            let mut buf = vec![0u8; 65535];
            loop {
                let Ok((n, peer)) = udp.recv_from(&mut buf).await else {
                    continue;
                };
                let Ok(m) = Message::from_vec(&buf[..n]) else {
                    continue;
                };
                log(&udp_seen, &m, false, peer);
                for p in upstream_packets(&m, false) {
                    let _ = udp.send_to(&p, peer).await;
                }
            }
        });
        let tcp_seen = Arc::clone(&seen);
        let tcp_task = tokio::spawn(async move {
            loop {
                let Ok((mut s, peer)) = tcp.accept().await else {
                    continue;
                };
                let seen = Arc::clone(&tcp_seen);
                tokio::spawn(async move {
                    loop {
                        let mut len = [0u8; 2];
                        if s.read_exact(&mut len).await.is_err() {
                            return;
                        }
                        let mut body = vec![0u8; usize::from(u16::from_be_bytes(len))];
                        if s.read_exact(&mut body).await.is_err() {
                            return;
                        }
                        let Ok(m) = Message::from_vec(&body) else {
                            return;
                        };
                        log(&seen, &m, true, peer);
                        for p in upstream_packets(&m, true) {
                            let mut framed = (p.len() as u16).to_be_bytes().to_vec();
                            framed.extend_from_slice(&p);
                            if s.write_all(&framed).await.is_err() {
                                return;
                            }
                        }
                    }
                });
            }
        });
        Upstream {
            addr,
            seen,
            tasks: vec![udp_task, tcp_task],
        }
    }

    fn seen(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().clone()
    }

    fn asked(&self, name: &str) -> bool {
        let name = format!("{name}.");
        self.seen().iter().any(|s| s.name == name)
    }
}

// ----- The test policy -------------------------------------------------------------------

#[derive(Clone, Debug, PartialEq, Eq)]
enum Event {
    Resolved {
        src: IpAddr,
        name: String,
        addrs: Vec<IpAddr>,
        ttl: u32,
    },
    Refused {
        src: IpAddr,
        name: String,
        why: Refusal,
    },
}

struct TestPolicy {
    allow: DomainSet,
    sandboxes: Vec<IpAddr>,
    events: Mutex<Vec<Event>>,
    /// How long `resolved` takes (blocking, like a slow firewall update).
    resolved_delay: Duration,
}

impl TestPolicy {
    fn new(resolved_delay: Duration) -> TestPolicy {
        let mut allow = DomainSet::default();
        for p in ["pypi.org", "*.pythonhosted.org", "*.allowed.test"] {
            allow.insert(DomainPattern::parse(p).unwrap());
        }
        TestPolicy {
            allow,
            sandboxes: vec![SANDBOX, SANDBOX2],
            events: Mutex::new(Vec::new()),
            resolved_delay,
        }
    }

    fn events(&self) -> Vec<Event> {
        self.events.lock().unwrap().clone()
    }
}

impl Policy for TestPolicy {
    fn decide(&self, src: IpAddr, name: &str) -> Decision {
        if !self.sandboxes.contains(&src) {
            Decision::Unknown
        } else if self.allow.matches(name) {
            Decision::Allow
        } else {
            Decision::Deny
        }
    }

    fn resolved(&self, src: IpAddr, name: &str, addrs: &[IpAddr], ttl: u32) {
        std::thread::sleep(self.resolved_delay);
        self.events.lock().unwrap().push(Event::Resolved {
            src,
            name: name.into(),
            addrs: addrs.to_vec(),
            ttl,
        });
    }

    fn refused(&self, src: IpAddr, name: &str, why: Refusal) {
        self.events.lock().unwrap().push(Event::Refused {
            src,
            name: name.into(),
            why,
        });
    }
}

// ----- The harness and clients -----------------------------------------------------------

struct Harness {
    upstream: Upstream,
    proxy: DnsProxy,
    policy: Arc<TestPolicy>,
}

impl Harness {
    async fn start() -> Harness {
        Harness::with(Duration::ZERO, |_| {}).await
    }

    async fn with(resolved_delay: Duration, tweak: impl FnOnce(&mut Config)) -> Harness {
        let upstream = Upstream::start().await;
        let policy = Arc::new(TestPolicy::new(resolved_delay));
        let mut config = Config::new(vec!["127.0.0.1:0".parse().unwrap()], upstream.addr);
        config.upstream_timeout = UPSTREAM_TIMEOUT;
        config.min_ttl = 60;
        config.max_ttl = 1000;
        config.never = ["127.0.0.0/8", "10.200.0.0/16", "169.254.0.0/16", "::1/128"]
            .iter()
            .map(|c| Cidr::parse(c).unwrap())
            .collect();
        tweak(&mut config);
        let proxy = DnsProxy::start(config, policy.clone()).unwrap();
        Harness {
            upstream,
            proxy,
            policy,
        }
    }

    fn addr(&self) -> SocketAddr {
        self.proxy.local_addrs()[0]
    }

    fn counters(&self) -> Counters {
        self.proxy.counters()
    }

    async fn ask(&self, from: IpAddr, name: &str, t: RecordType) -> Message {
        udp_ask(self.addr(), from, &query(0x1234, name, t, Some(1232)))
            .await
            .unwrap_or_else(|| panic!("no answer for {name}"))
    }
}

/// A query; `edns`: the UDP payload size of its OPT, or no OPT.
fn query(id: u16, name: &str, t: RecordType, edns: Option<u16>) -> Vec<u8> {
    let mut m = Message::new(id, MessageType::Query, OpCode::Query);
    m.metadata.recursion_desired = true;
    m.add_query(Query::query(fqdn(name), t));
    if let Some(size) = edns {
        let mut e = Edns::new();
        e.set_max_payload(size);
        m.set_edns(e);
    }
    m.to_vec().unwrap()
}

async fn client(from: IpAddr, server: SocketAddr) -> UdpSocket {
    let s = UdpSocket::bind((from, 0)).await.unwrap();
    s.connect(server).await.unwrap();
    s
}

/// Sends `bytes` over UDP from `from` and returns the answer's bytes, if one comes in `wait`.
async fn udp_raw(
    server: SocketAddr,
    from: IpAddr,
    bytes: &[u8],
    wait: Duration,
) -> Option<Vec<u8>> {
    let s = client(from, server).await;
    s.send(bytes).await.unwrap();
    let mut buf = vec![0u8; 65535];
    let n = tokio::time::timeout(wait, s.recv(&mut buf))
        .await
        .ok()?
        .ok()?;
    Some(buf[..n].to_vec())
}

async fn udp_ask(server: SocketAddr, from: IpAddr, bytes: &[u8]) -> Option<Message> {
    let b = udp_raw(server, from, bytes, WAIT).await?;
    Some(Message::from_vec(&b).unwrap())
}

async fn tcp_connect(from: IpAddr, server: SocketAddr) -> TcpStream {
    let s = TcpSocket::new_v4().unwrap();
    s.bind((from, 0).into()).unwrap();
    s.connect(server).await.unwrap()
}

async fn tcp_send(s: &mut TcpStream, bytes: &[u8]) -> Option<Message> {
    let mut framed = (bytes.len() as u16).to_be_bytes().to_vec();
    framed.extend_from_slice(bytes);
    s.write_all(&framed).await.ok()?;
    let mut len = [0u8; 2];
    tokio::time::timeout(WAIT, s.read_exact(&mut len))
        .await
        .ok()?
        .ok()?;
    let mut body = vec![0u8; usize::from(u16::from_be_bytes(len))];
    s.read_exact(&mut body).await.ok()?;
    Some(Message::from_vec(&body).unwrap())
}

/// Whether the proxy closes `s` within `wait` (reads see the end of the stream).
async fn closed_within(s: &mut TcpStream, wait: Duration) -> bool {
    let mut buf = [0u8; 64];
    matches!(
        tokio::time::timeout(wait, s.read(&mut buf)).await,
        Ok(Ok(0)) | Ok(Err(_))
    )
}

fn addrs(m: &Message) -> Vec<IpAddr> {
    m.answers
        .iter()
        .filter_map(|r| match &r.data {
            RData::A(a) => Some(IpAddr::V4(a.0)),
            RData::AAAA(a) => Some(IpAddr::V6(a.0)),
            _ => None,
        })
        .collect()
}

fn ede(m: &Message) -> Option<(u16, String)> {
    match m.edns.as_ref()?.option(EdnsCode::Unknown(15))? {
        EdnsOption::Unknown(15, data) if data.len() >= 2 => Some((
            u16::from_be_bytes([data[0], data[1]]),
            String::from_utf8(data[2..].to_vec()).unwrap(),
        )),
        _ => None,
    }
}

fn resolved(name: &str, addrs: &[&str], ttl: u32) -> Event {
    Event::Resolved {
        src: SANDBOX,
        name: name.into(),
        addrs: addrs.iter().map(|a| ip(a)).collect(),
        ttl,
    }
}

// ----- The tests -------------------------------------------------------------------------

#[tokio::test]
async fn an_allowed_name_is_forwarded_with_fresh_ids_and_ports_and_reported() {
    let h = Harness::start().await;
    for _ in 0..3 {
        let m = udp_ask(
            h.addr(),
            SANDBOX,
            &query(0x1234, "PyPI.org", RecordType::A, Some(1232)),
        )
        .await
        .unwrap();
        assert_eq!(m.metadata.id, 0x1234);
        assert_eq!(m.metadata.message_type, MessageType::Response);
        assert_eq!(m.metadata.response_code, ResponseCode::NoError);
        assert!(m.metadata.recursion_available);
        // The client's question, its case kept.
        assert_eq!(m.queries.len(), 1);
        assert_eq!(m.queries[0].name().to_ascii(), "PyPI.org.");
        assert_eq!(addrs(&m), vec![ip("198.51.100.10")]);
        assert_eq!(m.answers[0].ttl, 300);
        assert!(m.authorities.is_empty() && m.additionals.is_empty());
        assert!(m.edns.is_some(), "an OPT, as the query had one");
    }
    assert_eq!(
        h.policy.events(),
        vec![resolved("pypi.org", &["198.51.100.10"], 300); 3]
    );
    let seen = h.upstream.seen();
    assert_eq!(seen.len(), 3);
    assert!(seen.iter().all(|s| s.qtype == RecordType::A && !s.tcp));
    assert!(seen.iter().any(|s| s.id != 0x1234), "fresh ids: {seen:?}");
    assert!(
        seen.iter().any(|s| s.port != seen[0].port),
        "fresh ports: {seen:?}"
    );
    let c = h.counters();
    assert_eq!((c.queries, c.allowed, c.refused), (3, 3, 0));

    let m = h.ask(SANDBOX, "pypi.org", RecordType::AAAA).await;
    assert_eq!(addrs(&m), vec![ip("2001:db8::10")]);
}

#[tokio::test]
async fn a_wildcard_name_follows_its_cname_to_a_name_not_allowed_with_the_least_ttl_clamped() {
    let h = Harness::start().await;
    let m = h
        .ask(SANDBOX, "files.pythonhosted.org", RecordType::A)
        .await;
    assert_eq!(m.answers.len(), 2);
    assert_eq!(m.answers[0].record_type(), RecordType::CNAME);
    assert_eq!(addrs(&m), vec![ip("198.51.100.20")]);
    // The least TTL is 30 (the A record), raised to min_ttl 60, for every record.
    assert!(m.answers.iter().all(|r| r.ttl == 60), "{m:?}");
    assert_eq!(
        h.policy.events(),
        vec![resolved("files.pythonhosted.org", &["198.51.100.20"], 60)]
    );
    // Not asked about cdn.example.net: the chain came in one answer.
    assert!(!h.upstream.asked("cdn.example.net"));

    // A TTL over max_ttl is lowered.
    let m = h.ask(SANDBOX, "long.allowed.test", RecordType::A).await;
    assert_eq!(m.answers[0].ttl, 1000);

    // A CNAME question gets the CNAME only, and reports no address.
    let m = h
        .ask(SANDBOX, "files.pythonhosted.org", RecordType::CNAME)
        .await;
    assert_eq!(m.answers.len(), 1);
    assert_eq!(m.answers[0].record_type(), RecordType::CNAME);
    assert_eq!(h.policy.events().len(), 2);
}

#[tokio::test]
async fn a_denied_name_gets_nxdomain_with_an_extended_error_and_is_reported() {
    let h = Harness::start().await;
    for name in ["evil.com", "pythonhosted.org", "www.pypi.org"] {
        let m = h.ask(SANDBOX, name, RecordType::A).await;
        assert_eq!(m.metadata.response_code, ResponseCode::NXDomain, "{name}");
        assert!(m.answers.is_empty());
        assert_eq!(
            ede(&m),
            Some((
                18,
                "warren: the sandbox's network policy does not allow this name".into()
            ))
        );
        assert!(!h.upstream.asked(name), "{name} was forwarded");
    }
    // Without EDNS: NXDOMAIN, and no OPT to put the error in.
    let m = udp_ask(
        h.addr(),
        SANDBOX,
        &query(7, "evil.com", RecordType::A, None),
    )
    .await
    .unwrap();
    assert_eq!(m.metadata.response_code, ResponseCode::NXDomain);
    assert!(m.edns.is_none());
    // Every type of a denied name is refused.
    let m = h.ask(SANDBOX, "evil.com", RecordType::TXT).await;
    assert_eq!(m.metadata.response_code, ResponseCode::NXDomain);

    let events = h.policy.events();
    assert_eq!(events.len(), 5);
    assert_eq!(
        events[0],
        Event::Refused {
            src: SANDBOX,
            name: "evil.com".into(),
            why: Refusal::Denied
        }
    );
    assert_eq!(h.counters().refused, 5);
}

#[tokio::test]
async fn a_name_with_odd_bytes_is_refused_whatever_it_looks_like() {
    let h = Harness::start().await;
    // One label, "pypi.org" with its dot inside: must not pass for pypi.org.
    let mut m = Message::new(9, MessageType::Query, OpCode::Query);
    let mut name = Name::from_labels(vec![b"pypi.org".to_vec()]).unwrap();
    name.set_fqdn(true);
    m.add_query(Query::query(name, RecordType::A));
    let a = udp_ask(h.addr(), SANDBOX, &m.to_vec().unwrap())
        .await
        .unwrap();
    assert_eq!(a.metadata.response_code, ResponseCode::NXDomain);
    assert_eq!(
        h.policy.events(),
        vec![Event::Refused {
            src: SANDBOX,
            name: "pypi\\046org".into(),
            why: Refusal::BadName
        }]
    );
    assert!(h.upstream.seen().is_empty());
}

#[tokio::test]
async fn an_address_that_is_no_sandbox_gets_refused_and_nothing_is_recorded() {
    let h = Harness::start().await;
    let m = h.ask(STRANGER, "pypi.org", RecordType::A).await;
    assert_eq!(m.metadata.response_code, ResponseCode::Refused);
    assert!(m.answers.is_empty());
    let m = h.ask(STRANGER, "evil.com", RecordType::A).await;
    assert_eq!(m.metadata.response_code, ResponseCode::Refused);
    assert!(h.policy.events().is_empty());
    assert!(h.upstream.seen().is_empty());
    assert_eq!(h.counters().unknown_source, 2);
}

#[tokio::test]
async fn rebinding_addresses_and_records_off_the_chain_are_dropped_and_reported() {
    let h = Harness::start().await;
    let m = h.ask(SANDBOX, "evil.allowed.test", RecordType::A).await;
    assert_eq!(m.metadata.response_code, ResponseCode::NoError);
    assert_eq!(addrs(&m), vec![ip("198.51.100.30")]);
    assert!(
        m.answers
            .iter()
            .all(|r| r.name == fqdn("evil.allowed.test"))
    );
    assert!(m.authorities.is_empty() && m.additionals.is_empty());
    assert_eq!(ede(&m).map(|e| e.0), Some(15));
    assert_eq!(
        h.policy.events(),
        vec![
            Event::Refused {
                src: SANDBOX,
                name: "evil.allowed.test".into(),
                why: Refusal::Rebinding(vec![ip("127.0.0.1"), ip("169.254.169.254")])
            },
            resolved("evil.allowed.test", &["198.51.100.30"], 120),
        ]
    );
    assert_eq!(h.counters().rebinding_dropped, 2);
}

#[tokio::test]
async fn queries_over_tcp_are_answered_several_per_connection() {
    let h = Harness::start().await;
    let mut s = tcp_connect(SANDBOX, h.addr()).await;
    for id in [1, 2] {
        let m = tcp_send(&mut s, &query(id, "pypi.org", RecordType::A, None))
            .await
            .unwrap();
        assert_eq!(m.metadata.id, id);
        assert_eq!(addrs(&m), vec![ip("198.51.100.10")]);
    }
    let m = tcp_send(&mut s, &query(3, "evil.com", RecordType::A, None))
        .await
        .unwrap();
    assert_eq!(m.metadata.response_code, ResponseCode::NXDomain);
}

#[tokio::test]
async fn a_truncated_upstream_answer_is_asked_again_over_tcp() {
    let h = Harness::start().await;
    // A client with a large buffer gets it all over UDP.
    let m = udp_ask(
        h.addr(),
        SANDBOX,
        &query(1, "huge.allowed.test", RecordType::A, Some(4096)),
    )
    .await
    .unwrap();
    assert!(!m.metadata.truncation);
    assert_eq!(addrs(&m).len(), 100);
    let seen = h.upstream.seen();
    assert_eq!(
        seen.iter().map(|s| s.tcp).collect::<Vec<_>>(),
        vec![false, true],
        "UDP, then TCP"
    );
    // A client without EDNS gets TC over UDP, and all over TCP.
    let m = udp_ask(
        h.addr(),
        SANDBOX,
        &query(2, "huge.allowed.test", RecordType::A, None),
    )
    .await
    .unwrap();
    assert!(m.metadata.truncation);
    assert!(m.answers.is_empty());
    assert_eq!(m.queries[0].name(), &fqdn("huge.allowed.test"));
    let mut s = tcp_connect(SANDBOX, h.addr()).await;
    let m = tcp_send(&mut s, &query(3, "huge.allowed.test", RecordType::A, None))
        .await
        .unwrap();
    assert_eq!(addrs(&m).len(), 100);
}

#[tokio::test]
async fn an_upstream_that_does_not_answer_gives_servfail_within_the_timeout() {
    let h = Harness::start().await;
    let t = Instant::now();
    let m = h.ask(SANDBOX, "slow.allowed.test", RecordType::A).await;
    let took = t.elapsed();
    assert_eq!(m.metadata.response_code, ResponseCode::ServFail);
    assert!(took >= UPSTREAM_TIMEOUT, "{took:?}");
    assert!(
        took < UPSTREAM_TIMEOUT + Duration::from_millis(500),
        "{took:?}"
    );
    assert!(h.policy.events().is_empty());

    // Upstream errors are SERVFAIL too; NXDOMAIN passes through.
    let m = h.ask(SANDBOX, "broken.allowed.test", RecordType::A).await;
    assert_eq!(m.metadata.response_code, ResponseCode::ServFail);
    let m = h.ask(SANDBOX, "nx.allowed.test", RecordType::A).await;
    assert_eq!(m.metadata.response_code, ResponseCode::NXDomain);
    assert!(ede(&m).is_none(), "the upstream's NXDOMAIN is no refusal");
    assert_eq!(h.counters().upstream_errors, 2);
}

#[tokio::test]
async fn malformed_messages_get_formerr_or_nothing_and_the_proxy_keeps_serving() {
    let h = Harness::start().await;
    let short = Duration::from_millis(200);
    // Unreadable: nothing.
    assert!(
        udp_raw(h.addr(), SANDBOX, b"\x01\x02\x03", short)
            .await
            .is_none()
    );
    // A response: nothing.
    let mut response = query(5, "pypi.org", RecordType::A, None);
    response[2] |= 0x80;
    assert!(udp_raw(h.addr(), SANDBOX, &response, short).await.is_none());
    // Longer than 4096 bytes: nothing.
    let mut long = query(5, "pypi.org", RecordType::A, None);
    long.resize(5000, 0);
    assert!(udp_raw(h.addr(), SANDBOX, &long, short).await.is_none());
    // A header without a question: FORMERR.
    let header = [0xab, 0xcd, 0x01, 0, 0, 0, 0, 0, 0, 0, 0, 0];
    let m = udp_ask(h.addr(), SANDBOX, &header).await.unwrap();
    assert_eq!(m.metadata.id, 0xabcd);
    assert_eq!(m.metadata.response_code, ResponseCode::FormErr);
    // Opcode NOTIFY: NOTIMP.
    let mut notify = query(6, "pypi.org", RecordType::A, None);
    notify[2] = (notify[2] & 0x87) | (4 << 3);
    let m = udp_ask(h.addr(), SANDBOX, &notify).await.unwrap();
    assert_eq!(m.metadata.response_code, ResponseCode::NotImp);
    // ANY: NOTIMP; other types of an allowed name: empty NOERROR, not forwarded.
    let m = h.ask(SANDBOX, "pypi.org", RecordType::ANY).await;
    assert_eq!(m.metadata.response_code, ResponseCode::NotImp);
    for t in [
        RecordType::MX,
        RecordType::TXT,
        RecordType::HTTPS,
        RecordType::SVCB,
    ] {
        let m = h.ask(SANDBOX, "pypi.org", t).await;
        assert_eq!(m.metadata.response_code, ResponseCode::NoError, "{t}");
        assert!(m.answers.is_empty(), "{t}");
    }
    assert!(h.upstream.seen().is_empty());
    assert_eq!(h.counters().malformed, 5);

    let m = h.ask(SANDBOX, "pypi.org", RecordType::A).await;
    assert_eq!(addrs(&m), vec![ip("198.51.100.10")]);
}

#[tokio::test]
async fn tcp_connections_that_are_oversized_slow_idle_or_too_many_are_closed() {
    let h = Harness::with(Duration::ZERO, |c| {
        c.limits.max_tcp_query = 4096;
        c.limits.tcp_read_timeout = Duration::from_millis(300);
        c.limits.tcp_idle_timeout = Duration::from_millis(500);
        c.limits.tcp_queries_per_conn = 3;
        c.limits.tcp_conns_per_source = 2;
    })
    .await;
    let quick = Duration::from_millis(200);

    // A length over the limit, or under a header's: closed at once.
    for len in [[0x20, 0x00], [0x00, 0x05]] {
        let mut s = tcp_connect(SANDBOX, h.addr()).await;
        s.write_all(&len).await.unwrap();
        assert!(closed_within(&mut s, quick).await, "{len:?}");
    }

    // Slow loris: part of a query, then nothing: closed after the read timeout.
    let mut s = tcp_connect(SANDBOX, h.addr()).await;
    s.write_all(&[0, 40, 1, 2, 3, 4, 5]).await.unwrap();
    let t = Instant::now();
    assert!(closed_within(&mut s, Duration::from_secs(2)).await);
    let took = t.elapsed();
    assert!(took >= Duration::from_millis(250), "{took:?}");

    // Idle: closed after the idle timeout.
    let mut s = tcp_connect(SANDBOX, h.addr()).await;
    let t = Instant::now();
    assert!(closed_within(&mut s, Duration::from_secs(2)).await);
    let took = t.elapsed();
    assert!(took >= Duration::from_millis(450), "{took:?}");

    // Three queries a connection.
    let mut s = tcp_connect(SANDBOX, h.addr()).await;
    for id in 0..3 {
        assert!(
            tcp_send(&mut s, &query(id, "evil.com", RecordType::A, None))
                .await
                .is_some()
        );
    }
    assert!(
        tcp_send(&mut s, &query(4, "evil.com", RecordType::A, None))
            .await
            .is_none()
    );

    // Two connections per source: a third is closed on arrival; another source is served.
    let other = ip("127.0.0.5");
    let _a = tcp_connect(other, h.addr()).await;
    let _b = tcp_connect(other, h.addr()).await;
    let mut c = tcp_connect(other, h.addr()).await;
    assert!(closed_within(&mut c, quick).await);
    assert!(h.counters().tcp_rejected >= 1);
    let mut s = tcp_connect(SANDBOX, h.addr()).await;
    assert!(
        tcp_send(&mut s, &query(1, "pypi.org", RecordType::A, None))
            .await
            .is_some()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_from_one_source_is_rate_limited_while_another_is_served() {
    let h = Harness::start().await;
    let flood = Arc::new(client(SANDBOX2, h.addr()).await);
    let answered = Arc::new(AtomicU64::new(0));
    let counter = {
        let (flood, answered) = (Arc::clone(&flood), Arc::clone(&answered));
        tokio::spawn(async move {
            let mut buf = [0u8; 512];
            while let Ok(Ok(_)) =
                tokio::time::timeout(Duration::from_millis(300), flood.recv(&mut buf)).await
            {
                answered.fetch_add(1, Ordering::Relaxed);
            }
        })
    };
    let q = query(1, "flood.example", RecordType::A, None);
    let t = Instant::now();
    for _ in 0..20 {
        for _ in 0..100 {
            flood.send(&q).await.unwrap();
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let secs = t.elapsed().as_secs_f64();

    // Meanwhile another sandbox is answered.
    let m = h.ask(SANDBOX, "pypi.org", RecordType::A).await;
    assert_eq!(addrs(&m), vec![ip("198.51.100.10")]);

    counter.await.unwrap();
    let answered = answered.load(Ordering::Relaxed) as f64;
    let c = h.counters();
    assert!(c.rate_limited > 0, "{c:?}");
    // Burst 400, then 200 a second.
    assert!(
        answered <= 400.0 + 200.0 * secs + 2.0,
        "{answered} in {secs} s"
    );
    // Refusal events: burst 100, then 100 a second; the rest counted.
    let events = h
        .policy
        .events()
        .iter()
        .filter(|e| matches!(e, Event::Refused { src, .. } if *src == SANDBOX2))
        .count() as f64;
    assert!(events <= 100.0 + 100.0 * secs + 2.0, "{events} in {secs} s");
    assert!(c.events_suppressed > 0, "{c:?}");
    assert_eq!(c.refused, events as u64 + c.events_suppressed);
}

#[tokio::test]
async fn too_many_upstream_queries_in_flight_get_servfail_at_once() {
    let h = Harness::with(Duration::ZERO, |c| c.limits.inflight_per_source = 2).await;
    let slow = |id| {
        let addr = h.addr();
        tokio::spawn(async move {
            udp_ask(
                addr,
                SANDBOX,
                &query(id, "slow.allowed.test", RecordType::A, None),
            )
            .await
        })
    };
    let (a, b) = (slow(1), slow(2));
    tokio::time::sleep(Duration::from_millis(100)).await;
    let t = Instant::now();
    let m = h.ask(SANDBOX, "pypi.org", RecordType::A).await;
    assert_eq!(m.metadata.response_code, ResponseCode::ServFail);
    assert!(
        t.elapsed() < Duration::from_millis(300),
        "not after the upstream timeout"
    );
    assert_eq!(h.counters().overloaded, 1);
    for r in [a.await.unwrap(), b.await.unwrap()] {
        assert_eq!(r.unwrap().metadata.response_code, ResponseCode::ServFail);
    }
    // The slots came back.
    let m = h.ask(SANDBOX, "pypi.org", RecordType::A).await;
    assert_eq!(addrs(&m), vec![ip("198.51.100.10")]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_policy_learns_the_addresses_before_the_sandbox_does() {
    // `resolved` takes 300 ms (a slow firewall): had the answer left first, it would arrive
    // before the event exists.
    let h = Harness::with(Duration::from_millis(300), |_| {}).await;
    let t = Instant::now();
    let m = h.ask(SANDBOX, "pypi.org", RecordType::A).await;
    assert!(t.elapsed() >= Duration::from_millis(300));
    assert_eq!(addrs(&m), vec![ip("198.51.100.10")]);
    assert_eq!(
        h.policy.events(),
        vec![resolved("pypi.org", &["198.51.100.10"], 300)]
    );
}

#[tokio::test]
async fn forged_upstream_answers_are_ignored() {
    let h = Harness::start().await;
    let m = h.ask(SANDBOX, "spoof.allowed.test", RecordType::A).await;
    assert_eq!(addrs(&m), vec![ip("198.51.100.40")]);
    assert_eq!(
        h.policy.events(),
        vec![resolved("spoof.allowed.test", &["198.51.100.40"], 100)]
    );
    assert_eq!(h.counters().spoofed, 3);
}

#[tokio::test]
async fn stopping_closes_the_sockets() {
    let h = Harness::start().await;
    let addr = h.addr();
    h.ask(SANDBOX, "pypi.org", RecordType::A).await;
    let Harness {
        proxy,
        upstream: _u,
        ..
    } = h;
    proxy.stop().await;
    // Closed: the address can be bound again at once. (Asking it and hearing nothing was
    // flaky: the tests run side by side, and another one's proxy or upstream could take the
    // freed port and answer.)
    let udp = std::net::UdpSocket::bind(addr);
    assert!(udp.is_ok(), "the UDP socket is still open: {udp:?}");
    let tcp = std::net::TcpListener::bind(addr);
    assert!(tcp.is_ok(), "the TCP listener is still open: {tcp:?}");
}

#[tokio::test]
async fn bad_configurations_are_refused() {
    let policy: Arc<dyn Policy> = Arc::new(TestPolicy::new(Duration::ZERO));
    let up: SocketAddr = "127.0.0.1:53".parse().unwrap();
    let base = Config::new(vec!["127.0.0.1:0".parse().unwrap()], up);
    let bad = [
        Config {
            listen: vec!["0.0.0.0:53".parse().unwrap()],
            ..base.clone()
        },
        Config {
            listen: vec![],
            ..base.clone()
        },
        Config {
            min_ttl: 10,
            max_ttl: 5,
            ..base.clone()
        },
        Config {
            limits: Limits {
                rate_per_source: 0,
                ..Limits::default()
            },
            ..base.clone()
        },
    ];
    for c in bad {
        let e = DnsProxy::start(c.clone(), Arc::clone(&policy)).unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::InvalidInput, "{c:?}");
    }
}

#[test]
fn starting_outside_a_runtime_is_an_error_not_a_panic() {
    let policy: Arc<dyn Policy> = Arc::new(TestPolicy::new(Duration::ZERO));
    let c = Config::new(
        vec!["127.0.0.1:0".parse().unwrap()],
        "127.0.0.1:53".parse().unwrap(),
    );
    assert!(DnsProxy::start(c, policy).is_err());
}

/// A small deterministic generator (xorshift) for the garbage below.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

/// Mutations of valid messages and random bytes: no input makes the proxy's message handling
/// (or the upstream answer's filtering) panic.
#[test]
fn no_input_panics() {
    let policy: Arc<dyn Policy> = Arc::new(TestPolicy::new(Duration::ZERO));
    let config = Config::new(
        vec!["127.0.0.1:0".parse().unwrap()],
        "127.0.0.1:53".parse().unwrap(),
    );
    let shared = super::Shared {
        sources: Arc::new(super::Sources::new(Limits {
            rate_per_source: u32::MAX,
            burst_per_source: u32::MAX,
            ..Limits::default()
        })),
        config,
        policy,
        stats: super::Stats::default(),
    };
    let mut seeds = vec![
        query(1, "pypi.org", RecordType::A, Some(1232)),
        query(2, "a.b.files.pythonhosted.org", RecordType::AAAA, None),
        query(3, "evil.com", RecordType::TXT, Some(4096)),
    ];
    let q = Query::query(fqdn("files.pythonhosted.org"), RecordType::A);
    let up = upstream_answer(
        1,
        &q,
        ResponseCode::NoError,
        &[
            cname_record("files.pythonhosted.org", 300, "cdn.example.net"),
            addr_record("cdn.example.net", 30, ip("198.51.100.20")),
        ],
    );
    let up_bytes = up.to_vec().unwrap();
    seeds.push(up_bytes.clone());
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    for i in 0..30_000 {
        let mut b = if i % 10 == 0 {
            (0..rng.below(600)).map(|_| rng.next() as u8).collect()
        } else {
            seeds[rng.below(seeds.len())].clone()
        };
        for _ in 0..1 + rng.below(4) {
            if b.is_empty() {
                break;
            }
            let at = rng.below(b.len());
            match rng.below(4) {
                0 => b[at] = rng.next() as u8,
                1 => b.truncate(at),
                2 => b.insert(at, rng.next() as u8),
                _ => b[at] ^= 1 << rng.below(8),
            }
        }
        let _ = shared.step(SANDBOX, &b, i % 2 == 0);
        if let Some(m) = message::parse_upstream(&b, 1, &q) {
            let _ = message::filter(&q, &m, &[], 0, u32::MAX);
        }
        if let Ok(m) = Message::from_vec(&b)
            && let Some(q) = m.queries.first()
        {
            let _ = message::filter(q, &m, &[], 30, 600);
        }
    }
}
