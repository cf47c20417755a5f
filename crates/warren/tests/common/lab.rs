//! A network of the test's own: a "node" namespace (where `warren up` runs) with an uplink to
//! an "internet" namespace that holds a few sites (TCP and UDP servers on documentation
//! addresses) and a DNS server. Traffic never leaves these namespaces; the machine's own
//! namespace is not touched. Both are deleted when the lab is dropped.

use std::io::{Read, Write};
use std::net::{IpAddr, SocketAddr, TcpListener, UdpSocket};
use std::process::Command;

use super::in_netns;

/// The internet's addresses.
pub const SITE: &str = "198.51.100.1";
pub const OTHER_SITE: &str = "198.51.100.3";
pub const UNNAMED_SITE: &str = "198.51.100.4";
pub const SITE6: &str = "2001:db8:1::1";
pub const DNS: &str = "198.51.100.53";
/// The node's uplink address.
pub const NODE_UPLINK: &str = "198.51.100.2";
/// Hosts beyond the node on private, shared and unique-local addresses (an office network, a
/// cluster's database, a carrier-grade NAT, a private IPv6 network): "the internet" does not
/// hold them (see [`Lab::add_private_sites`]).
pub const PRIVATE_SITES: &[&str] = &[
    "10.99.0.1",
    "172.20.0.1",
    "192.168.77.1",
    "100.64.7.1",
    "fc00::7:1",
];
/// An address the node gains after it started (see [`Lab::node_gains_an_address`]).
pub const LATE_NODE: &str = "198.51.100.9";

/// What the fake DNS server answers: (name, address, TTL).
pub const ZONE: &[(&str, &str, u32)] = &[
    ("pypi.test", SITE, 2),
    ("files.host.test", OTHER_SITE, 300),
    ("a.b.host.test", OTHER_SITE, 300),
    ("other.test", OTHER_SITE, 300),
    // An allowed name that answers with the node's gateway: DNS rebinding.
    ("rebind.host.test", "10.200.0.1", 300),
    // An allowed name that answers with a private address (see `PRIVATE_SITES`).
    ("office.host.test", "10.99.0.1", 300),
    // An allowed name that answers with an address the node gained after it started.
    ("late.host.test", LATE_NODE, 300),
];

/// A network namespace of the test's, deleted when dropped.
pub struct Ns {
    pub name: String,
}

impl Ns {
    pub fn new(name: String) -> Ns {
        let _ = Command::new("ip")
            .args(["netns", "del", &name])
            .stderr(std::process::Stdio::null())
            .status();
        assert!(
            Command::new("ip")
                .args(["netns", "add", &name])
                .status()
                .unwrap()
                .success(),
            "ip netns add {name}"
        );
        let ns = Ns { name };
        ns.ip(&["link", "set", "lo", "up"]);
        ns
    }

