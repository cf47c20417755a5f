//! `warren-bench network`'s third part: what checking names costs.
//!
//! - The firewall's writes by nf_tables netlink batches against the same transactions by
//!   `nft -f -` (as Warren wrote them before), with a table that already holds N sandboxes
//!   (`warren_net::nft::measure`; measured before the node starts: it installs a table of its
//!   own).
//! - The transparent proxy's cost per connection: a fake internet in a namespace of its own
//!   (an HTTPS site on a benchmarking address, RFC 2544, and a DNS server naming it), a node
//!   beside it, and two sandboxes — one allowed the site by its name (every connection to port
//!   443 goes through the proxy, which checks the TLS server name and dials the name) and one
//!   by its address (straight through the firewall). Each times connect + TLS handshake + one
//!   small request inside the sandbox (Python's `ssl`), the two arms interleaved.
//! - The DNS proxy's cost per query: the same two sandboxes, one asking the fake internet's DNS
//!   server itself (allowed by address), one asking its resolver (the node's proxy).

use std::io::{Read, Write};
use std::net::{TcpListener, UdpSocket};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use warren_node::{Node, NodeConfig};
use warren_types::ByteSize;
use warren_types::api::{CreateSandbox, ExecRequest};
use warren_types::net::{NetRule, NetworkPolicy};

use crate::Plan;
use crate::stats::Samples;

const CGROUP_PARENT: &str = "warren-bench-names";
/// The site and the node's uplink (RFC 2544's benchmarking range).
const SITE: &str = "198.18.0.1";
const UPLINK: &str = "198.18.0.2";
const NAME: &str = "site.bench";

/// The internet's namespace, deleted when dropped.
struct Internet(String);

impl Drop for Internet {
    fn drop(&mut self) {
        let _ = std::process::Command::new("ip")
            .args(["netns", "del", &self.0])
            .status();
    }
}

fn ip(args: &[&str]) -> Result<(), String> {
    let out = std::process::Command::new("ip")
        .args(args)
        .output()
        .map_err(|e| format!("ip: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "ip {args:?}: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

impl Internet {
    /// The namespace, its link to this one (the node's), and forwarding here.
    fn new() -> Result<Internet, String> {
        let name = format!("wbi-{}", std::process::id());
        let _ = ip(&["netns", "del", &name]);
        ip(&["netns", "add", &name])?;
        let i = Internet(name);
        let n = i.0.as_str();
        ip(&[
            "link", "add", "up0", "type", "veth", "peer", "name", "up0", "netns", n,
        ])?;
        ip(&["addr", "add", &format!("{UPLINK}/24"), "dev", "up0"])?;
        ip(&["link", "set", "up0", "up"])?;
        ip(&["route", "add", "default", "via", SITE])?;
        ip(&["-n", n, "addr", "add", &format!("{SITE}/24"), "dev", "up0"])?;
        ip(&["-n", n, "link", "set", "up0", "up"])?;
        ip(&["-n", n, "link", "set", "lo", "up"])?;
        // This namespace is the benchmark's own: forwarding here touches no one else's.
        std::fs::write("/proc/sys/net/ipv4/ip_forward", "1")
            .map_err(|e| format!("turning forwarding on: {e}"))?;
        Ok(i)
    }

    /// Runs `f` on a thread in the internet's namespace (its sockets are made there).
    fn spawn(&self, f: impl FnOnce() + Send + 'static) -> Result<(), String> {
        let ns = std::fs::File::open(format!("/run/netns/{}", self.0))
            .map_err(|e| format!("opening the namespace: {e}"))?;
        std::thread::spawn(move || {
            if rustix::thread::move_into_link_name_space(
                std::os::fd::AsFd::as_fd(&ns),
                Some(rustix::thread::LinkNameSpaceType::Network),
            )
            .is_ok()
            {
                f();
            }
        });
        Ok(())
    }
}

/// An HTTPS site on `SITE:443` whose certificate names [`NAME`]: each connection reads a
/// request head and answers a small page.
fn serve_https(net: &Internet) -> Result<(), String> {
    use rustls::pki_types::{PrivateKeyDer, PrivatePkcs8KeyDer};
    let key = rcgen::KeyPair::generate().map_err(|e| e.to_string())?;
    let cert = rcgen::CertificateParams::new(vec![NAME.to_string()])
        .and_then(|p| p.self_signed(&key))
        .map_err(|e| e.to_string())?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let cfg = Arc::new(
        rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| e.to_string())?
            .with_no_client_auth()
            .with_single_cert(
                vec![cert.der().clone()],
                PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der())),
            )
            .map_err(|e| e.to_string())?,
    );
    let (tx, rx) = std::sync::mpsc::channel();
    net.spawn(move || {
        let l = match TcpListener::bind((SITE, 443)) {
            Ok(l) => l,
            Err(e) => {
                let _ = tx.send(Err(format!("binding {SITE}:443: {e}")));
                return;
            }
        };
        let _ = tx.send(Ok(()));
        for s in l.incoming().flatten() {
            let cfg = cfg.clone();
            std::thread::spawn(move || {
                let _ = s.set_read_timeout(Some(Duration::from_secs(10)));
                let Ok(conn) = rustls::ServerConnection::new(cfg) else {
                    return;
                };
                let mut tls = rustls::StreamOwned::new(conn, s);
                let mut head = Vec::new();
                let mut buf = [0u8; 1024];
                while !head.windows(4).any(|w| w == b"\r\n\r\n") && head.len() < 16 << 10 {
                    match tls.read(&mut buf) {
                        Ok(0) | Err(_) => return,
                        Ok(n) => head.extend_from_slice(&buf[..n]),
                    }
                }
                let _ = tls.write_all(
                    b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok",
                );
                tls.conn.send_close_notify();
                let _ = tls.flush();
            });
        }
    })?;
    rx.recv_timeout(Duration::from_secs(5))
        .map_err(|_| "the HTTPS site did not start".to_string())?
}

