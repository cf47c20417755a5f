//! The interface, the firewall and the refused-packet log against the real kernel, in network
//! namespaces this test makes (a "node", a "sandbox" and an "internet" beyond the node). No
//! traffic leaves them; the root namespace is not touched. Needs root.

use std::io::{Read, Write};
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsFd;
use std::process::Command;
use std::time::{Duration, Instant};

use warren_net::link::{Addressing, Links};
use warren_net::nflog::Reader;
use warren_net::nft::{Firewall, FirewallConfig, expand};
use warren_types::net::{Cidr, NetRule, NetworkPolicy};

fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .map(|s| {
            s.lines()
                .any(|l| l.starts_with("Uid:") && l.split_whitespace().nth(1) == Some("0"))
        })
        .unwrap_or(false)
}

/// A network namespace made for this test, deleted when dropped.
struct Ns {
    name: String,
}

impl Ns {
    fn new(tag: &str) -> Ns {
        let name = format!("wnt-{}-{tag}", std::process::id());
        let _ = Command::new("ip").args(["netns", "del", &name]).status();
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

    fn sh(&self, cmd: &str) -> String {
        let out = Command::new("ip")
            .args(["netns", "exec", &self.name, "sh", "-c", cmd])
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    fn file(&self) -> std::fs::File {
        std::fs::File::open(format!("/run/netns/{}", self.name)).unwrap()
    }

    /// Runs `f` on a thread inside this namespace.
    fn run<T: Send>(&self, f: impl FnOnce() -> T + Send) -> T {
        let fd = self.file();
        std::thread::scope(|s| {
            s.spawn(move || {
                rustix::thread::move_into_link_name_space(
                    fd.as_fd(),
                    Some(rustix::thread::LinkNameSpaceType::Network),
                )
                .unwrap();
                f()
            })
            .join()
            .unwrap()
        })
    }
}

impl Drop for Ns {
    fn drop(&mut self) {
        let _ = Command::new("ip")
            .args(["netns", "del", &self.name])
            .status();
    }
}

/// What a connection attempt from the sandbox came to.
#[derive(Debug, PartialEq)]
enum Outcome {
    Connected,
    Refused,
    TimedOut,
    Other(String),
}

fn connect_from(ns: &Ns, to: SocketAddr) -> Outcome {
    ns.run(
        move || match TcpStream::connect_timeout(&to, Duration::from_secs(2)) {
            Ok(_) => Outcome::Connected,
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused => Outcome::Refused,
            Err(e) if e.kind() == std::io::ErrorKind::TimedOut => Outcome::TimedOut,
            Err(e) => Outcome::Other(e.to_string()),
        },
    )
}

/// A TCP server in `ns` on `addr` that answers every connection with "hi\n" then echoes.
fn serve_in(ns: &Ns, addr: SocketAddr) {
    let l = ns.run(|| TcpListener::bind(addr).unwrap());
    std::thread::spawn(move || {
        for s in l.incoming().flatten() {
            std::thread::spawn(move || {
                let mut s = s;
                let _ = s.write_all(b"hi\n");
                let mut buf = [0u8; 64];
                while let Ok(n) = s.read(&mut buf) {
                    if n == 0 || s.write_all(&buf[..n]).is_err() {
                        break;
                    }
                }
            });
        }
    });
}

#[test]
fn interface_firewall_and_log_in_namespaces_of_our_own() {
    if !is_root() {
        eprintln!("SKIP: needs root (network namespaces, nftables)");
        return;
    }
    let node = Ns::new("node");
    let sbx = Ns::new("sbx");
    let net = Ns::new("net");
    // The "internet": 198.51.100.1 beyond the node's uplink (198.51.100.2).
    let up = format!("wnu{}", std::process::id() % 100000);
    node.ip(&[
        "link", "add", &up, "type", "veth", "peer", "name", "up0", "netns", &net.name,
    ]);
    node.ip(&["addr", "add", "198.51.100.2/24", "dev", &up]);
    node.ip(&["link", "set", &up, "up"]);
    net.ip(&["addr", "add", "198.51.100.1/24", "dev", "up0"]);
    net.ip(&["link", "set", "up0", "up"]);
    node.sh("sysctl -qw net.ipv4.ip_forward=1");
    serve_in(&net, "198.51.100.1:80".parse().unwrap());
    serve_in(&node, "198.51.100.2:2222".parse().unwrap());

    let addressing = Addressing::new(
        Cidr::parse("10.200.0.0/16").unwrap(),
        Cidr::parse("fd77:7761::/64").unwrap(),
    )
    .unwrap();
    let lease = addressing.lease(2).unwrap();
    let sbx_fd = sbx.file();
    let cfg = FirewallConfig {
        addressing,
        internal: vec![Cidr::parse("198.51.100.2/32").unwrap()],
        exempt: vec![],
        log_group: 8,
        masquerade: true,
    };

    // The node's side runs on a thread in the node's namespace (nft and netlink act on the
    // namespace of the thread that calls them); the sandbox's on threads in its own.
    node.run(|| {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let mut fw = Firewall::new(cfg);
        fw.install().unwrap();
        let (reader, mut denials) = Reader::start(8, 1024).unwrap();
        let links = rt.block_on(async {
            let links = Links::new(addressing).unwrap();
            let t = Instant::now();
            links.attach(sbx_fd.as_fd(), &lease).await.unwrap();
            eprintln!("attach took {:?}", t.elapsed());
            links
        });
        let deny_all = || expand(&NetworkPolicy::default().parse().unwrap()).unwrap();
        let t = Instant::now();
        fw.add(lease, 1, deny_all()).unwrap();
        eprintln!("firewall add took {:?}", t.elapsed());

        // The sandbox sees its address and routes.
        let addrs = sbx.sh("ip -br addr show dev eth0");
        assert!(addrs.contains("10.200.0.2/32"), "{addrs}");
        assert!(addrs.contains("fd77:7761::2/128"), "{addrs}");
        let routes = sbx.sh("ip route");
        assert!(
            routes.contains("default via 10.200.0.1 dev eth0"),
            "{routes}"
        );

        // Default deny: the node, its uplink address, the internet — refused at once (a
        // reset, not a hang), and logged.
        let gw: SocketAddr = "10.200.0.1:22".parse().unwrap();
        assert_eq!(connect_from(&sbx, gw), Outcome::Refused);
        assert_eq!(
            connect_from(&sbx, "198.51.100.2:2222".parse().unwrap()),
            Outcome::Refused
        );
        assert_eq!(
            connect_from(&sbx, "198.51.100.1:80".parse().unwrap()),
            Outcome::Refused
        );
        let mut seen = Vec::new();
        let deadline = Instant::now() + Duration::from_secs(3);
        while seen.len() < 3 && Instant::now() < deadline {
            match denials.try_recv() {
                Ok(d) => seen.push(d),
                Err(_) => std::thread::sleep(Duration::from_millis(20)),
            }
        }
        let gw_ip: IpAddr = "10.200.0.1".parse().unwrap();
        assert!(
            seen.iter()
                .any(|d| d.dst == gw_ip && d.port == Some(22) && d.protocol == 6),
            "{seen:?}"
        );
        assert!(
            seen.iter().all(|d| d.src == IpAddr::V4(lease.v4)),
            "{seen:?}"
        );

        // The DNS port on the gateway is open (to the proxy; here a plain listener).
        serve_in(&node, "10.200.0.1:53".parse().unwrap());
        assert_eq!(
            connect_from(&sbx, "10.200.0.1:53".parse().unwrap()),
            Outcome::Connected
        );

        // Allow the internet's /24: connected; the node's uplink address stays denied (it is
        // internal).
        let allow = NetworkPolicy {
            allow: vec![NetRule::cidr("198.51.100.0/24")],
            ..NetworkPolicy::default()
        };
        fw.update(lease.index, 2, expand(&allow.parse().unwrap()).unwrap())
            .unwrap();
        assert_eq!(
            connect_from(&sbx, "198.51.100.1:80".parse().unwrap()),
            Outcome::Connected
        );
        assert_eq!(
            connect_from(&sbx, "198.51.100.2:2222".parse().unwrap()),
            Outcome::Refused
        );

        // A connection open across a change to deny-all is cut: its next packet is reset.
        let mut open = sbx.run(|| {
            let mut s = TcpStream::connect_timeout(
                &"198.51.100.1:80".parse().unwrap(),
                Duration::from_secs(2),
            )
            .unwrap();
            s.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
            let mut b = [0u8; 3];
            s.read_exact(&mut b).unwrap();
            s
        });
        fw.update(lease.index, 3, deny_all()).unwrap();
        let _ = open.write_all(b"after\n");
        let mut b = [0u8; 16];
        let r = open.read(&mut b);
        assert!(
            matches!(&r, Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset),
            "the cut connection read {r:?}"
        );
        // And allowed again, a new connection works (the generation moved on).
        fw.update(lease.index, 4, expand(&allow.parse().unwrap()).unwrap())
            .unwrap();
        assert_eq!(
            connect_from(&sbx, "198.51.100.1:80".parse().unwrap()),
            Outcome::Connected
        );

        // Gone: elements, interface (both ends), table.
        fw.remove_entry(lease.index).unwrap();
        let left = rt.block_on(async {
            links.detach(&lease).await.unwrap();
            links.existing().await.unwrap()
        });
        assert!(left.is_empty(), "{left:?}");
        let table = node.sh("nft list table inet warren");
        assert!(!table.contains("wv2"), "{table}");
        assert!(!sbx.sh("ip -br link").contains("eth0"));
        fw.remove().unwrap();
        assert!(node.sh("nft list tables").trim().is_empty());
        drop(reader);
    });
}