    pub fn ip(&self, args: &[&str]) {
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

    /// Runs a shell command in the namespace (network only) and returns its stdout.
    pub fn sh(&self, cmd: &str) -> String {
        let out = Command::new("nsenter")
            .arg(format!("--net=/run/netns/{}", self.name))
            .args(["--", "sh", "-c", cmd])
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    pub fn run<T: Send>(&self, f: impl FnOnce() -> T + Send) -> T {
        in_netns(Some(&self.name), f)
    }
}

impl Drop for Ns {
    fn drop(&mut self) {
        let _ = Command::new("ip")
            .args(["netns", "del", &self.name])
            .status();
    }
}

/// The node's namespace and the internet beyond it.
pub struct Lab {
    pub node: Ns,
    pub internet: Ns,
}

impl Lab {
    pub fn new(tag: &str) -> Lab {
        let id = format!("{}{}", std::process::id() % 100_000, tag);
        let node = Ns::new(format!("wtn-{id}"));
        let internet = Ns::new(format!("wti-{id}"));
        node.ip(&[
            "link",
            "add",
            "up0",
            "type",
            "veth",
            "peer",
            "name",
            "up0",
            "netns",
            &internet.name,
        ]);
        node.ip(&["addr", "add", &format!("{NODE_UPLINK}/24"), "dev", "up0"]);
        node.ip(&["addr", "add", "2001:db8:1::2/64", "dev", "up0", "nodad"]);
        node.ip(&["link", "set", "up0", "up"]);
        node.ip(&["route", "add", "default", "via", SITE]);
        node.ip(&["-6", "route", "add", "default", "via", SITE6]);
        for a in [SITE, OTHER_SITE, UNNAMED_SITE, DNS] {
            internet.ip(&["addr", "add", &format!("{a}/24"), "dev", "up0"]);
        }
        internet.ip(&["addr", "add", &format!("{SITE6}/64"), "dev", "up0", "nodad"]);
        internet.ip(&["link", "set", "up0", "up"]);
        // A node forwards allowed traffic; in its own namespace, the test turns that on.
        node.sh("sysctl -qw net.ipv4.ip_forward=1 net.ipv6.conf.all.forwarding=1");
        let lab = Lab { node, internet };
        for a in [SITE, OTHER_SITE, UNNAMED_SITE] {
            for port in [80, 8080] {
                lab.serve_tcp(format!("{a}:{port}").parse().unwrap());
            }
        }
        lab.serve_tcp(format!("[{SITE6}]:80").parse().unwrap());
        let tls = tls_config();
        for a in [SITE, OTHER_SITE, UNNAMED_SITE] {
            lab.serve_https(format!("{a}:443").parse().unwrap(), tls.clone());
        }
        lab.serve_tcp(format!("{NODE_UPLINK}:2222").parse().unwrap());
        lab.serve_udp(format!("{SITE}:9999").parse().unwrap());
        lab.serve_dns(format!("{DNS}:53").parse().unwrap());
        lab
    }

    /// The node gains [`LATE_NODE`] on its uplink (after it started: its always-denied ranges
    /// do not name it), with a TCP server on port 443 that greets as the node.
    pub fn node_gains_an_address(&self) {
        self.node
            .ip(&["addr", "add", &format!("{LATE_NODE}/32"), "dev", "up0"]);
        self.serve_tcp(format!("{LATE_NODE}:443").parse().unwrap());
    }

    /// [`PRIVATE_SITES`] on the internet's side of the node (routed there by the node's
    /// default routes), each with a TCP server on port 80.
    pub fn add_private_sites(&self) {
        for a in PRIVATE_SITES {
            let cidr = format!("{a}/{}", if a.contains(':') { 128 } else { 32 });
            let mut args = vec!["addr", "add", &cidr, "dev", "up0"];
            if a.contains(':') {
                args.push("nodad");
            }
            self.internet.ip(&args);
            let addr: IpAddr = a.parse().unwrap();
            self.serve_tcp(SocketAddr::new(addr, 80));
        }
    }

    /// The node's configuration for this lab (its resolver, short TTLs).
    pub fn node_config(&self) -> String {
        format!("[node.network]\ndns_upstream = \"{DNS}\"\ndns_min_ttl = 1\n")
    }

    /// A TCP server that greets each connection with "hi\n", then echoes; on the node's
    /// uplink address it runs in the node's namespace.
    fn serve_tcp(&self, addr: SocketAddr) {
        let ns = if [NODE_UPLINK, LATE_NODE].contains(&addr.ip().to_string().as_str()) {
            &self.node
        } else {
            &self.internet
        };
        let l = ns.run(|| TcpListener::bind(addr).unwrap());
        std::thread::spawn(move || {
            for s in l.incoming().flatten() {
                std::thread::spawn(move || {
                    let mut s = s;
                    let _ = s.write_all(b"hi\n");
                    let mut buf = [0u8; 256];
                    while let Ok(n) = s.read(&mut buf) {
                        if n == 0 || s.write_all(&buf[..n]).is_err() {
                            break;
                        }
                    }
                });
            }
        });
    }

    /// An HTTPS site: after the handshake it says which address it is (`site <addr>`) and
    /// closes. Its certificate names every test name (the client does not check it: the
    /// point is which server names the node lets through).
    fn serve_https(&self, addr: SocketAddr, config: std::sync::Arc<rustls::ServerConfig>) {
        let l = self.internet.run(|| TcpListener::bind(addr).unwrap());
        std::thread::spawn(move || {
            for s in l.incoming().flatten() {
                let config = config.clone();
                std::thread::spawn(move || {
                    let _ = s.set_read_timeout(Some(std::time::Duration::from_secs(10)));
                    let Ok(conn) = rustls::ServerConnection::new(config) else {
                        return;
                    };
                    let mut tls = rustls::StreamOwned::new(conn, s);
                    let _ = tls.write_all(format!("site {addr}\n").as_bytes());
                    tls.conn.send_close_notify();
                    let _ = tls.flush();
                });
            }
        });
    }

    fn serve_udp(&self, addr: SocketAddr) {
        let s = self.internet.run(|| UdpSocket::bind(addr).unwrap());
        std::thread::spawn(move || {
            let mut buf = [0u8; 512];
            while let Ok((n, from)) = s.recv_from(&mut buf) {
                let _ = s.send_to(&buf[..n], from);
            }
        });
    }

    /// A DNS server for [`ZONE`] (A records; NXDOMAIN for other names).
    fn serve_dns(&self, addr: SocketAddr) {
        use hickory_proto::op::{Message, ResponseCode};
        use hickory_proto::rr::{Name, RData, Record, RecordType};
        let s = self.internet.run(|| UdpSocket::bind(addr).unwrap());
        std::thread::spawn(move || {
            let mut buf = [0u8; 4096];
            while let Ok((n, from)) = s.recv_from(&mut buf) {
                let Ok(q) = Message::from_vec(&buf[..n]) else {
                    continue;
                };
                let Some(query) = q.queries.first().cloned() else {
                    continue;
                };
                let mut m = Message::response(q.metadata.id, q.metadata.op_code);
                m.metadata.recursion_desired = q.metadata.recursion_desired;
                m.metadata.recursion_available = true;
                m.add_query(query.clone());
                let asked = query
                    .name()
                    .to_ascii()
                    .trim_end_matches('.')
                    .to_ascii_lowercase();
                match ZONE.iter().find(|(n, _, _)| *n == asked) {
                    Some((name, a, ttl)) => {
                        if query.query_type() == RecordType::A {
                            let ip: std::net::Ipv4Addr = a.parse().unwrap();
                            m.answers.push(Record::from_rdata(
                                Name::from_ascii(format!("{name}.")).unwrap(),
                                *ttl,
                                RData::A(ip.into()),
                            ));
                        }
                    }
                    None => m.metadata.response_code = ResponseCode::NXDomain,
                }
                if let Ok(b) = m.to_vec() {
                    let _ = s.send_to(&b, from);
                }
            }
        });
    }
}

/// A self-signed certificate for every name of [`ZONE`].
fn tls_config() -> std::sync::Arc<rustls::ServerConfig> {
    use rustls::pki_types::{PrivateKeyDer, PrivatePkcs8KeyDer};
    let names: Vec<String> = ZONE.iter().map(|(n, _, _)| n.to_string()).collect();
    let key = rcgen::KeyPair::generate().unwrap();
    let cert = rcgen::CertificateParams::new(names)
        .unwrap()
        .self_signed(&key)
        .unwrap();
    let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
    let cfg = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(
            vec![cert.der().clone()],
            PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der())),
        )
        .unwrap();
    std::sync::Arc::new(cfg)
}

