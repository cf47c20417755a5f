//! The transparent proxy against the kernel, in network namespaces this test makes: a
//! "sandbox"; a "node" running the proxy behind an nftables `redirect` rule of the test's own
//! (ports 80 and 443 from the sandbox's interface); an "internet" with HTTPS and HTTP servers
//! on two addresses (each answers with the address it was reached on and the host asked
//! for), a third address nothing listens on, and a DNS server for the test's names. No
//! traffic leaves these namespaces; the root namespace is not touched. Needs root.
//!
//! ```text
//! sandbox 10.77.0.2, fd77::2 ── node 10.77.0.1, fd77::1 | 198.51.100.2, 2001:db8::2 ── internet
//!                                 proxy on 10.77.0.1:P4, [::]:P6                  .1 DNS, .10 A, .20 B,
//!                                                                                 2001:db8::10 A
//! ```

use std::collections::HashSet;
use std::io::{self, Read, Write};
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::os::fd::AsFd;
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use hickory_proto::op::{Message, OpCode, ResponseCode};
use hickory_proto::rr::rdata::{A, AAAA};
use hickory_proto::rr::{RData, Record, RecordType};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer, ServerName};
use warren_net::proxy::{Config, Limits, Policy, Proxy, Refusal};
use warren_types::net::Cidr;

/// One test at a time: the measurement must not share the two CPUs with the other test.
static SERIAL: Mutex<()> = Mutex::new(());

const SANDBOX4: &str = "10.77.0.2";
const SANDBOX6: &str = "fd77::2";
const SITE_A: &str = "198.51.100.10";
const SITE_B: &str = "198.51.100.20";
const SITE_A6: &str = "2001:db8::10";
/// The node's uplink address: always denied.
const NODE_UPLINK: &str = "198.51.100.2";
/// An address the test policy's deny rules refuse.
const DENIED_ADDR: &str = "198.51.100.30";
const DNS: &str = "198.51.100.1";

fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .map(|s| {
            s.lines()
                .any(|l| l.starts_with("Uid:") && l.split_whitespace().nth(1) == Some("0"))
        })
        .unwrap_or(false)
}

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

fn sa(s: &str, port: u16) -> SocketAddr {
    SocketAddr::new(ip(s), port)
}

// ----- Namespaces ------------------------------------------------------------------------

/// A network namespace made for this test, deleted when dropped (a failing test too).
struct Ns {
    name: String,
}

impl Ns {
    fn new(tag: &str) -> Ns {
        let name = format!("wpx-{}-{tag}", std::process::id());
        let _ = Command::new("ip")
            .args(["netns", "del", &name])
            .stderr(Stdio::null())
            .status();
        let ok = Command::new("ip")
            .args(["netns", "add", &name])
            .status()
            .unwrap();
        assert!(ok.success(), "ip netns add {name}");
        let ns = Ns { name };
        ns.ip(&["link", "set", "lo", "up"]);
        ns
    }

