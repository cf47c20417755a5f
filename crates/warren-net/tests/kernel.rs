//! The interface, the firewall and the refused-packet log against the real kernel, in network
//! namespaces this test makes (a "node", a "sandbox" and an "internet" beyond the node). No
//! traffic leaves them; the root namespace is not touched. Needs root.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsFd;
use std::time::{Duration, Instant};

mod common;

use common::{Ns, is_root};
use warren_net::link::{Addressing, Links};
use warren_net::nflog::Reader;
use warren_net::nft::{Elements, Firewall, FirewallConfig, expand};
use warren_types::net::{Cidr, NetRule, NetworkPolicy, PortRange, Protocol};

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
        proxy_port: None,
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
        let to_internet: SocketAddr = "198.51.100.1:80".parse().unwrap();
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

        // A domain's resolved address opens a port for its TTL only (the policy allows
        // nothing else), survives a policy change that keeps it, and goes with one that does
        // not.
        let internet: IpAddr = "198.51.100.1".parse().unwrap();
        let http = [PortRange { lo: 80, hi: 80 }];
        fw.update(lease.index, 5, deny_all()).unwrap();
        assert_eq!(connect_from(&sbx, to_internet), Outcome::Refused);
        fw.allow_resolved(lease.index, "example.test", &[internet], &http, 2)
            .unwrap();
        assert_eq!(connect_from(&sbx, to_internet), Outcome::Connected);
        std::thread::sleep(Duration::from_millis(2500));
        assert_eq!(connect_from(&sbx, to_internet), Outcome::Refused);
        fw.allow_resolved(lease.index, "example.test", &[internet], &http, 60)
            .unwrap();
        fw.update_keeping(vec![(lease.index, 6, deny_all())], |_, d, p| {
            d == "example.test" && p == http[0]
        })
        .unwrap();
        assert_eq!(connect_from(&sbx, to_internet), Outcome::Connected);
        fw.update_keeping(vec![(lease.index, 7, deny_all())], |_, _, _| false)
            .unwrap();
        assert_eq!(connect_from(&sbx, to_internet), Outcome::Refused);

        // An address named after start (the cluster's, when the node joins): refused from
        // then on, whatever the policy allows.
        fw.update(lease.index, 8, expand(&allow.parse().unwrap()).unwrap())
            .unwrap();
        assert_eq!(connect_from(&sbx, to_internet), Outcome::Connected);
        let member = [Cidr::parse("198.51.100.1/32").unwrap()];
        assert!(fw.deny_also(&member));
        assert!(!fw.deny_also(&member), "nothing new the second time");
        fw.install().unwrap();
        assert_eq!(connect_from(&sbx, to_internet), Outcome::Refused);

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

/// The pools and a firewall configuration for tests that need no traffic.
fn config() -> (Addressing, FirewallConfig) {
    let addressing = Addressing::new(
        Cidr::parse("10.200.0.0/16").unwrap(),
        Cidr::parse("fd77:7761::/64").unwrap(),
    )
    .unwrap();
    let cfg = FirewallConfig {
        addressing,
        internal: vec![],
        exempt: vec![],
        log_group: 9,
        masquerade: false,
        proxy_port: None,
    };
    (addressing, cfg)
}

/// The sets and maps that hold per-sandbox (or per-policy) elements.
const PER_SANDBOX: [&str; 15] = [
    "src4", "src6", "gen", "live", "pol", "any4", "any6", "denyany4", "denyany6", "allow4",
    "allow6", "deny4", "deny6", "dyn4", "dyn6",
];

/// The elements of the per-sandbox sets as `nft -j` lists them, each as its JSON, sorted;
/// the time an element has left is taken out (returned apart, in seconds, per set).
fn listed(ns: &Ns) -> (BTreeMap<String, Vec<String>>, BTreeMap<String, Vec<u64>>) {
    let out = ns.sh("nft -j list table inet warren");
    let v: serde_json::Value = serde_json::from_str(&out).expect("nft -j output");
    let mut sets = BTreeMap::new();
    let mut timeouts: BTreeMap<String, Vec<u64>> = BTreeMap::new();
    for o in v["nftables"].as_array().unwrap() {
        let Some(s) = o.get("set").or_else(|| o.get("map")) else {
            continue;
        };
        let name = s["name"].as_str().unwrap().to_string();
        if !PER_SANDBOX.contains(&name.as_str()) {
            continue;
        }
        let mut elems: Vec<String> = Vec::new();
        for e in s["elem"].as_array().cloned().unwrap_or_default() {
            let mut e = e;
            if let Some(inner) = e.get_mut("elem").and_then(|i| i.as_object_mut()) {
                inner.remove("expires");
                if let Some(t) = inner.remove("timeout") {
                    timeouts
                        .entry(name.clone())
                        .or_default()
                        .push(t.as_u64().unwrap());
                }
            }
            elems.push(e.to_string());
        }
        elems.sort();
        sets.insert(name, elems);
    }
    (sets, timeouts)
}