/// Python for a sandbox: TLS to `host:443` with server name `name` (certificates not
/// checked); prints `site <the server's address>`, `reset`, `refused`, `timeout` or the
/// error.
pub fn tls_probe(host: &str, name: &str) -> String {
    format!(
        "import socket,ssl\nc=ssl.create_default_context(); c.check_hostname=False; c.verify_mode=ssl.CERT_NONE\ntry:\n    s=socket.create_connection(('{host}',443),4); t=c.wrap_socket(s,server_hostname='{name}'); print(t.recv(64).decode().strip())\nexcept ConnectionRefusedError: print('refused')\nexcept ConnectionResetError: print('reset')\nexcept socket.timeout: print('timeout')\nexcept ssl.SSLError as e: print('ssl', e.reason)\nexcept OSError as e: print(type(e).__name__, e.errno)\n"
    )
}

/// Python for a sandbox: an HTTP/1.0 request to `host:port` with `Host: name`; prints the
/// first line of the answer (the fake sites greet with `hi`), `reset`, `refused` or `timeout`.
pub fn http_probe(host: &str, port: u16, name: &str) -> String {
    format!(
        "import socket\ntry:\n    s=socket.create_connection(('{host}',{port}),4); s.sendall(b'GET / HTTP/1.0\\r\\nHost: {name}\\r\\n\\r\\n'); print(s.recv(64).decode().splitlines()[0])\nexcept ConnectionRefusedError: print('refused')\nexcept ConnectionResetError: print('reset')\nexcept socket.timeout: print('timeout')\nexcept (OSError, IndexError) as e: print(type(e).__name__)\n"
    )
}