    fn ip(&self, args: &[&str]) {
        let out = Command::new("ip")
            .arg("-n")
            .arg(&self.name)
            .args(args)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "ip -n {} {args:?}: {}",
            self.name,
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// Runs `cmd` in the namespace with `stdin`, and asserts it succeeded.
    fn exec(&self, cmd: &[&str], stdin: &str) {
        let mut child = Command::new("ip")
            .args(["netns", "exec", &self.name])
            .args(cmd)
            .stdin(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        child
            .stdin
            .take()
            .unwrap()
            .write_all(stdin.as_bytes())
            .unwrap();
        let out = child.wait_with_output().unwrap();
        assert!(
            out.status.success(),
            "{cmd:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    fn file(&self) -> std::fs::File {
        std::fs::File::open(format!("/run/netns/{}", self.name)).unwrap()
    }

    /// Runs `f` on a thread inside this namespace and waits for it.
    fn run<T: Send>(&self, f: impl FnOnce() -> T + Send) -> T {
        let fd = self.file();
        std::thread::scope(|s| {
            s.spawn(move || {
                enter(&fd);
                f()
            })
            .join()
            .unwrap()
        })
    }

    /// Runs `f` on a thread of its own inside this namespace, for as long as it runs.
    fn spawn(&self, f: impl FnOnce() + Send + 'static) {
        let fd = self.file();
        std::thread::spawn(move || {
            enter(&fd);
            f()
        });
    }
}

/// Moves the calling thread into the network namespace of `fd`.
fn enter(fd: &std::fs::File) {
    rustix::thread::move_into_link_name_space(
        fd.as_fd(),
        Some(rustix::thread::LinkNameSpaceType::Network),
    )
    .unwrap();
}

impl Drop for Ns {
    fn drop(&mut self) {
        let _ = Command::new("ip")
            .args(["netns", "del", &self.name])
            .status();
    }
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
struct Event {
    dst: SocketAddr,
    name: Option<String>,
    why: Refusal,
}

/// The sandbox (its two addresses) may reach the names in `allowed` on 80 and 443, at
/// generation `generation`; its deny rules refuse [`DENIED_ADDR`].
struct TestPolicy {
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
    fn set(&self, allowed: &[&str]) {
        let mut s = self.state.lock().unwrap();
        s.0 += 1;
        s.1 = allowed.iter().map(|s| s.to_string()).collect();
    }

    /// The events reported so far about `name`.
    fn events_for(&self, name: &str) -> Vec<Event> {
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
struct World {
    sbx: Ns,
    // Held for their Drop (the namespaces' deletion).
    _node: Ns,
    _net: Ns,
    client: Arc<rustls::ClientConfig>,
    policy: Arc<TestPolicy>,
    proxy: Proxy,
    // Its worker threads are in the node's namespace (the proxy's sockets are made there).
    _rt: tokio::runtime::Runtime,
}

impl World {
    fn new(tag: &str, limits: Limits) -> World {
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

    fn proxy(&self) -> &Proxy {
        &self.proxy
    }

    /// A TCP connection from the sandbox.
    fn connect(&self, to: SocketAddr) -> io::Result<TcpStream> {
        self.sbx.run(|| {
            let s = TcpStream::connect_timeout(&to, Duration::from_secs(3))?;
            s.set_read_timeout(Some(Duration::from_secs(5)))?;
            s.set_nodelay(true)?;
            Ok(s)
        })
    }

    /// A TLS connection from the sandbox to `to`, asking for `sni`, its handshake done.
    fn tls(&self, to: SocketAddr, sni: &str) -> io::Result<Tls> {
        self.tls_with(to, sni, Arc::clone(&self.client))
    }

    fn tls_with(
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

type Tls = rustls::StreamOwned<rustls::ClientConnection, TcpStream>;

/// Sends a GET for `host` on `s` and reads the answer: (status line, body).
fn get(s: &mut (impl Read + Write), host: &str, close: bool) -> io::Result<(String, String)> {
    let conn = if close { "Connection: close\r\n" } else { "" };
    s.write_all(format!("GET / HTTP/1.1\r\nHost: {host}\r\n{conn}\r\n").as_bytes())?;
    s.flush()?;
    let head = read_head_io(s)?;
    let len: usize = head
        .lines()
        .find_map(|l| l.strip_prefix("Content-Length: "))
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or(0);
    let mut body = vec![0u8; len];
    s.read_exact(&mut body)?;
    let status = head.lines().next().unwrap_or_default().to_string();
    Ok((status, String::from_utf8_lossy(&body).into_owned()))
}

/// [`read_head`] that tells an error (a reset) from the end of the stream.
fn read_head_io(s: &mut impl Read) -> io::Result<String> {
    let mut head = Vec::new();
    let mut b = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        match s.read(&mut b)? {
            0 => return Err(io::ErrorKind::UnexpectedEof.into()),
            _ => head.push(b[0]),
        }
    }
    Ok(String::from_utf8_lossy(&head).into_owned())
}

fn is_reset(r: &io::Result<impl std::fmt::Debug>) -> bool {
    matches!(r, Err(e) if e.kind() == io::ErrorKind::ConnectionReset)
}

/// Waits up to 2 s for `f` to hold (events are reported just after the reset).
fn eventually(f: impl Fn() -> bool) -> bool {
    let end = Instant::now() + Duration::from_secs(2);
    while Instant::now() < end {
        if f() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    f()
}

/// A minimal TLS 1.3 ClientHello naming `sni`, with an `encrypted_client_hello` extension.
fn ech_hello(sni: &str) -> Vec<u8> {
    let mut name = vec![0];
    name.extend_from_slice(&(sni.len() as u16).to_be_bytes());
    name.extend_from_slice(sni.as_bytes());
    let mut sni_ext = (name.len() as u16).to_be_bytes().to_vec();
    sni_ext.extend_from_slice(&name);
    let mut ext = Vec::new();
    for (kind, data) in [(0u16, sni_ext), (0xfe0d, vec![0; 16])] {
        ext.extend_from_slice(&kind.to_be_bytes());
        ext.extend_from_slice(&(data.len() as u16).to_be_bytes());
        ext.extend_from_slice(&data);
    }
    let mut body = vec![3, 3];
    body.extend_from_slice(&[7; 32]);
    body.extend_from_slice(&[0, 0, 2, 0x13, 0x01, 1, 0]);
    body.extend_from_slice(&(ext.len() as u16).to_be_bytes());
    body.extend_from_slice(&ext);
    let mut rec = vec![22, 3, 1];
    rec.extend_from_slice(&((body.len() + 4) as u16).to_be_bytes());
    rec.extend_from_slice(&[1, 0]);
    rec.extend_from_slice(&(body.len() as u16).to_be_bytes());
    rec.extend_from_slice(&body);
    rec
}

fn test_limits() -> Limits {
    Limits {
        first_bytes_timeout: Duration::from_secs(1),
        idle_timeout: Duration::from_secs(2),
        conns_per_source: 8,
        ..Limits::default()
    }
}

#[test]
fn names_are_judged_and_dialled_by_the_proxy_in_namespaces_of_our_own() {
    if !is_root() {
        eprintln!("SKIP: needs root (network namespaces, nftables)");
        return;
    }
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let w = World::new("f", test_limits());
    let a443 = sa(SITE_A, 443);
    let a80 = sa(SITE_A, 80);
    let b443 = sa(SITE_B, 443);
    let reported = |name: &str, why: &Refusal, dst: SocketAddr| {
        eventually(|| {
            w.policy
                .events_for(name)
                .iter()
                .any(|e| &e.why == why && e.dst == dst)
        })
    };

    {
        // An allowed name: the TLS handshake completes with the real server (its
        // certificate checked against the test CA), and the request reaches it.
        let mut tls = w.tls(a443, "allowed.test").expect("allowed.test");
        let (status, body) = get(&mut tls, "allowed.test", false).unwrap();
        assert_eq!(status, "HTTP/1.1 200 OK");
        assert_eq!(body, format!("{a443} allowed.test"));

        // A name the policy does not allow, to the very same address: reset.
        let r = w.tls(a443, "blocked.test");
        assert!(is_reset(&r), "blocked.test got {:?}", r.map(|_| ()));
        assert!(reported("blocked.test", &Refusal::Denied, a443));
    }

    {
        // Plain HTTP: an allowed Host passes; a later request on the same connection naming
        // another host cuts it; a disallowed Host gets a 403 that says why.
        let mut s = w.connect(a80).unwrap();
        let (status, body) = get(&mut s, "allowed.test", false).unwrap();
        assert_eq!(status, "HTTP/1.1 200 OK");
        assert_eq!(body, format!("{a80} allowed.test"));
        let r = get(&mut s, "blocked.test", false);
        assert!(is_reset(&r), "a second host on one connection got {r:?}");
        let hc = Refusal::HostChanged("blocked.test".into());
        assert!(reported("blocked.test", &hc, a80));

        let mut s = w.connect(a80).unwrap();
        let (status, body) = get(&mut s, "blocked.test", false).unwrap();
        assert_eq!(status, "HTTP/1.1 403 Forbidden");
        assert!(body.contains("does not allow this name"), "{body}");
    }

    {
        // /etc/hosts-style spoofing: the sandbox dials site B's address with allowed.test's
        // name; the proxy reaches allowed.test's own address, over TLS and plain HTTP.
        let mut tls = w.tls(b443, "allowed.test").unwrap();
        let (_, body) = get(&mut tls, "allowed.test", true).unwrap();
        assert_eq!(body, format!("{a443} allowed.test"), "dialled by name");
        let mut s = w.connect(sa(SITE_B, 80)).unwrap();
        let (_, body) = get(&mut s, "allowed.test", true).unwrap();
        assert_eq!(body, format!("{a80} allowed.test"));

        // IPv6: through the v6-only listener, the name's AAAA dialled.
        let a6 = sa(SITE_A6, 443);
        let mut tls = w.tls(a6, "allowed.test").expect("allowed.test over IPv6");
        let (_, body) = get(&mut tls, "allowed.test", true).unwrap();
        assert_eq!(body, format!("{a6} allowed.test"));
    }

    {
        // A name resolving to an always-denied address (the node's own): reset, reported as
        // rebinding. One resolving to an address the deny rules refuse: the same.
        let r = w.tls(a443, "internal.test");
        assert!(is_reset(&r), "internal.test got {:?}", r.map(|_| ()));
        let why = Refusal::Rebinding(vec![ip(NODE_UPLINK)]);
        assert!(reported("internal.test", &why, a443));
        let r = w.tls(a443, "denyaddr.test");
        assert!(is_reset(&r), "denyaddr.test got {:?}", r.map(|_| ()));
        let why = Refusal::DeniedAddress(vec![ip(DENIED_ADDR)]);
        assert!(reported("denyaddr.test", &why, a443));

        // No server name: reset. A connection straight to the proxy's port, which the
        // firewall did not redirect: reset.
        let mut no_sni = (*w.client).clone();
        no_sni.enable_sni = false;
        let r = w.tls_with(a443, "allowed.test", Arc::new(no_sni));
        assert!(is_reset(&r), "no SNI got {:?}", r.map(|_| ()));
        // (The reset may come before connect(2) has returned: it says so then.)
        let r = w
            .connect(w.proxy().local_addrs()[0])
            .and_then(|mut s| get(&mut s, "allowed.test", true));
        assert!(is_reset(&r), "an unredirected connection got {r:?}");
    }

    {
        // A policy change cuts the live connections it no longer allows, at once, and
        // leaves the others.
        assert!(eventually(|| w.proxy().live() == 0), "{}", w.proxy().live());
        let mut kept = w.tls(b443, "other.test").unwrap();
        get(&mut kept, "other.test", false).unwrap();
        let mut cut = w.tls(a443, "allowed.test").unwrap();
        get(&mut cut, "allowed.test", false).unwrap();
        assert_eq!(w.proxy().live(), 2);
        w.policy.set(&["other.test"]);
        assert_eq!(w.proxy().recheck(), 1);
        // Its socket, read under TLS, meets the reset (no request needed to notice).
        let r = cut.sock.read(&mut [0u8; 1]);
        assert!(is_reset(&r), "the cut connection got {r:?}");
        let (_, body) = get(&mut kept, "other.test", false).unwrap();
        assert_eq!(body, format!("{b443} other.test"));
        assert!(reported("allowed.test", &Refusal::PolicyChanged, a443));
        w.policy.set(&[
            "allowed.test",
            "other.test",
            "internal.test",
            "denyaddr.test",
        ]);
    }

    {
        // A ClientHello with an Encrypted Client Hello extension (its SNI only a public
        // name): reset, as the configuration asks by default.
        let r = w.connect(a443).and_then(|mut s| {
            s.write_all(&ech_hello("allowed.test"))?;
            s.read(&mut [0u8; 1])
        });
        assert!(is_reset(&r), "an ECH hello got {r:?}");
        assert!(reported("allowed.test", &Refusal::Ech, a443));
    }

    {
        // An allowed connection on which nothing moves for idle_timeout (2 s) is closed.
        let mut tls = w.tls(a443, "allowed.test").unwrap();
        get(&mut tls, "allowed.test", false).unwrap();
        let t = Instant::now();
        tls.sock
            .set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        let r = tls.sock.read(&mut [0u8; 1]);
        assert!(matches!(r, Ok(0)), "an idle connection got {r:?}");
        assert!(
            t.elapsed() >= Duration::from_millis(1900),
            "{:?}",
            t.elapsed()
        );
        assert_eq!(w.proxy().counters().idle_closed, 1);
    }

    {
        // Slow loris: a ClientHello that never finishes is reset after first_bytes_timeout.
        let t = Instant::now();
        let mut s = w.connect(a443).unwrap();
        s.write_all(&[22, 3, 1, 0, 200, 1]).unwrap();
        let r = s.read(&mut [0u8; 1]);
        assert!(is_reset(&r), "a slow hello got {r:?}");
        assert!(w.proxy().counters().timed_out >= 1);
        eprintln!("a slow hello was reset after {:?} (limit 1 s)", t.elapsed());
    }

    {
        // Many connections from one source: past conns_per_source (8) they are reset at
        // once, while the first eight stay open.
        let held: Vec<TcpStream> = (0..8).map(|_| w.connect(a443).unwrap()).collect();
        let over = w.proxy().counters().over_limit;
        let r = w.connect(a443).and_then(|mut s| s.read(&mut [0u8; 1]));
        assert!(is_reset(&r), "the ninth connection got {r:?}");
        assert_eq!(w.proxy().counters().over_limit, over + 1);
        for mut h in held {
            h.set_read_timeout(Some(Duration::from_millis(50))).unwrap();
            let r = h.read(&mut [0u8; 1]);
            assert!(
                matches!(&r, Err(e) if e.kind() == io::ErrorKind::WouldBlock),
                "a held connection got {r:?}"
            );
        }
    }
    eprintln!("{:?}", w.proxy().counters());
}

/// What one connection of the measurement does: connect, (TLS handshake,) one small request
/// and its answer. Returns how long that took.
fn one_exchange(to: SocketAddr, tls: Option<&Arc<rustls::ClientConfig>>) -> Duration {
    let t = Instant::now();
    let mut tcp = TcpStream::connect_timeout(&to, Duration::from_secs(3)).unwrap();
    tcp.set_nodelay(true).unwrap();
    tcp.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let (_, body) = match tls {
        Some(cfg) => {
            let conn = rustls::ClientConnection::new(
                Arc::clone(cfg),
                ServerName::try_from("allowed.test").unwrap(),
            )
            .unwrap();
            let mut s = rustls::StreamOwned::new(conn, tcp);
            get(&mut s, "allowed.test", true).unwrap()
        }
        None => get(&mut tcp, "allowed.test", true).unwrap(),
    };
    let elapsed = t.elapsed();
    assert!(body.ends_with("allowed.test"), "{body}");
    elapsed
}

fn ms(d: Duration) -> String {
    format!("{:.3}", d.as_secs_f64() * 1e3)
}

/// The proxy's cost per connection — connect, TLS handshake, one small request — against
/// the same server reached directly (through the same node, forwarded, on a port the
/// firewall does not redirect), medians over a few hundred connections each, the arms
/// interleaved. Prints a table (`cargo test -p warren-net --test proxy -- --nocapture`); no
/// timing is asserted.
#[test]
fn the_proxy_cost_per_connection_is_measured() {
    if !is_root() {
        eprintln!("SKIP: needs root (network namespaces, nftables)");
        return;
    }
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let w = World::new("m", Limits::default());
    const N: usize = 300;
    const WARM: usize = 10;
    let client = Arc::clone(&w.client);
    let arms: [(&str, SocketAddr, bool); 4] = [
        ("HTTPS, direct", sa(SITE_A, 8443), true),
        ("HTTPS, through the proxy", sa(SITE_A, 443), true),
        ("HTTP, direct", sa(SITE_A, 8080), false),
        ("HTTP, through the proxy", sa(SITE_A, 80), false),
    ];
    let samples: Vec<Vec<Duration>> = w.sbx.run(|| {
        let mut samples = vec![Vec::with_capacity(N); arms.len()];
        for i in 0..N + WARM {
            for (k, (_, to, tls)) in arms.iter().enumerate() {
                let d = one_exchange(*to, tls.then_some(&client));
                if i >= WARM {
                    samples[k].push(d);
                }
            }
        }
        samples
    });
    let stat = |v: &[Duration], q: f64| {
        let mut v = v.to_vec();
        v.sort();
        v[((v.len() - 1) as f64 * q).round() as usize]
    };
    let build = if cfg!(debug_assertions) {
        "debug"
    } else {
        "release"
    };
    println!(
        "\nper connection: connect + TLS handshake + one small request, {N} each ({build} build)"
    );
    println!("| path | median ms | p90 ms | median added by the proxy ms |");
    println!("|---|---|---|---|");
    for (k, (label, _, _)) in arms.iter().enumerate() {
        let med = stat(&samples[k], 0.5);
        let added = if k % 2 == 1 {
            let direct = stat(&samples[k - 1], 0.5);
            format!("{:+.3}", (med.as_secs_f64() - direct.as_secs_f64()) * 1e3)
        } else {
            String::new()
        };
        println!(
            "| {label} | {} | {} | {added} |",
            ms(med),
            ms(stat(&samples[k], 0.9))
        );
    }
    let c = w.proxy().counters();
    assert_eq!(c.spliced as usize, 2 * (N + WARM), "{c:?}");
    assert_eq!(c.refused, 0, "{c:?}");
}