/// A DNS server on `SITE:53` that answers [`NAME`] (A) and nothing else.
fn serve_dns(net: &Internet) -> Result<(), String> {
    use hickory_proto::op::{Message, ResponseCode};
    use hickory_proto::rr::{Name, RData, Record, RecordType};
    let (tx, rx) = std::sync::mpsc::channel();
    net.spawn(move || {
        let s = match UdpSocket::bind((SITE, 53)) {
            Ok(s) => s,
            Err(e) => {
                let _ = tx.send(Err(format!("binding {SITE}:53: {e}")));
                return;
            }
        };
        let _ = tx.send(Ok(()));
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
            let asked = query.name().to_ascii().trim_end_matches('.').to_string();
            if asked == NAME {
                if query.query_type() == RecordType::A
                    && let (Ok(name), Ok(a)) = (
                        Name::from_ascii(format!("{NAME}.")),
                        SITE.parse::<std::net::Ipv4Addr>(),
                    )
                {
                    m.answers
                        .push(Record::from_rdata(name, 300, RData::A(a.into())));
                }
            } else {
                m.metadata.response_code = ResponseCode::NXDomain;
            }
            if let Ok(b) = m.to_vec() {
                let _ = s.send_to(&b, from);
            }
        }
    })?;
    rx.recv_timeout(Duration::from_secs(5))
        .map_err(|_| "the DNS server did not start".to_string())?
}

/// Python for a sandbox: `n` HTTPS requests naming [`NAME`], each a new connection; prints
/// each one's milliseconds. With `resolve`, the address is looked up first (through the
/// node's DNS proxy, which opens it for the sandbox); else the site's address is dialled.
fn client(resolve: bool, n: usize) -> String {
    let host = if resolve {
        format!("socket.gethostbyname('{NAME}')")
    } else {
        format!("'{SITE}'")
    };
    format!(
        "import socket,ssl,time\nhost={host}\nc=ssl.create_default_context(); c.check_hostname=False; c.verify_mode=ssl.CERT_NONE\nout=[]\nfor i in range({n}):\n    t=time.perf_counter()\n    s=socket.create_connection((host,443),5); t2=c.wrap_socket(s,server_hostname='{NAME}')\n    t2.sendall(b'GET / HTTP/1.1\\r\\nHost: {NAME}\\r\\nConnection: close\\r\\n\\r\\n')\n    d=b''\n    while True:\n        b=t2.recv(4096)\n        if not b: break\n        d+=b\n    t2.close()\n    assert d.endswith(b'ok'), d\n    out.append((time.perf_counter()-t)*1000)\nprint(' '.join('%.4f' % x for x in out))\n"
    )
}