/// Python for a sandbox: connects to `host:port` over TCP and prints `connected`,
/// `refused`, `timeout` or the error's name.
pub fn tcp_probe(host: &str, port: u16) -> String {
    let family = if host.parse::<IpAddr>().is_ok_and(|a| a.is_ipv6()) {
        "socket.AF_INET6"
    } else {
        "socket.AF_INET"
    };
    format!(
        "import socket\ns=socket.socket({family}); s.settimeout(3)\ntry:\n    s.connect(('{host}',{port})); print('connected', s.recv(3))\nexcept ConnectionRefusedError: print('refused')\nexcept socket.timeout: print('timeout')\nexcept OSError as e: print(type(e).__name__, e.errno)\n"
    )
}

/// Sends one ICMP (or ICMPv6) echo request to `dst` from inside the network namespace of the
/// sandbox whose init is `pid` (a raw socket: the test is root on the host; commands in the
/// sandbox hold no `CAP_NET_RAW`), and says what came back: `reply`, `unreachable <code>`
/// (3/13 is IPv4's "administratively prohibited", 1/1 IPv6's) or `timeout`.
pub fn icmp_probe(pid: i32, dst: &str) -> String {
    const CODE: &str = r#"
import socket, struct, sys
dst = sys.argv[1]
v6 = ':' in dst
def csum(b):
    if len(b) % 2: b += b'\0'
    s = sum(struct.unpack('!%dH' % (len(b) // 2), b))
    s = (s >> 16) + (s & 0xffff); s += s >> 16
    return ~s & 0xffff
if v6:
    s = socket.socket(socket.AF_INET6, socket.SOCK_RAW, socket.IPPROTO_ICMPV6)
    s.sendto(struct.pack('!BBHHH', 128, 0, 0, 0x5757, 1) + b'warren', (dst, 0))
else:
    s = socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP)
    h = struct.pack('!BBHHH', 8, 0, 0, 0x5757, 1) + b'warren'
    s.sendto(struct.pack('!BBHHH', 8, 0, csum(h), 0x5757, 1) + b'warren', (dst, 0))
s.settimeout(3)
try:
    while True:
        d, _ = s.recvfrom(2048)
        if not v6: d = d[(d[0] & 15) * 4:]
        t, c = d[0], d[1]
        if t in (0, 129): print('reply'); break
        if t in (3, 1): print('unreachable', c); break
except socket.timeout:
    print('timeout')
"#;
    let out = Command::new("nsenter")
        .arg(format!("--net=/proc/{pid}/ns/net"))
        .args(["--", "python3", "-c", CODE, dst])
        .output()
        .unwrap();
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout).trim(),
        String::from_utf8_lossy(&out.stderr).trim()
    )
}
