//! The test's world: three network namespaces (a sandbox, a node running the proxy behind
//! an nftables redirect of the test's own, an internet), the internet's HTTPS, HTTP and DNS
//! servers, and a test policy standing in for the node's.

use std::collections::HashSet;
use std::io::{self, Read, Write};
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream, UdpSocket};

use std::sync::{Arc, Mutex};
use std::time::Duration;

use hickory_proto::op::{Message, OpCode, ResponseCode};
use hickory_proto::rr::rdata::{A, AAAA};
use hickory_proto::rr::{RData, Record, RecordType};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer, ServerName};
use warren_net::proxy::{Config, Limits, Policy, Proxy, Refusal};
use warren_types::net::Cidr;

pub use crate::common::{Ns, enter, is_root};

/// One test at a time: the measurement must not share the two CPUs with the other test.
pub static SERIAL: Mutex<()> = Mutex::new(());

const SANDBOX4: &str = "10.77.0.2";
const SANDBOX6: &str = "fd77::2";
pub const SITE_A: &str = "198.51.100.10";
pub const SITE_B: &str = "198.51.100.20";
pub const SITE_A6: &str = "2001:db8::10";
/// The node's uplink address: always denied.
pub const NODE_UPLINK: &str = "198.51.100.2";
/// An address the test policy's deny rules refuse.
pub const DENIED_ADDR: &str = "198.51.100.30";
const DNS: &str = "198.51.100.1";

pub fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

pub fn sa(s: &str, port: u16) -> SocketAddr {
    SocketAddr::new(ip(s), port)
}

// ----- The internet: TLS certificates, servers, DNS --------------------------------------

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// A test CA and a server configuration whose certificate names every test name.
fn tls_configs() -> (Arc<rustls::ServerConfig>, Arc<rustls::ClientConfig>) {
    let ca_key = rcgen::KeyPair::generate().unwrap();
    let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    let ca = ca_params.self_signed(&ca_key).unwrap();
    let issuer = rcgen::Issuer::from_params(&ca_params, &ca_key);
    let names: Vec<String> = [
        "allowed.test",
        "blocked.test",
        "other.test",
        "internal.test",
        "denyaddr.test",
    ]
    .map(String::from)
    .to_vec();
    let key = rcgen::KeyPair::generate().unwrap();
    let leaf = rcgen::CertificateParams::new(names)
        .unwrap()
        .signed_by(&key, &issuer)
        .unwrap();
    let server = rustls::ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(
            vec![leaf.der().clone()],
            PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der())),
        )
        .unwrap();
    let mut roots = rustls::RootCertStore::empty();
    roots.add(CertificateDer::from(ca.der().to_vec())).unwrap();
    let client = rustls::ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    (Arc::new(server), Arc::new(client))
}

/// Reads one request head; None at end of stream.
fn read_head(s: &mut impl Read) -> Option<String> {
    let mut head = Vec::new();
    let mut b = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        match s.read(&mut b) {
            Ok(1) => head.push(b[0]),
            _ => return None,
        }
    }
    Some(String::from_utf8_lossy(&head).into_owned())
}