/// Python for a sandbox: `n` DNS queries for [`NAME`] (A, one UDP socket), each timed from
/// send to answer; prints each one's milliseconds. With `proxy` they go to the sandbox's
/// resolver (the node's DNS proxy, from `/etc/resolv.conf`), else straight to the fake
/// internet's DNS server.
fn dns_client(proxy: bool, n: usize) -> String {
    let server = if proxy {
        "[l.split()[1] for l in open('/etc/resolv.conf') if l.startswith('nameserver')][0]"
            .to_string()
    } else {
        format!("'{SITE}'")
    };
    format!(
        "import socket,struct,time,random\nserver={server}\nq=b''.join(bytes([len(p)])+p.encode() for p in '{NAME}'.split('.'))+b'\\0'+struct.pack('>HH',1,1)\ns=socket.socket(socket.AF_INET,socket.SOCK_DGRAM); s.settimeout(5)\nout=[]\nfor i in range({n}):\n    m=struct.pack('>HHHHHH',random.randint(0,65535),0x0100,1,0,0,0)+q\n    t=time.perf_counter(); s.sendto(m,(server,53)); d,_=s.recvfrom(1500)\n    out.append((time.perf_counter()-t)*1000)\n    assert d[:2]==m[:2] and d[3]&15==0 and d[6:8]!=b'\\0\\0', d\nprint(' '.join('%.4f' % x for x in out))\n"
    )
}

async fn run_client(
    node: &Arc<Node>,
    id: &warren_types::id::SandboxId,
    code: &str,
) -> Result<Vec<f64>, String> {
    let p = warren_node::exec::prepare(
        &ExecRequest {
            argv: Some(vec!["python3".into(), "-c".into(), code.into()]),
            timeout: Some(300.0),
            ..Default::default()
        },
        None,
    )
    .map_err(|e| e.to_string())?;
    let r = node.exec(id, p).await.map_err(|e| e.to_string())?;
    if r.status.exit_code != 0 {
        return Err(format!(
            "the client exited {}: {}",
            r.status.exit_code,
            crate::stats::short(&r.stderr, 300)
        ));
    }
    Ok(r.stdout
        .split_whitespace()
        .filter_map(|v| v.parse().ok())
        .collect())
}

/// The proxy's cost: per-connection times straight and through the proxy.
async fn proxy_cost(plan: &Plan, exe_dir: &Path, work: &Path) -> Result<Arms, String> {
    host_prepare()?;
    let net = Internet::new()?;
    serve_https(&net)?;
    serve_dns(&net)?;
    let mut cfg = NodeConfig {
        state_dir: work.join("node"),
        cgroup_parent: CGROUP_PARENT.into(),
        guest_binary: Some(exe_dir.join("warren-guest")),
        ..Default::default()
    };
    cfg.network.dns_upstream = Some(SITE.into());
    cfg.warm_pool = 2;
    let (node, _) = Node::start(cfg)
        .await
        .map_err(|e| format!("Node::start: {e}"))?;
    let r = measure_arms(plan, &node).await;
    let _ = node.kill_all().await;
    node.shutdown().await;
    node.remove_network_if_unused();
    node.unmount_disk_pool_if_unused();
    tokio::time::sleep(Duration::from_millis(300)).await;
    crate::host::remove_cgroup_parent(CGROUP_PARENT, true);
    drop(net);
    r
}

fn host_prepare() -> Result<(), String> {
    crate::host::preflight_cgroup_parent(CGROUP_PARENT).map_err(|e| format!("{e:#}"))
}

/// Per-connection (TLS) and per-query (DNS) times: (straight, proxied) each.
type Arms = ((Samples, Samples), (Samples, Samples));

async fn measure_arms(plan: &Plan, node: &Arc<Node>) -> Result<Arms, String> {
    let mk = |policy: NetworkPolicy| CreateSandbox {
        image: "host".into(),
        memory: Some(ByteSize(256 << 20)),
        network: Some(policy),
        ..Default::default()
    };
    let by_name = NetworkPolicy {
        allow: vec![NetRule::domain(NAME)],
        ..NetworkPolicy::default()
    };
    let by_address = NetworkPolicy {
        allow: vec![NetRule::cidr(&format!("{SITE}/32"))],
        ..NetworkPolicy::default()
    };
    let (named, _) = node
        .create(mk(by_name), None)
        .await
        .map_err(|e| format!("create: {e}"))?;
    let (direct, _) = node
        .create(mk(by_address), None)
        .await
        .map_err(|e| format!("create: {e}"))?;
    // The named arm resolves once (through the node's DNS proxy), which opens the address.
    let n = if plan.quick { 50 } else { 200 };
    let (mut straight, mut proxied) = (Samples::default(), Samples::default());
    // Warm both paths, then alternate rounds so drift hits both arms alike.
    run_client(node, &direct.id, &client(false, 5)).await?;
    run_client(node, &named.id, &client(true, 5)).await?;
    for _ in 0..4 {
        for ms in run_client(node, &direct.id, &client(false, n / 4)).await? {
            straight.push(Duration::from_secs_f64(ms / 1000.0));
        }
        for ms in run_client(node, &named.id, &client(true, n / 4)).await? {
            proxied.push(Duration::from_secs_f64(ms / 1000.0));
        }
    }
    // DNS: the address-allowed sandbox asks the fake internet's server itself; the other asks
    // its resolver, the node's proxy, which asks the same server (under its per-sandbox rate
    // of 200 a second with a burst of 400: these are fewer).
    let (mut dns_straight, mut dns_proxied) = (Samples::default(), Samples::default());
    run_client(node, &direct.id, &dns_client(false, 5)).await?;
    run_client(node, &named.id, &dns_client(true, 5)).await?;
    for _ in 0..4 {
        for ms in run_client(node, &direct.id, &dns_client(false, n / 4)).await? {
            dns_straight.push(Duration::from_secs_f64(ms / 1000.0));
        }
        for ms in run_client(node, &named.id, &dns_client(true, n / 4)).await? {
            dns_proxied.push(Duration::from_secs_f64(ms / 1000.0));
        }
    }
    Ok(((straight, proxied), (dns_straight, dns_proxied)))
}