fn rule(cidr: &str, ports: &str, p: Option<Protocol>) -> NetRule {
    NetRule {
        cidr: Some(cidr.into()),
        ports: Some(ports.into()),
        protocol: p,
        ..NetRule::default()
    }
}

fn policy(allow: Vec<NetRule>, deny: Vec<NetRule>) -> Elements {
    expand(
        &NetworkPolicy {
            allow,
            deny,
            ..NetworkPolicy::default()
        }
        .parse()
        .unwrap(),
    )
    .unwrap()
}

/// Whether the kernel is at least `major.minor`.
fn kernel_at_least(major: u32, minor: u32) -> bool {
    let r = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    let mut it = r
        .trim()
        .split(['.', '-'])
        .map(|x| x.parse::<u32>().unwrap_or(0));
    let (a, b) = (it.next().unwrap_or(0), it.next().unwrap_or(0));
    (a, b) >= (major, minor)
}

#[test]
fn elements_written_by_netlink_are_those_nft_writes_and_netlink_deletes_them() {
    if !is_root() {
        eprintln!("SKIP: needs root (network namespaces, nftables)");
        return;
    }
    let node = Ns::new("enc");
    let (addressing, cfg) = config();
    node.run(|| {
        let mut fw = Firewall::new(cfg);
        fw.install().unwrap();
        let rich = policy(
            vec![
                NetRule::cidr("198.51.100.0/24"),
                NetRule::cidr("2001:db8::/32"),
                NetRule::cidr("192.0.2.77"),
                rule("0.0.0.0/0", "443", Some(Protocol::Tcp)),
                rule("203.0.113.0/24", "1000-2000", None),
                rule("2001:db8:1::/48", "53", Some(Protocol::Udp)),
            ],
            vec![
                NetRule::cidr("192.0.2.128/25"),
                NetRule::cidr("2001:db8:ff::/48"),
                rule("198.51.100.0/24", "22", None),
                rule("2001:db8::/32", "25", Some(Protocol::Tcp)),
            ],
        );
        let (a, b) = (addressing.lease(2).unwrap(), addressing.lease(3).unwrap());
        fw.add(a, 7, rich).unwrap();
        fw.add(b, 0x7edc_ba98, policy(vec![], vec![])).unwrap();
        let https = [
            PortRange { lo: 443, hi: 443 },
            PortRange { lo: 8000, hi: 8080 },
        ];
        let addrs: Vec<IpAddr> = ["203.0.113.7", "2001:db8::7"]
            .iter()
            .map(|a| a.parse().unwrap())
            .collect();
        fw.allow_resolved(a.index, "example.test", &addrs, &https, 600)
            .unwrap();
        if kernel_at_least(6, 3) {
            assert_eq!(fw.destroys_elements(), Some(true));
        }
        let (by_netlink, t_netlink) = listed(&node);
        // What the kernel holds, read back: the interface, the mark in host order, a CIDR as
        // a prefix, ports as a range; the rules keyed by their policy's id, which each
        // interface maps to.
        let (pa, pb) = (fw.policy_id(a.index).unwrap(), fw.policy_id(b.index).unwrap());
        assert!(pa >= 0x8000_0000 && pb >= 0x8000_0000 && pa != pb);
        assert_eq!(
            by_netlink["gen"],
            vec![r#"["wv2",7]"#, r#"["wv3",2128394904]"#],
            "{by_netlink:#?}"
        );
        assert_eq!(
            by_netlink["pol"],
            vec![format!(r#"["wv2",{pa}]"#), format!(r#"["wv3",{pb}]"#)],
            "{by_netlink:#?}"
        );
        assert!(
            by_netlink["allow4"].contains(&format!(
                r#"{{"concat":[{pa},{{"prefix":{{"addr":"203.0.113.0","len":24}}}},"tcp",{{"range":[1000,2000]}}]}}"#
            )),
            "{by_netlink:#?}"
        );
        assert_eq!(by_netlink["dyn4"].len(), 2, "{by_netlink:#?}");
        assert_eq!(by_netlink["dyn6"].len(), 2, "{by_netlink:#?}");
        assert!(
            t_netlink.values().flatten().all(|t| *t == 600),
            "{t_netlink:?}"
        );
        for s in PER_SANDBOX {
            assert!(!by_netlink[s].is_empty(), "{s} is empty: {by_netlink:#?}");
        }

        // The same elements written by nft's own text (install() writes the whole table so).
        fw.install().unwrap();
        let (by_nft, t_nft) = listed(&node);
        assert_eq!(by_netlink, by_nft);
        // What was left of the resolved addresses' time, not their whole TTL again.
        assert!(
            t_nft.values().flatten().all(|t| (590..=600).contains(t)),
            "{t_nft:?}"
        );

        // Netlink deletes what nft's text added, to the last element.
        fw.remove_entry(a.index).unwrap();
        fw.remove_entry(b.index).unwrap();
        let (left, _) = listed(&node);
        assert!(left.values().all(Vec::is_empty), "{left:#?}");
        fw.remove().unwrap();
    });
}

#[test]
fn elements_gone_from_the_kernel_fail_no_change_and_a_refusal_changes_nothing() {
    if !is_root() {
        eprintln!("SKIP: needs root (network namespaces, nftables)");
        return;
    }
    let node = Ns::new("gone");
    let (addressing, cfg) = config();
    node.run(|| {
        let mut fw = Firewall::new(cfg);
        fw.install().unwrap();
        let lease = addressing.lease(2).unwrap();
        let allow = policy(
            vec![
                NetRule::cidr("198.51.100.0/24"),
                rule("0.0.0.0/0", "443", Some(Protocol::Tcp)),
            ],
            vec![],
        );
        fw.add(lease, 1, allow.clone()).unwrap();
        let http = [PortRange { lo: 80, hi: 80 }];
        let short: IpAddr = "203.0.113.1".parse().unwrap();
        let long: IpAddr = "203.0.113.2".parse().unwrap();
        fw.allow_resolved(lease.index, "a.test", &[short], &http, 1)
            .unwrap();
        fw.allow_resolved(lease.index, "b.test", &[long], &http, 600)
            .unwrap();
        // One resolved address times out; other elements vanish behind the firewall's back.
        std::thread::sleep(Duration::from_millis(1500));
        node.sh(
            "nft flush set inet warren any4; nft flush set inet warren dyn4; \
             nft flush map inet warren gen; nft flush set inet warren src6",
        );
        let (sets, _) = listed(&node);
        assert!(
            sets["any4"].is_empty() && sets["gen"].is_empty(),
            "{sets:#?}"
        );
        // Neither a policy change that drops them nor the removal fails on that.
        fw.update_keeping(vec![(lease.index, 2, allow.clone())], |_, _, _| false)
            .unwrap();
        fw.allow_resolved(lease.index, "b.test", &[long], &http, 600)
            .unwrap();
        fw.remove_entry(lease.index).unwrap();
        let (left, _) = listed(&node);
        assert!(left.values().all(Vec::is_empty), "{left:#?}");

        // A transaction the kernel refuses (an element that starts where one put there
        // behind the firewall's back starts, but ends elsewhere) changes nothing, and the
        // error says which set and element.
        fw.add(lease, 3, policy(vec![], vec![])).unwrap();
        // The sandbox's next policy gets the id its current one gives up.
        let id = fw.policy_id(lease.index).unwrap();
        node.sh(&format!(
            "nft add element inet warren any4 '{{ {id} . 10.0.0.0/16 }}'"
        ));
        let wide = policy(
            vec![
                NetRule::cidr("192.0.2.0/24"),
                NetRule::cidr("10.0.0.0/8"),
                NetRule::cidr("172.16.0.0/12"),
            ],
            vec![],
        );
        let err = fw.update(lease.index, 4, wide).unwrap_err().to_string();
        assert!(
            err.contains(&format!(
                "adding element {id} . 10.0.0.0/8 to set inet warren any4"
            )),
            "{err}"
        );
        assert_eq!(fw.generation(lease.index), Some(3));
        let (sets, _) = listed(&node);
        assert_eq!(sets["gen"], vec![r#"["wv2",3]"#], "{sets:#?}");
        assert_eq!(sets["any4"].len(), 1, "only the foreign one: {sets:#?}");
        fw.remove().unwrap();
    });
}

#[test]
fn a_policy_of_thousands_of_elements_goes_in_many_messages_of_one_transaction() {
    if !is_root() {
        eprintln!("SKIP: needs root (network namespaces, nftables)");
        return;
    }
    let node = Ns::new("big");
    let (addressing, cfg) = config();
    node.run(|| {
        let mut fw = Firewall::new(cfg);
        fw.install().unwrap();
        let lease = addressing.lease(2).unwrap();
        // 4000 /24s on a port each: 4000 elements of `allow4`, ~300 KiB, ten messages or so.
        let many: Vec<NetRule> = (0..4000)
            .map(|i| {
                rule(
                    &format!("10.{}.{}.0/24", i / 256, i % 256),
                    &(1 + i % 1000).to_string(),
                    Some(Protocol::Tcp),
                )
            })
            .collect();
        let t = Instant::now();
        fw.add(lease, 1, policy(many.clone(), vec![])).unwrap();
        eprintln!("4000 elements added in {:?}", t.elapsed());
        let (sets, _) = listed(&node);
        assert_eq!(sets["allow4"].len(), 4000);
        // An element far into the batch is refused: the error names it, and nothing changed.
        let id = fw.policy_id(lease.index).unwrap();
        node.sh(&format!(
            "nft add element inet warren any4 '{{ {id} . 10.15.0.0/24 }}'"
        ));
        let many_again = many.clone();
        let mut again = many;
        again.push(NetRule::cidr("10.15.0.0/16"));
        let err = fw
            .update(lease.index, 2, policy(again, vec![]))
            .unwrap_err()
            .to_string();
        assert!(err.contains(&format!("{id} . 10.15.0.0/16")), "{err}");
        let (sets, _) = listed(&node);
        assert_eq!(sets["gen"], vec![r#"["wv2",1]"#]);
        assert_eq!(sets["allow4"].len(), 4000);
        // A change that keeps most of the policy touches only what changed.
        node.sh(&format!(
            "nft delete element inet warren any4 '{{ {id} . 10.15.0.0/24 }}'"
        ));
        let mut plus = many_again;
        plus.push(NetRule::cidr("192.0.2.0/24"));
        let t = Instant::now();
        fw.update(lease.index, 3, policy(plus, vec![])).unwrap();
        eprintln!("4000 elements kept, 1 added in {:?}", t.elapsed());
        let (sets, _) = listed(&node);
        assert_eq!(sets["gen"], vec![r#"["wv2",3]"#]);
        assert_eq!(sets["allow4"].len(), 4000);
        assert_eq!(sets["any4"].len(), 1);
        let t = Instant::now();
        fw.remove_entry(lease.index).unwrap();
        eprintln!("4000 elements deleted in {:?}", t.elapsed());
        let (sets, _) = listed(&node);
        assert!(sets["allow4"].is_empty());
        fw.remove().unwrap();
    });
}

#[test]
fn flushing_an_address_deletes_its_connection_tracking_entries_only() {
    if !is_root() {
        eprintln!("SKIP: needs root (network namespaces, nftables, conntrack)");
        return;
    }
    // A "sandbox" at 10.77.0.1 / fd99::1 and a "node" at 10.77.0.2 / fd99::2 that tracks
    // connections (a rule that reads conntrack turns tracking on in its namespace).
    let sbx = Ns::new("cts");
    let node = Ns::new("ctn");
    let veth = format!("wct{}", std::process::id() % 100000);
    node.ip(&[
        "link", "add", &veth, "type", "veth", "peer", "name", "eth0", "netns", &sbx.name,
    ]);
    node.ip(&["addr", "add", "10.77.0.2/24", "dev", &veth]);
    node.ip(&["addr", "add", "fd99::2/64", "dev", &veth, "nodad"]);
    node.ip(&["link", "set", &veth, "up"]);
    sbx.ip(&["addr", "add", "10.77.0.1/24", "dev", "eth0"]);
    sbx.ip(&["addr", "add", "fd99::1/64", "dev", "eth0", "nodad"]);
    sbx.ip(&["link", "set", "eth0", "up"]);
    node.sh(
        "nft add table inet track && nft add chain inet track input '{ type filter hook input \
         priority 0; }' && nft add rule inet track input ct state established accept",
    );
    serve_in(&node, "10.77.0.2:8080".parse().unwrap());
    serve_in(&node, "[fd99::2]:8080".parse().unwrap());
    serve_in(&node, "127.0.0.1:8081".parse().unwrap());
    let open = |ns: &Ns, to: &str| {
        let to: SocketAddr = to.parse().unwrap();
        ns.run(move || {
            let mut s = TcpStream::connect_timeout(&to, Duration::from_secs(2)).unwrap();
            let mut b = [0u8; 3];
            s.read_exact(&mut b).unwrap();
            s
        })
    };
    let _v4 = open(&sbx, "10.77.0.2:8080");
    let _v6 = open(&sbx, "[fd99::2]:8080");
    let _local = open(&node, "127.0.0.1:8081");
    let tracked = |port: &str| {
        node.sh("cat /proc/net/nf_conntrack")
            .lines()
            .filter(|l| l.contains(&format!("dport={port} ")))
            .count()
    };
    assert_eq!(
        tracked("8080"),
        2,
        "{}",
        node.sh("cat /proc/net/nf_conntrack")
    );
    assert_eq!(tracked("8081"), 1);

    let sandbox: Vec<IpAddr> = ["10.77.0.1", "fd99::1"]
        .iter()
        .map(|a| a.parse().unwrap())
        .collect();
    let n = node.run(|| warren_net::conntrack::flush(&sandbox)).unwrap();
    assert_eq!(n, 2);
    assert_eq!(
        tracked("8080"),
        0,
        "{}",
        node.sh("cat /proc/net/nf_conntrack")
    );
    assert_eq!(tracked("8081"), 1, "another address's entry stays");
    assert_eq!(
        node.run(|| warren_net::conntrack::flush(&sandbox)).unwrap(),
        0
    );
}

#[test]
fn firewall_latency_by_netlink_against_nft() {
    if !is_root() {
        eprintln!("SKIP: needs root (network namespaces, nftables)");
        return;
    }
    let samples = std::env::var("WARREN_FIREWALL_SAMPLES")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(20);
    let population = std::env::var("WARREN_FIREWALL_SANDBOXES")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(500);
    let ns = Ns::new("lat");
    let rows = ns
        .run(|| warren_net::nft::measure::measure(samples, population))
        .unwrap();
    eprintln!("{}", warren_net::nft::measure::table(&rows));
    assert_eq!(rows.len(), 6);
}

#[test]
fn sandboxes_with_the_same_rules_share_them() {
    if !is_root() {
        eprintln!("SKIP: needs root (network namespaces, nftables)");
        return;
    }
    let node = Ns::new("shr");
    let (addressing, cfg) = config();
    node.run(|| {
        let mut fw = Firewall::new(cfg);
        fw.install().unwrap();
        let setup = policy(
            vec![
                NetRule::cidr("198.51.100.0/24"),
                rule("0.0.0.0/0", "443", Some(Protocol::Tcp)),
            ],
            vec![],
        );
        let agent = policy(
            vec![rule("203.0.113.0/24", "80", Some(Protocol::Tcp))],
            vec![],
        );
        let leases: Vec<_> = (2..12).map(|i| addressing.lease(i).unwrap()).collect();
        for (g, l) in leases.iter().enumerate() {
            fw.add(*l, g as u32 + 1, setup.clone()).unwrap();
        }
        // Ten sandboxes, one copy of their rules; each interface maps to the one id.
        let (sets, _) = listed(&node);
        assert_eq!(fw.policies(), 1);
        assert_eq!(sets["any4"].len(), 1, "{sets:#?}");
        assert_eq!(sets["allow4"].len(), 1, "{sets:#?}");
        assert_eq!(sets["pol"].len(), 10);
        let id = fw.policy_id(leases[0].index).unwrap();
        assert!(sets["pol"].iter().all(|p| p.ends_with(&format!(",{id}]"))));
        // The task moves to its next phase in one transaction: the new rules are written
        // once, and the old ones go with their last user.
        let updates = leases
            .iter()
            .enumerate()
            .map(|(g, l)| (l.index, 100 + g as u32, agent.clone()))
            .collect();
        fw.update_many(updates).unwrap();
        let (sets, _) = listed(&node);
        assert_eq!(fw.policies(), 1);
        assert!(sets["any4"].is_empty(), "{sets:#?}");
        assert_eq!(sets["allow4"].len(), 1, "{sets:#?}");
        assert!(sets["allow4"][0].contains("203.0.113.0"), "{sets:#?}");
        // One sandbox apart: a second policy; the shared one stays for the other nine.
        fw.update(leases[0].index, 200, setup.clone()).unwrap();
        assert_eq!(fw.policies(), 2);
        for l in &leases[1..] {
            fw.remove_entry(l.index).unwrap();
        }
        let (sets, _) = listed(&node);
        assert_eq!(fw.policies(), 1);
        assert_eq!(sets["allow4"].len(), 1, "{sets:#?}");
        assert!(sets["allow4"][0].contains("0.0.0.0"), "{sets:#?}");
        fw.remove_entry(leases[0].index).unwrap();
        let (left, _) = listed(&node);
        assert!(left.values().all(Vec::is_empty), "{left:#?}");
        assert_eq!(fw.policies(), 0);
        fw.remove().unwrap();
    });
}