/// Answers each request on `s` with `<the address reached> <the Host asked for>`, until the
/// client closes (or asks to).
fn answer_requests(s: &mut (impl Read + Write), reached: SocketAddr) {
    while let Some(head) = read_head(s) {
        let host = head
            .lines()
            .find_map(|l| l.strip_prefix("Host: "))
            .unwrap_or("-");
        let body = format!("{reached} {host}");
        let close = head.contains("Connection: close");
        let msg = format!(
            "HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        );
        if s.write_all(msg.as_bytes()).is_err() || s.flush().is_err() || close {
            return;
        }
    }
}

/// An HTTP server on `addr` in `ns`.
fn serve_http(ns: &Ns, addr: SocketAddr) {
    let l = ns.run(|| TcpListener::bind(addr).unwrap());
    ns.spawn(move || {
        for s in l.incoming().flatten() {
            std::thread::spawn(move || {
                let mut s = s;
                answer_requests(&mut s, addr);
            });
        }
    });
}

/// An HTTPS server on `addr` in `ns`.
fn serve_https(ns: &Ns, addr: SocketAddr, config: Arc<rustls::ServerConfig>) {
    let l = ns.run(|| TcpListener::bind(addr).unwrap());
    ns.spawn(move || {
        for s in l.incoming().flatten() {
            let config = Arc::clone(&config);
            std::thread::spawn(move || {
                let conn = rustls::ServerConnection::new(config).unwrap();
                let mut tls = rustls::StreamOwned::new(conn, s);
                answer_requests(&mut tls, addr);
                tls.conn.send_close_notify();
                let _ = tls.flush();
            });
        }
    });
}

/// The test's names.
fn zone(name: &str, t: RecordType) -> Vec<IpAddr> {
    let v4 = |s: &str| {
        if t == RecordType::A {
            vec![ip(s)]
        } else {
            vec![]
        }
    };
    match (name, t) {
        ("allowed.test.", RecordType::AAAA) => vec![ip(SITE_A6)],
        // blocked.test shares allowed.test's address, as sites on a CDN do.
        ("allowed.test." | "blocked.test.", _) => v4(SITE_A),
        ("other.test.", _) => v4(SITE_B),
        ("internal.test.", _) => v4(NODE_UPLINK),
        ("denyaddr.test.", _) => v4(DENIED_ADDR),
        _ => vec![],
    }
}

/// A DNS server on `addr` in `ns` answering [`zone`] over UDP.
fn serve_dns(ns: &Ns, addr: SocketAddr) {
    let socket = ns.run(|| UdpSocket::bind(addr).unwrap());
    ns.spawn(move || {
        let mut buf = [0u8; 4096];
        loop {
            let Ok((n, peer)) = socket.recv_from(&mut buf) else {
                continue;
            };
            let Ok(q) = Message::from_vec(&buf[..n]) else {
                continue;
            };
            let Some(query) = q.queries.first().cloned() else {
                continue;
            };
            let mut m = Message::response(q.metadata.id, OpCode::Query);
            m.metadata.recursion_desired = true;
            m.metadata.recursion_available = true;
            let name = query.name().to_ascii().to_ascii_lowercase();
            let addrs = zone(&name, query.query_type());
            let exists = [RecordType::A, RecordType::AAAA]
                .iter()
                .any(|&t| !zone(&name, t).is_empty());
            m.metadata.response_code = if exists {
                ResponseCode::NoError
            } else {
                ResponseCode::NXDomain
            };
            m.answers = addrs
                .into_iter()
                .map(|a| {
                    let data = match a {
                        IpAddr::V4(a) => RData::A(A(a)),
                        IpAddr::V6(a) => RData::AAAA(AAAA(a)),
                    };
                    Record::from_rdata(query.name().clone(), 60, data)
                })
                .collect();
            m.add_query(query);
            let _ = socket.send_to(&m.to_vec().unwrap(), peer);
        }
    });
}

// ----- The node's side: a test policy ------------------------------------------------------

/// A refusal the proxy reported.
#[derive(Debug, Clone)]
pub struct Event {
    pub dst: SocketAddr,
    pub name: Option<String>,
    pub why: Refusal,
}

/// The sandbox (its two addresses) may reach the names in `allowed` on 80 and 443, at
/// generation `generation`; its deny rules refuse [`DENIED_ADDR`].
pub struct TestPolicy {
    state: Mutex<(u64, HashSet<String>)>,
    events: Mutex<Vec<Event>>,
}

impl TestPolicy {
    fn new(allowed: &[&str]) -> TestPolicy {
        TestPolicy {
            state: Mutex::new((1, allowed.iter().map(|s| s.to_string()).collect())),
            events: Mutex::new(Vec::new()),
        }
    }

    fn is_sandbox(src: IpAddr) -> bool {
        src == ip(SANDBOX4) || src == ip(SANDBOX6)
    }

    /// A new policy: these names, the next generation.
    pub fn set(&self, allowed: &[&str]) {
        let mut s = self.state.lock().unwrap();
        s.0 += 1;
        s.1 = allowed.iter().map(|s| s.to_string()).collect();
    }

    /// The events reported so far about `name`.
    pub fn events_for(&self, name: &str) -> Vec<Event> {
        self.events
            .lock()
            .unwrap()
            .iter()
            .filter(|e| e.name.as_deref() == Some(name))
            .cloned()
            .collect()
    }
}

impl Policy for TestPolicy {
    fn decide(&self, src: IpAddr, name: &str, port: u16) -> Option<u64> {
        let s = self.state.lock().unwrap();
        (Self::is_sandbox(src) && matches!(port, 80 | 443) && s.1.contains(name)).then_some(s.0)
    }

    fn current(&self, src: IpAddr) -> Option<u64> {
        Self::is_sandbox(src).then(|| self.state.lock().unwrap().0)
    }

    fn may_dial(&self, _src: IpAddr, addr: IpAddr, _port: u16) -> bool {
        addr != ip(DENIED_ADDR)
    }

    fn refused(&self, _src: IpAddr, dst: SocketAddr, name: Option<&str>, why: &Refusal) {
        self.events.lock().unwrap().push(Event {
            dst,
            name: name.map(String::from),
            why: why.clone(),
        });
    }
}

// ----- The world -------------------------------------------------------------------------

/// The three namespaces, their servers, and the proxy running in the node's.
pub struct World {
    pub sbx: Ns,
    // Held for their Drop (the namespaces' deletion).
    _node: Ns,
    _net: Ns,
    pub client: Arc<rustls::ClientConfig>,
    pub policy: Arc<TestPolicy>,
    proxy: Proxy,
    // Its worker threads are in the node's namespace (the proxy's sockets are made there).
    _rt: tokio::runtime::Runtime,
}

impl World {
    pub fn new(tag: &str, limits: Limits) -> World {
        let sbx = Ns::new(&format!("{tag}s"));
        let node = Ns::new(&format!("{tag}n"));
        let net = Ns::new(&format!("{tag}i"));
        for ns in [&sbx, &node, &net] {
            ns.exec(&["sysctl", "-qw", "net.ipv6.conf.all.accept_dad=0"], "");
            ns.exec(&["sysctl", "-qw", "net.ipv6.conf.default.accept_dad=0"], "");
        }
        // Every link is made inside the node's namespace, its far end moved straight into
        // the other's: nothing is created in the machine's own namespace.
        node.ip(&[
            "link", "add", "wts0", "type", "veth", "peer", "name", "eth0", "netns", &sbx.name,
        ]);
        node.ip(&[
            "link", "add", "wtu0", "type", "veth", "peer", "name", "up0", "netns", &net.name,
        ]);
        for (ns, dev, addrs) in [
            (&node, "wts0", &["10.77.0.1/24", "fd77::1/64"][..]),
            (&sbx, "eth0", &["10.77.0.2/24", "fd77::2/64"]),
            (&node, "wtu0", &["198.51.100.2/24", "2001:db8::2/64"]),
            (
                &net,
                "up0",
                &[
                    "198.51.100.1/24",
                    "198.51.100.10/24",
                    "198.51.100.20/24",
                    "198.51.100.30/24",
                    "2001:db8::10/64",
                ],
            ),
        ] {
            for a in addrs {
                ns.ip(&["addr", "add", a, "dev", dev, "nodad"]);
            }
            ns.ip(&["link", "set", dev, "up"]);
        }
        sbx.ip(&["route", "add", "default", "via", "10.77.0.1"]);
        sbx.ip(&["-6", "route", "add", "default", "via", "fd77::1"]);
        net.ip(&["route", "add", "10.77.0.0/24", "via", "198.51.100.2"]);
        net.ip(&["-6", "route", "add", "fd77::/64", "via", "2001:db8::2"]);
        node.exec(&["sysctl", "-qw", "net.ipv4.ip_forward=1"], "");
        node.exec(&["sysctl", "-qw", "net.ipv6.conf.all.forwarding=1"], "");
        // Nothing may answer from DENIED_ADDR: a port there that accepted would hide a dial.
        net.exec(
            &["nft", "-f", "-"],
            "table inet wpx { chain in { type filter hook input priority 0; \
             ip daddr 198.51.100.30 tcp flags syn reject with tcp reset; }; }",
        );

        let (server, client) = tls_configs();
        for a in [SITE_A, SITE_B, SITE_A6] {
            serve_https(&net, sa(a, 443), Arc::clone(&server));
            serve_http(&net, sa(a, 80));
        }
        // Unredirected ports, for the direct arm of the measurement.
        serve_https(&net, sa(SITE_A, 8443), Arc::clone(&server));
        serve_http(&net, sa(SITE_A, 8080));
        serve_dns(&net, sa(DNS, 53));

        let node_fd = Arc::new(node.file());
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .on_thread_start(move || {
                enter(&node_fd);
            })
            .build()
            .unwrap();
        let policy = Arc::new(TestPolicy::new(&[
            "allowed.test",
            "other.test",
            "internal.test",
            "denyaddr.test",
        ]));
        let mut cfg = Config::new(vec![sa("10.77.0.1", 0), sa("::", 0)], sa(DNS, 53));
        cfg.never = vec![
            Cidr::parse("198.51.100.2/32").unwrap(),
            Cidr::parse("10.77.0.0/24").unwrap(),
        ];
        cfg.limits = limits;
        let p: Arc<dyn Policy> = policy.clone();
        let proxy = rt
            .block_on(rt.spawn(async move { Proxy::start(cfg, p) }))
            .unwrap()
            .unwrap();
        let (p4, p6) = (proxy.local_addrs()[0].port(), proxy.local_addrs()[1].port());
        node.exec(
            &["nft", "-f", "-"],
            &format!(
                "table inet wpx {{ chain pre {{ type nat hook prerouting priority dstnat; \
                 iifname \"wts0\" meta nfproto ipv4 tcp dport {{ 80, 443 }} redirect to :{p4}; \
                 iifname \"wts0\" meta nfproto ipv6 tcp dport {{ 80, 443 }} redirect to :{p6}; }}; }}"
            ),
        );
        World {
            sbx,
            _node: node,
            _net: net,
            client,
            policy,
            proxy,
            _rt: rt,
        }
    }

    pub fn proxy(&self) -> &Proxy {
        &self.proxy
    }

    /// A TCP connection from the sandbox.
    pub fn connect(&self, to: SocketAddr) -> io::Result<TcpStream> {
        self.sbx.run(|| {
            let s = TcpStream::connect_timeout(&to, Duration::from_secs(3))?;
            s.set_read_timeout(Some(Duration::from_secs(5)))?;
            s.set_nodelay(true)?;
            Ok(s)
        })
    }

    /// A TLS connection from the sandbox to `to`, asking for `sni`, its handshake done.
    pub fn tls(&self, to: SocketAddr, sni: &str) -> io::Result<Tls> {
        self.tls_with(to, sni, Arc::clone(&self.client))
    }

    pub fn tls_with(
        &self,
        to: SocketAddr,
        sni: &str,
        cfg: Arc<rustls::ClientConfig>,
    ) -> io::Result<Tls> {
        let tcp = self.connect(to)?;
        let name = ServerName::try_from(sni.to_string()).map_err(io::Error::other)?;
        let conn = rustls::ClientConnection::new(cfg, name).map_err(io::Error::other)?;
        let mut tls = rustls::StreamOwned::new(conn, tcp);
        while tls.conn.is_handshaking() {
            tls.conn.complete_io(&mut tls.sock)?;
        }
        Ok(tls)
    }
}

pub type Tls = rustls::StreamOwned<rustls::ClientConnection, TcpStream>;