/// Measures both and renders them as Markdown.
pub async fn part(plan: &Plan, exe_dir: &Path) -> String {
    let mut s = String::new();
    let population = if plan.quick { 100 } else { 500 };
    let samples = if plan.quick { 30 } else { 100 };
    eprintln!("warren-bench: network: firewall writes, {population} sandboxes in the table");
    match tokio::task::spawn_blocking(move || {
        warren_net::nft::measure::measure(samples, population)
    })
    .await
    {
        Ok(Ok(rows)) => {
            s.push_str(&format!(
                "Firewall changes, netlink batches against `nft -f -`, {population} sandboxes \
                 with 3 rules each in the table (medians):\n\n"
            ));
            s.push_str(&warren_net::nft::measure::table(&rows));
            s.push('\n');
        }
        Ok(Err(e)) => s.push_str(&format!("Firewall changes: not measured: {e}\n\n")),
        Err(e) => s.push_str(&format!("Firewall changes: not measured: {e}\n\n")),
    }
    eprintln!("warren-bench: network: the transparent proxy's cost per connection");
    let work = match tempfile::Builder::new()
        .prefix("warren-bench-names.")
        .tempdir()
    {
        Ok(w) => w,
        Err(e) => return format!("{s}Proxy cost: not measured: temp dir: {e}\n\n"),
    };
    match proxy_cost(plan, exe_dir, work.path()).await {
        Ok(((straight, proxied), (dns_straight, dns_proxied))) => {
            let (a, b) = (
                straight.pct(50.0).unwrap_or_default(),
                proxied.pct(50.0).unwrap_or_default(),
            );
            s.push_str(&format!(
                "Connect + TLS handshake + one small request from inside a sandbox ({} each, \
                 Python's ssl, the arms alternated):\n\n\
                 | path | p50 / p99 |\n|---|---|\n\
                 | allowed by address (straight through the firewall) | {} |\n\
                 | allowed by name (the transparent proxy checks the server name, dials the name) | {} |\n\n\
                 The proxy adds {} per connection at the median ({:.2}×).\n\n",
                straight.len(),
                straight.p50_p99(),
                proxied.p50_p99(),
                crate::stats::ms(b.saturating_sub(a)),
                b.as_secs_f64() / a.as_secs_f64().max(1e-9),
            ));
            let (a, b) = (
                dns_straight.pct(50.0).unwrap_or_default(),
                dns_proxied.pct(50.0).unwrap_or_default(),
            );
            s.push_str(&format!(
                "One DNS query (A) from inside a sandbox ({} each, the arms alternated):\n\n\
                 | path | p50 / p99 |\n|---|---|\n\
                 | straight to the DNS server (allowed by address) | {} |\n\
                 | through the node's DNS proxy (checks the name, asks upstream, opens the answer's addresses) | {} |\n\n\
                 The DNS proxy adds {} per query at the median ({:.2}×).\n\n",
                dns_straight.len(),
                dns_straight.p50_p99(),
                dns_proxied.p50_p99(),
                crate::stats::ms(b.saturating_sub(a)),
                b.as_secs_f64() / a.as_secs_f64().max(1e-9),
            ));
        }
        Err(e) => s.push_str(&format!("Proxy cost: not measured: {e}\n\n")),
    }
    s
}
