//! Sandbox networks against the real kernel: default deny, allow by CIDR, port and domain,
//! run-time changes for a sandbox and a task, the always-denied destinations, events, image
//! builds under a policy, and no leftovers. Each test runs its node in a network namespace of its own with a fake internet
//! beyond it (see `common::lab`); no traffic goes anywhere else.

mod common;

use std::time::{Duration, Instant};

use common::Platform;
use common::lab::{
    LATE_NODE, Lab, NODE_UPLINK, OTHER_SITE, PRIVATE_SITES, SITE, SITE6, UNNAMED_SITE, http_probe,
    icmp_probe, tcp_probe, tls_probe,
};
use warren_sdk::{
    CreateSandbox, EventFilter, EventKind, NetRule, NetworkMode, NetworkPolicy, Protocol, Sandbox,
    argv,
};

async fn py(sb: &Sandbox, code: &str) -> String {
    let r = sb.exec(&argv(["python3", "-c", code])).await.unwrap();
    format!("{}{}", r.stdout.trim(), r.stderr.trim())
}

/// Connects from the sandbox and says how it went (see `tcp_probe`).
async fn probe(sb: &Sandbox, host: &str, port: u16) -> String {
    py(sb, &tcp_probe(host, port)).await
}

async fn refused(sb: &Sandbox, host: &str, port: u16) {
    // "refused" is a reset (or an ICMP error) from the node; a connection left to hang would
    // end as "timeout" (the probe's own 3 s).
    assert_eq!(probe(sb, host, port).await, "refused", "{host}:{port}");
}

async fn connects(sb: &Sandbox, host: &str, port: u16) {
    assert_eq!(
        probe(sb, host, port).await,
        "connected b'hi\\n'",
        "{host}:{port}"
    );
}

fn create_req(task: Option<&str>, network: Option<NetworkPolicy>) -> CreateSandbox {
    CreateSandbox {
        image: "host".into(),
        task: task.map(str::to_string),
        network,
        ..Default::default()
    }
}

/// The pid of a sandbox's init, from its record.
fn init_pid(p: &Platform, id: &str) -> i32 {
    let rec = std::fs::read_to_string(p.state_dir().join("sandboxes").join(id).join("state.json"))
        .unwrap();
    let v: serde_json::Value = serde_json::from_str(&rec).unwrap();
    v["pid"].as_i64().unwrap() as i32
}

/// The sandbox's network events, once `done` holds for them (refused attempts are gathered
/// for a fraction of a second before they are stored, later on a loaded machine), or after
/// 15 s, whatever they are then (the caller's assertions say what is missing).
async fn network_events(
    p: &warren_sdk::Client,
    sb: &Sandbox,
    done: impl Fn(&[warren_sdk::Event]) -> bool,
) -> Vec<warren_sdk::Event> {
    let deadline = std::time::Instant::now() + Duration::from_secs(15);
    loop {
        let ev = p
            .events(&EventFilter {
                sandbox: Some(sb.id().to_string()),
                kind: Some(EventKind::Network),
                ..EventFilter::default()
            })
            .await
            .unwrap()
            .items;
        if done(&ev) || std::time::Instant::now() >= deadline {
            return ev;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[test]
fn deny_by_default_allow_by_cidr_and_port_and_change_at_run_time() {
    require_root!();
    let lab = Lab::new("a");
    let p = Platform::start_in(&lab.node.name, Some(&lab.node_config()));
    p.run(async || {
        let c = p.client();
        let sb = c.create(&create_req(None, None)).await.unwrap();
        let info = sb.network().await.unwrap();
        assert_eq!(info.mode, NetworkMode::Filtered);
        let gw = info.gateway.clone().unwrap();
        let other = c.create(&create_req(None, None)).await.unwrap();
        let other_ip = other.network().await.unwrap().ipv4.unwrap();

        // Deny by default: the internet (IPv4 and IPv6, TCP and UDP), the node (its gateway
        // address and its uplink), metadata, another sandbox.
        refused(&sb, SITE, 80).await;
        refused(&sb, SITE6, 80).await;
        refused(&sb, &gw, 22).await;
        refused(&sb, NODE_UPLINK, 2222).await;
        refused(&sb, "169.254.169.254", 80).await;
        refused(&sb, &other_ip, 22).await;
        let udp = format!(
            "import socket\ns=socket.socket(socket.AF_INET,socket.SOCK_DGRAM); s.settimeout(2)\ns.connect(('{SITE}',9999)); s.send(b'x')\ntry: print(s.recv(9))\nexcept OSError as e: print(type(e).__name__)\n"
        );
        let u = py(&sb, &udp).await;
        assert!(u.contains("Error") && !u.contains("timeout"), "UDP: {u}");
        // DNS-over-TLS and QUIC to a well-known resolver address: denied like the rest.
        refused(&sb, SITE, 853).await;
        // ICMP too, answered "administratively prohibited" (IPv4 3/13, IPv6 1/1).
        let pid = init_pid(&p, sb.id().as_str());
        assert_eq!(icmp_probe(pid, SITE), "unreachable 13");
        assert_eq!(icmp_probe(pid, SITE6), "unreachable 1");

        // Each refused attempt is an event: destination, protocol and port.
        let to = |ev: &[warren_sdk::Event], dst: &str| {
            ev.iter()
                .any(|e| e.network.as_ref().is_some_and(|n| n.destination == dst))
        };
        let ev = network_events(&c, &sb, |ev| {
            [gw.as_str(), "169.254.169.254", SITE6]
                .iter()
                .all(|d| to(ev, d))
        })
        .await;
        let on = |dst: &str| ev.iter().find(|e| e.network.as_ref().unwrap().destination == dst);
        let e = on(&gw).unwrap_or_else(|| panic!("no event for {gw}: {ev:#?}"));
        let n = e.network.as_ref().unwrap();
        assert_eq!((n.protocol.as_str(), n.ports.as_str()), ("tcp", "22"), "{e:?}");
        assert!(on("169.254.169.254").is_some() && on(SITE6).is_some(), "{ev:#?}");

        // A port scan of the node: one event with the ports it tried.
        py(
            &sb,
            &format!(
                "import socket\nfor p in range(1,301):\n    s=socket.socket(); s.settimeout(1)\n    try: s.connect(('{gw}',p))\n    except OSError: pass\n    s.close()\n"
            ),
        )
        .await;
        let ev = network_events(&c, &sb, |ev| {
            // Until the scan's last port is in (one event, updated as attempts come).
            ev.iter().any(|e| {
                e.network
                    .as_ref()
                    .is_some_and(|n| n.destination == gw && n.ports.ends_with("-300"))
                    && e.count >= 299
            })
        })
        .await;
        let scans: Vec<_> = ev
            .iter()
            .filter(|e| e.network.as_ref().unwrap().destination == gw)
            .collect();
        assert_eq!(scans.len(), 1, "{scans:#?}");
        let n = scans[0].network.as_ref().unwrap();
        // Port 53 is the resolver's (open to the sandbox); every other port is refused.
        assert_eq!(n.ports, "1-52,54-300", "{n:?}");
        assert!(scans[0].count >= 299, "{:?}", scans[0]);

        // Allow one address on one port: that port only; the rest stays denied.
        let allow80 = NetworkPolicy {
            allow: vec![NetRule {
                cidr: Some(format!("{SITE}/32")),
                ports: Some("80".into()),
                protocol: Some(Protocol::Tcp),
                ..NetRule::default()
            }],
            ..NetworkPolicy::default()
        };
        let t = Instant::now();
        sb.set_network(&allow80).await.unwrap();
        let took = t.elapsed();
        connects(&sb, SITE, 80).await;
        refused(&sb, SITE, 8080).await;
        refused(&sb, OTHER_SITE, 80).await;
        // The other sandbox's policy did not change.
        refused(&other, SITE, 80).await;
        eprintln!("policy change took {took:?}");

        // A whole CIDR (every port), with a deny rule that wins over it.
        let wide = NetworkPolicy {
            allow: vec![NetRule::cidr("198.51.100.0/24")],
            deny: vec![NetRule::cidr(&format!("{OTHER_SITE}/32"))],
            ..NetworkPolicy::default()
        };
        sb.set_network(&wide).await.unwrap();
        connects(&sb, SITE, 8080).await;
        connects(&sb, UNNAMED_SITE, 80).await;
        refused(&sb, OTHER_SITE, 80).await;
        // The node's own uplink address is inside the CIDR and still unreachable.
        refused(&sb, NODE_UPLINK, 2222).await;
        // A whole CIDR lets ICMP through; elsewhere it stays refused.
        assert_eq!(icmp_probe(pid, SITE), "reply");
        assert_eq!(icmp_probe(pid, SITE6), "unreachable 1");

        // A connection open across a change that no longer allows it is reset. The script
        // says when its connection is open (a file), and waits for the change (another).
        let code = format!(
            "import os,socket,time\ns=socket.create_connection(('{SITE}',80),3); s.recv(3)\nprint('open',flush=True)\nopen('/tmp/held-open','w').close()\nt=time.time()\nwhile not os.path.exists('/tmp/held-go') and time.time()-t<60: time.sleep(0.05)\ntry:\n    s.send(b'x'); s.settimeout(3); print('read', s.recv(9))\nexcept OSError as e: print(type(e).__name__)\n"
        );
        let held = tokio::spawn({
            let sb = sb.clone();
            async move { py(&sb, &code).await }
        });
        common::poll_until(
            Duration::from_secs(30),
            "the connection never opened",
            async || {
                let r = sb.exec(&argv(["test", "-e", "/tmp/held-open"])).await;
                match r.unwrap().status.exit_code {
                    0 => Ok(()),
                    _ if held.is_finished() => panic!("the script ended before it opened"),
                    _ => Err("no /tmp/held-open yet".into()),
                }
            },
        )
        .await;
        sb.set_network(&NetworkPolicy::default()).await.unwrap();
        sb.exec(&argv(["touch", "/tmp/held-go"])).await.unwrap();
        let out = held.await.unwrap();
        assert!(
            out.contains("open") && out.contains("ConnectionResetError"),
            "{out}"
        );

        // Bad input: 4xx with what was wrong, the sandbox's policy unchanged.
        for (bad, says) in [
            (NetRule::cidr("10.0.0.1/8"), "did you mean 10.0.0.0/8"),
            (NetRule::cidr(&format!("{gw}/32")), "no sandbox on this node may reach"),
            (NetRule::cidr("169.254.169.254"), "no sandbox on this node may reach"),
            (NetRule::domain("-bad-.com"), "not valid"),
            (
                NetRule {
                    ports: Some("70000".into()),
                    ..NetRule::default()
                },
                "1-65535",
            ),
        ] {
            let e = sb
                .set_network(&NetworkPolicy {
                    allow: vec![bad.clone()],
                    ..NetworkPolicy::default()
                })
                .await
                .unwrap_err();
            assert!(e.to_string().contains(says), "{bad:?}: {e}");
        }
        assert!(sb.network().await.unwrap().allow.is_empty());
    });
}

/// "The internet" (`0.0.0.0/0` and `::/0`, E2B's `allow_internet_access`) is public unicast
/// only: private, shared and unique-local hosts beyond the node stay refused (each attempt a
/// `network` event) until the node's operator exempts their range (security review, issue 29).
#[test]
fn the_internet_is_public_addresses_only_until_the_node_exempts_a_range() {
    require_root!();
    let lab = Lab::new("p");
    lab.add_private_sites();
    let internet = NetworkPolicy::internet();
    let office = NetworkPolicy {
        allow: vec![NetRule::domain("office.host.test")],
        ..NetworkPolicy::default()
    };
    let resolve = |host: &str| {
        format!(
            "import socket\ntry: print(socket.gethostbyname('{host}'))\nexcept OSError as e: print('fail', e.errno)\n"
        )
    };
    {
        let p = Platform::start_in(&lab.node.name, Some(&lab.node_config()));
        p.run(async || {
            let c = p.client();
            let sb = c
                .create(&create_req(None, Some(internet.clone())))
                .await
                .unwrap();
            connects(&sb, SITE, 80).await;
            connects(&sb, SITE6, 80).await;
            for a in PRIVATE_SITES {
                refused(&sb, a, 80).await;
            }
            let ev = network_events(&c, &sb, |ev| {
                PRIVATE_SITES.iter().all(|a| {
                    ev.iter()
                        .any(|e| e.network.as_ref().is_some_and(|n| n.destination == *a))
                })
            })
            .await;
            for a in PRIVATE_SITES {
                assert!(
                    ev.iter()
                        .any(|e| e.network.as_ref().is_some_and(|n| n.destination == *a)),
                    "no network event for {a}: {ev:#?}"
                );
            }
            // Naming a private range in a rule is a 400 that says how to open it.
            let e = sb
                .set_network(&NetworkPolicy {
                    allow: vec![NetRule::cidr("10.99.0.0/16")],
                    ..NetworkPolicy::default()
                })
                .await
                .unwrap_err();
            let m = e.to_string();
            assert!(
                m.contains("no sandbox on this node may reach") && m.contains("exempt"),
                "{m}"
            );
            sb.kill().await.unwrap();
            // An allowed name that resolves to a private address: the DNS proxy drops it.
            let named = c
                .create(&create_req(None, Some(office.clone())))
                .await
                .unwrap();
            assert!(
                py(&named, &resolve("office.host.test"))
                    .await
                    .starts_with("fail")
            );
            named.kill().await.unwrap();
        });
    }
    // The operator opens two ranges: those hosts are reachable, the rest of the private space
    // still is not.
    let cfg = format!(
        "{}exempt = [\"10.99.0.0/16\", \"fc00::7:0/112\"]\n",
        lab.node_config()
    );
    let p = Platform::start_in(&lab.node.name, Some(&cfg));
    p.run(async || {
        let c = p.client();
        let sb = c
            .create(&create_req(None, Some(internet.clone())))
            .await
            .unwrap();
        connects(&sb, "10.99.0.1", 80).await;
        connects(&sb, "fc00::7:1", 80).await;
        for a in ["172.20.0.1", "192.168.77.1", "100.64.7.1"] {
            refused(&sb, a, 80).await;
        }
        // A rule may name the exempt range now, and only its hosts.
        sb.set_network(&NetworkPolicy {
            allow: vec![NetRule::cidr("10.99.0.0/16")],
            ..NetworkPolicy::default()
        })
        .await
        .unwrap();
        connects(&sb, "10.99.0.1", 80).await;
        refused(&sb, SITE, 80).await;
        sb.kill().await.unwrap();
        // The DNS proxy answers the exempt address, and the transparent proxy (port 80 of a
        // name) dials it: the exemption is cut out of 10.0.0.0/8 for both.
        let named = c
            .create(&create_req(None, Some(office.clone())))
            .await
            .unwrap();
        assert_eq!(py(&named, &resolve("office.host.test")).await, "10.99.0.1");
        assert_eq!(
            py(
                &named,
                &http_probe("office.host.test", 80, "office.host.test")
            )
            .await,
            "hi"
        );
        named.kill().await.unwrap();
    });
}

#[test]
fn a_task_changes_phase_and_domains_resolve_through_the_node() {
    require_root!();
    let lab = Lab::new("b");
    let p = Platform::start_in(&lab.node.name, Some(&lab.node_config()));
    p.run(async || {
        let c = p.client();
        let setup = NetworkPolicy {
            allow: vec![
                NetRule::domain("pypi.test"),
                NetRule::domain("*.host.test"),
            ],
            ..NetworkPolicy::default()
        };
        let a = c.create(&create_req(Some("t"), Some(setup.clone()))).await.unwrap();
        let b = c.create(&create_req(Some("t"), None)).await.unwrap();
        let outsider = c.create(&create_req(None, Some(setup.clone()))).await.unwrap();
        let loopback_only = c
            .create(&create_req(Some("t"), Some(NetworkPolicy::none())))
            .await
            .unwrap();

        // Names resolve through the node's proxy, the sandbox's only resolver.
        let resolve = |host: &str| {
            format!(
                "import socket\ntry: print(socket.gethostbyname('{host}'))\nexcept OSError as e: print('fail', e.errno)\n"
            )
        };
        assert_eq!(py(&a, &resolve("pypi.test")).await, SITE);
        // Port 80 of a name allowed by domain goes through the node's transparent proxy,
        // which passes a request for that name on (the site greets with `hi`).
        assert_eq!(py(&a, &http_probe("pypi.test", 80, "pypi.test")).await, "hi");
        // Wildcards: names under the suffix (not the suffix itself).
        assert_eq!(py(&a, &resolve("a.b.host.test")).await, OTHER_SITE);
        connects(&a, OTHER_SITE, 8080).await;
        // Not allowed: refused by the resolver, and recorded.
        assert!(py(&a, &resolve("other.test")).await.starts_with("fail"));
        assert!(py(&a, &resolve("host.test")).await.starts_with("fail"));
        // An address that no allowed name resolved to stays denied, at once (no proxy).
        refused(&a, UNNAMED_SITE, 80).await;
        refused(&a, UNNAMED_SITE, 443).await;

        // TLS and HTTP to a name's address are judged by the name they ask for: another site
        // on the same address (other.test is files.host.test's address too, as on a CDN) is
        // reset, or answered 403; a connection to another allowed name's address still
        // reaches the name asked for, dialled by the node (so /etc/hosts tricks gain nothing).
        assert_eq!(py(&a, &resolve("files.host.test")).await, OTHER_SITE);
        assert_eq!(py(&a, &resolve("pypi.test")).await, SITE);
        let other_tls = format!("site {OTHER_SITE}:443");
        assert_eq!(
            py(&a, &tls_probe("files.host.test", "files.host.test")).await,
            other_tls
        );
        assert_eq!(py(&a, &tls_probe(OTHER_SITE, "other.test")).await, "reset");
        assert_eq!(
            py(&a, &http_probe(OTHER_SITE, 80, "other.test")).await,
            "HTTP/1.1 403 Forbidden"
        );
        assert_eq!(
            py(&a, &http_probe(OTHER_SITE, 80, "files.host.test")).await,
            "hi"
        );
        assert_eq!(py(&a, &tls_probe(SITE, "files.host.test")).await, other_tls);
        // No name at all (an address as the server name) is refused too.
        assert_eq!(py(&a, &tls_probe(OTHER_SITE, OTHER_SITE)).await, "reset");
        // An allowed name that resolves to an address the node gained after it started (not
        // in the always-denied ranges it knew): the proxy's own connection to the node itself
        // is refused by the firewall, so the sandbox gets a reset, never the node's service.
        lab.node_gains_an_address();
        assert_eq!(py(&a, &resolve("late.host.test")).await, LATE_NODE);
        assert_eq!(
            py(&a, &tls_probe("late.host.test", "late.host.test")).await,
            "reset"
        );
        // An allowed name that answers with the node's address: the answer is dropped.
        assert!(py(&a, &resolve("rebind.host.test")).await.starts_with("fail"));
        let ev = network_events(&c, &a, |ev| {
            let named = |d: &str| {
                ev.iter()
                    .any(|e| e.network.as_ref().and_then(|n| n.domain.as_deref()) == Some(d))
            };
            named("other.test") && named("rebind.host.test")
        })
        .await;
        let domains: Vec<String> = ev
            .iter()
            .filter_map(|e| e.network.as_ref().and_then(|n| n.domain.clone()))
            .collect();
        assert!(domains.contains(&"other.test".to_string()), "{ev:#?}");
        assert!(
            ev.iter().any(|e| e
                .network
                .as_ref()
                .is_some_and(|n| n.protocol == "tls" && n.domain.as_deref() == Some("other.test"))),
            "{ev:#?}"
        );
        assert!(domains.contains(&"rebind.host.test".to_string()), "{ev:#?}");
        // /etc/hosts in the sandbox changes nothing: names are not what the firewall checks.
        // (The host image's /etc is read-only; the address behind a name is what counts.)

        // TTL: pypi.test's answer lives 2 s (+5 s of grace); past it, a new connection to its
        // address without a new lookup is refused.
        tokio::time::sleep(Duration::from_secs(8)).await;
        refused(&a, SITE, 80).await;
        assert_eq!(py(&a, &http_probe("pypi.test", 80, "pypi.test")).await, "hi");

        // The task moves to its agent phase: nothing reachable, for every sandbox of the
        // task on every node, in one request; the sandbox outside the task keeps its policy.
        // (The loopback-only sandbox of the task takes `none` as it is.)
        let r = c.set_task_network("t", &NetworkPolicy::none()).await.unwrap();
        assert_eq!((r.succeeded, r.failed.len()), (3, 0), "{r:?}");
        assert!(py(&a, &resolve("pypi.test")).await.starts_with("fail"));
        refused(&a, SITE, 80).await;
        assert_eq!(
            py(&outsider, &http_probe("pypi.test", 80, "pypi.test")).await,
            "hi"
        );

        // Back to a setup phase for the task: both sandboxes reach the site.
        let open = NetworkPolicy {
            allow: vec![NetRule::cidr(&format!("{SITE}/32"))],
            ..NetworkPolicy::default()
        };
        let t = Instant::now();
        let r = c.set_task_network("t", &open).await.unwrap();
        eprintln!("task policy change took {:?}", t.elapsed());
        assert_eq!(r.succeeded, 2);
        // The loopback-only sandbox has no interface to filter: listed as failed, with why.
        assert_eq!(r.failed.len(), 1, "{r:?}");
        assert_eq!(r.failed[0].id.to_string(), loopback_only.id().to_string());
        assert!(r.failed[0].error.message.contains("no network interface"));
        connects(&a, SITE, 80).await;
        connects(&b, SITE, 80).await;

        // Loopback only: no interface, no route, nothing but lo.
        let ifs = py(&loopback_only, "import os; print(sorted(os.listdir('/sys/class/net')))").await;
        let routes = py(&loopback_only, "print(len(open('/proc/net/route').read().splitlines()))").await;
        assert_eq!(routes, "1", "{ifs}");
        assert!(loopback_only.network().await.unwrap().ipv4.is_none());
    });
}

#[test]
fn nothing_is_left_after_kills_and_a_daemon_crash() {
    require_root!();
    let lab = Lab::new("c");
    let mut p = Platform::start_in(&lab.node.name, Some(&lab.node_config()));
    let policy = NetworkPolicy {
        allow: vec![NetRule::cidr(&format!("{SITE}/32"))],
        ..NetworkPolicy::default()
    };
    let ids: Vec<String> = p.run(async || {
        let c = p.client();
        let mut ids = Vec::new();
        for _ in 0..3 {
            let sb = c
                .create(&create_req(None, Some(policy.clone())))
                .await
                .unwrap();
            connects(&sb, SITE, 80).await;
            ids.push(sb.id().to_string());
        }
        ids
    });
    // A second node in the same namespace is refused at start, with why (it would replace the
    // first one's firewall table).
    let second = tempfile::tempdir().unwrap();
    let out = std::process::Command::new("nsenter")
        .arg(format!("--net=/run/netns/{}", lab.node.name))
        .arg("--")
        .arg(common::warren_bin())
        .args([
            "up",
            "--listen",
            "127.0.0.1:1",
            "--cgroup-parent",
            "warren-test-second",
        ])
        .arg("--data-dir")
        .arg(second.path())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("another Warren node"),
        "{err}"
    );
    let cg = warren_node::container::cgroups::Cgroups::new("warren-test-second").unwrap();
    assert!(cg.existing().is_empty());
    let _ = cg.remove_all();
    // A crash: the sandboxes keep running, their interfaces and firewall too.
    p.kill9();
    p.start_again();
    p.run(async || {
        let c = p.client();
        for id in &ids {
            let sb = c.sandbox(id).unwrap();
            // Adopted with its policy; a connection still works, the rest is still denied.
            connects(&sb, SITE, 80).await;
            refused(&sb, OTHER_SITE, 80).await;
            assert_eq!(sb.network().await.unwrap().allow, policy.allow);
        }
        for id in &ids {
            c.sandbox(id).unwrap().kill().await.unwrap();
        }
    });
    // Every interface left belongs to a warm init, every element of the table too.
    let links = lab.node.sh("ip -o link show");
    let table = lab.node.sh("nft list table inet warren");
    for id in &ids {
        assert!(!p.leftovers().iter().any(|l| l.contains(id)));
    }
    let allow_elements = table.matches("198.51.100.1").count();
    assert_eq!(allow_elements, 0, "{table}");
    // Stopped for good (sandboxes killed): no interface, no table.
    p.stop();
    let links_after = lab.node.sh("ip -o link show");
    assert!(
        !links_after.contains(" wv"),
        "before: {links}\nafter: {links_after}"
    );
    assert!(lab.node.sh("nft list tables").trim().is_empty());
}

/// An HTTP/1.0 GET of `/` on `addr` with `host`, from the calling thread's namespace: the
/// status line, or what went wrong.
fn http_get(addr: &str, host: &str) -> String {
    http_get_with(addr, host, "")
        .lines()
        .next()
        .unwrap_or("")
        .to_string()
}

/// The same with more header lines (each ending in CRLF): the whole answer.
fn http_get_with(addr: &str, host: &str, headers: &str) -> String {
    use std::io::{Read, Write};
    let mut s = match std::net::TcpStream::connect(addr) {
        Ok(s) => s,
        Err(e) => return format!("connect: {:?}", e.kind()),
    };
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let _ = s.write_all(format!("GET / HTTP/1.0\r\nHost: {host}\r\n{headers}\r\n").as_bytes());
    let mut out = Vec::new();
    match s.read_to_end(&mut out) {
        Ok(_) => String::from_utf8_lossy(&out).into_owned(),
        Err(e) => format!("read: {:?}", e.kind()),
    }
}

/// A server on `port` of the sandbox that answers each request with the request itself.
async fn serve_echo(sb: &Sandbox, port: u16) {
    let code = format!(
        "import socket\ns=socket.socket(); s.setsockopt(socket.SOL_SOCKET,socket.SO_REUSEADDR,1)\ns.bind(('0.0.0.0',{port})); s.listen()\nwhile True:\n    c,_=s.accept(); d=b''\n    while b'\\r\\n\\r\\n' not in d:\n        b=c.recv(4096)\n        if not b: break\n        d+=b\n    c.sendall(b'HTTP/1.0 200 OK\\r\\n\\r\\n'+d); c.close()\n"
    );
    sb.start_process(&argv(["python3", "-c", &code]))
        .await
        .unwrap();
}

/// Starts an HTTP server on `port` (all addresses) in the sandbox and waits until it answers.
async fn serve_http(sb: &Sandbox, port: u16) {
    sb.start_process(&argv([
        "python3",
        "-m",
        "http.server",
        &port.to_string(),
        "--bind",
        "0.0.0.0",
    ]))
    .await
    .unwrap();
    let wait = format!(
        "import socket,time\nfor _ in range(100):\n    try: socket.create_connection(('127.0.0.1',{port}),1); print('up'); break\n    except OSError: time.sleep(0.1)\n"
    );
    assert_eq!(py(sb, &wait).await, "up");
}

#[test]
fn exposed_ports_are_reachable_from_the_host_and_through_the_control_plane() {
    require_root!();
    let lab = Lab::new("e");
    let cfg = format!(
        "{}expose_ports = \"28100-28109\"\n\n[control]\nsandbox_domain = \"sb.test\"\n",
        lab.node_config()
    );
    let mut p = Platform::start_in(&lab.node.name, Some(&cfg));
    let exposing = NetworkPolicy {
        expose: vec![8000],
        ..NetworkPolicy::default()
    };
    let (id, host) = p.run(async || {
        let c = p.client();
        let sb = c
            .create(&create_req(None, Some(exposing.clone())))
            .await
            .unwrap();
        serve_http(&sb, 8000).await;
        serve_http(&sb, 8001).await;
        let st = sb.network().await.unwrap();
        assert_eq!(st.exposed.len(), 1, "{st:?}");
        assert_eq!(st.exposed[0].port, 8000);
        let host = st.exposed[0].host.clone();
        assert!(host.starts_with("127.0.0.1:281"), "{host}");
        let ip = st.ipv4.clone().unwrap();

        // From the node's host: the exposed port through its host port, and straight to the
        // sandbox's address; a port it does not expose is refused, not left to hang.
        let (h, ip2) = (host.clone(), ip.clone());
        let (via_host, direct, closed) = tokio::task::spawn_blocking(move || {
            (
                http_get(&h, "x"),
                http_get(&format!("{ip2}:8000"), "x"),
                http_get(&format!("{ip2}:8001"), "x"),
            )
        })
        .await
        .unwrap();
        assert!(via_host.contains(" 200 "), "{via_host}");
        assert!(direct.contains(" 200 "), "{direct}");
        assert!(closed.starts_with("connect:"), "{closed}");

        // Through the control plane: the host route, and a TCP stream from the SDK.
        let cp = p.url.trim_start_matches("http://").to_string();
        let (cp2, id2) = (cp.clone(), sb.id().to_string());
        let (routed, not_exposed, unknown) = tokio::task::spawn_blocking(move || {
            (
                http_get(&cp2, &format!("8000-{id2}.sb.test")),
                http_get(&cp2, &format!("8001-{id2}.SB.test:80")),
                http_get(&cp2, "8000-aaaaaaaaaaaaaaaaaaaa.sb.test"),
            )
        })
        .await
        .unwrap();
        assert!(routed.contains(" 200 "), "{routed}");
        assert!(not_exposed.contains(" 404 "), "{not_exposed}");
        assert!(unknown.contains(" 404 "), "{unknown}");
        {
            use tokio::io::{AsyncReadExt, AsyncWriteExt};
            let mut s = sb.connect_port(8000).await.unwrap();
            s.write_all(b"GET / HTTP/1.0\r\n\r\n").await.unwrap();
            let mut out = Vec::new();
            s.read_to_end(&mut out).await.unwrap();
            assert!(
                out.starts_with(b"HTTP/1.0 200"),
                "{:?}",
                &out[..20.min(out.len())]
            );
        }
        let e = sb.connect_port(8001).await.unwrap_err();
        assert!(e.to_string().contains("not exposed"), "{e}");

        // A paused sandbox (its task preempted, say) is not thawed by whoever knows its
        // address: the key-less route answers 409; the authenticated stream resumes it.
        sb.pause().await.unwrap();
        let (cp2, id2) = (cp.clone(), sb.id().to_string());
        let paused =
            tokio::task::spawn_blocking(move || http_get(&cp2, &format!("8000-{id2}.sb.test")))
                .await
                .unwrap();
        assert!(paused.contains(" 409 "), "{paused}");
        assert_eq!(
            sb.info().await.unwrap().state,
            warren_sdk::SandboxState::Paused
        );
        drop(sb.connect_port(8000).await.unwrap());
        assert_eq!(
            sb.info().await.unwrap().state,
            warren_sdk::SandboxState::Running
        );

        // Bad input: loopback-only sandboxes and too many ports are refused, the policy kept.
        for bad in [
            NetworkPolicy {
                expose: vec![8000],
                ..NetworkPolicy::none()
            },
            NetworkPolicy {
                expose: (1..=33).collect(),
                ..NetworkPolicy::default()
            },
        ] {
            let e = sb.set_network(&bad).await.unwrap_err();
            assert!(e.to_string().contains("expose"), "{e}");
        }
        assert_eq!(sb.network().await.unwrap().exposed.len(), 1);

        // Unexposed: the host port closes, and so does a stream open to it through the API;
        // exposed again: a host port of the range.
        let mut open = sb.connect_port(8000).await.unwrap();
        let st = sb.expose(&[]).await.unwrap();
        assert!(st.exposed.is_empty());
        {
            use tokio::io::AsyncReadExt;
            let mut buf = [0u8; 16];
            let r = tokio::time::timeout(Duration::from_secs(5), open.read(&mut buf))
                .await
                .expect("the stream ends with its port, not left open");
            assert!(matches!(r, Ok(0) | Err(_)), "{r:?}");
        }
        let h = host.clone();
        let gone = tokio::task::spawn_blocking(move || http_get(&h, "x"))
            .await
            .unwrap();
        assert!(gone.starts_with("connect:"), "{gone}");
        let st = sb.expose(&[8000, 8002]).await.unwrap();
        assert_eq!(st.exposed.len(), 2, "{st:?}");
        // The host route passes headers on, but never a Warren API key: the agent is
        // untrusted.
        serve_echo(&sb, 8002).await;
        let (cp2, id2, key) = (cp.clone(), sb.id().to_string(), p.key.clone());
        let echoed = tokio::task::spawn_blocking(move || {
            let host = format!("8002-{id2}.sb.test");
            let mut last = String::new();
            // The server may take a moment to listen.
            for _ in 0..50 {
                last = http_get_with(
                    &cp2,
                    &host,
                    &format!("Authorization: Basic Zm9v\r\nAuthorization: bearer {key}\r\nX-API-Key: {key}\r\nX-Mine: 1\r\n"),
                );
                if last.contains(" 200 ") {
                    break;
                }
                std::thread::sleep(Duration::from_millis(100));
            }
            last
        })
        .await
        .unwrap();
        assert!(
            echoed.contains(" 200 ") && echoed.contains("x-mine: 1"),
            "{echoed}"
        );
        assert!(!echoed.contains(&p.key), "{echoed}");
        // The node's range has 10 host ports and 2 are taken: 9 more is no room (429, which
        // names the range), and nothing stays bound; 8 fit.
        let many = |n: u16| NetworkPolicy {
            expose: (9000..9000 + n).collect(),
            ..NetworkPolicy::default()
        };
        let e = c
            .create(&create_req(None, Some(many(9))))
            .await
            .unwrap_err();
        assert!(
            matches!(
                &e,
                warren_sdk::Error::Api {
                    code: warren_sdk::ErrorCode::Capacity,
                    ..
                }
            ) && e.to_string().contains("expose_ports"),
            "{e}"
        );
        let full = c.create(&create_req(None, Some(many(8)))).await.unwrap();
        assert_eq!(full.network().await.unwrap().exposed.len(), 8);
        full.kill().await.unwrap();
        (sb.id().to_string(), st.exposed[0].host.clone())
    });
    // The daemon crashes and comes back: the sandbox's ports listen on the same host ports.
    p.kill9();
    p.start_again();
    p.run(async || {
        let c = p.client();
        let sb = c.sandbox(&id).unwrap();
        let st = sb.network().await.unwrap();
        assert_eq!(st.exposed.len(), 2, "{st:?}");
        assert_eq!(st.exposed[0].host, host);
        let h = host.clone();
        let again = tokio::task::spawn_blocking(move || http_get(&h, "x"))
            .await
            .unwrap();
        assert!(again.contains(" 200 "), "{again}");
        sb.kill().await.unwrap();
        let gone = tokio::task::spawn_blocking(move || http_get(&host, "x"))
            .await
            .unwrap();
        assert!(gone.starts_with("connect:"), "{gone}");
    });
}

#[test]
fn an_ended_sandboxs_network_is_flushed_and_serves_the_next_one() {
    require_root!();
    let lab = Lab::new("r");
    // No warm pool: every create takes a slot itself, so the next create gets the one the
    // last kill gave back.
    let cfg = format!(
        "[node]\nwarm_pool = 0\nwarm_images = 0\n\n{}expose_ports = \"28200-28209\"\n",
        lab.node_config()
    );
    let p = Platform::start_in(&lab.node.name, Some(&cfg));
    p.run(async || {
        let c = p.client();
        let open = NetworkPolicy {
            allow: vec![NetRule::cidr(&format!("{SITE}/32"))],
            expose: vec![8000],
            ..NetworkPolicy::default()
        };
        let a = c.create(&create_req(None, Some(open))).await.unwrap();
        let a_net = a.network().await.unwrap();
        let a_ns = netns_of(init_pid(&p, a.id().as_str()));
        // A connection held open, so the node's connection tracking has an entry for it.
        let hold = format!(
            "import socket,time\ns=socket.create_connection(('{SITE}',80),3); s.recv(3)\nprint('open',flush=True)\ntime.sleep(30)\n"
        );
        a.start_process(&argv(["python3", "-c", &hold])).await.unwrap();
        let ip = a_net.ipv4.clone().unwrap();
        let tracked = || lab.node.sh("cat /proc/net/nf_conntrack");
        let mut seen = false;
        for _ in 0..50 {
            if tracked().contains(&format!("src={ip} ")) {
                seen = true;
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        assert!(seen, "no tracked connection of {ip}: {}", tracked());
        let host = a_net.exposed[0].host.clone();
        a.kill().await.unwrap();

        // The node flushes ended sandboxes' namespaces in batches, a moment after they end:
        // then the connection's tracking entry is gone and the namespace is ready again.
        let mut flushed = false;
        for _ in 0..100 {
            if !tracked().contains(&format!("src={ip} ")) {
                flushed = true;
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        assert!(flushed, "{}", tracked());
        tokio::time::sleep(Duration::from_millis(500)).await;

        // The next sandbox gets the same namespace and address, and nothing of the last one:
        // no tracked connection, its policy (default deny), no exposed port.
        let b = c.create(&create_req(None, None)).await.unwrap();
        let b_net = b.network().await.unwrap();
        assert_eq!(b_net.ipv4.as_deref(), Some(ip.as_str()));
        assert_eq!(netns_of(init_pid(&p, b.id().as_str())), a_ns);
        assert!(b_net.allow.is_empty() && b_net.exposed.is_empty(), "{b_net:?}");
        refused(&b, SITE, 80).await;
        let gone = tokio::task::spawn_blocking(move || http_get(&host, "x"))
            .await
            .unwrap();
        assert!(gone.starts_with("connect:"), "{gone}");
        // No socket of the last sandbox's is left in the namespace, not even one closing.
        let socks = py(&b, "print(open('/proc/net/tcp').read().splitlines()[1:])").await;
        assert_eq!(socks, "[]", "sockets left in the namespace");
        b.kill().await.unwrap();
    });
}

/// The inode of the network namespace of process `pid`.
fn netns_of(pid: i32) -> u64 {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(format!("/proc/{pid}/ns/net"))
        .unwrap()
        .ino()
}

/// A busybox root file system for image builds (static busybox from the host).
fn busybox_rootfs(root: &std::path::Path) {
    let busybox = ["/bin/busybox", "/usr/bin/busybox"]
        .into_iter()
        .find(|p| std::path::Path::new(p).is_file())
        .expect("busybox is missing: install busybox-static (make test does)");
    std::fs::create_dir_all(root.join("bin")).unwrap();
    std::fs::create_dir_all(root.join("etc")).unwrap();
    std::fs::copy(busybox, root.join("bin/busybox")).unwrap();
    std::os::unix::fs::symlink("busybox", root.join("bin/sh")).unwrap();
}

/// `image build` steps run in a builder sandbox under the policy the build names: by default
/// nothing outbound (a step that fetches fails, and the build saves nothing); with
/// `--allow-domain` the step reaches that name, through the node's resolver and its
/// transparent proxy, and no other.
#[test]
fn image_builds_reach_only_what_their_policy_allows() {
    require_root!();
    let lab = Lab::new("i");
    // No warm inits holding the images' layers, which unmount a second after their last use.
    let cfg = format!(
        "[node]\nwarm_pool = 0\nwarm_images = 0\nlayer_idle_unmount = 1\n\n{}",
        lab.node_config()
    );
    let p = Platform::start_in(&lab.node.name, Some(&cfg));
    let work = tempfile::tempdir().unwrap();
    let base = work.path().join("base");
    busybox_rootfs(&base);
    let ok = |args: &[&str]| {
        let out = p.cli(args);
        assert!(
            out.status.success(),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    ok(&[
        "image",
        "import",
        base.to_str().unwrap(),
        "--name",
        "t/base",
    ]);
    // Static busybox's wget crashes on static glibc's NSS: the step resolves with busybox's own
    // resolver (the `Address` after the `Name` line) and speaks HTTP with nc, naming the
    // site in the Host header, as the transparent proxy requires for port 80 (the lab's sites
    // greet with `hi`).
    let get = |host: &str| {
        format!(
            "printf 'GET / HTTP/1.0\\r\\nHost: pypi.test\\r\\n\\r\\n' | nc -w 5 {host} 80 > /tmp/r \
             && head -n 1 /tmp/r > /etc/fetched && grep -qx hi /etc/fetched"
        )
    };
    let fetch = format!(
        "ip=$(nslookup pypi.test | awk '/^Name:/ {{n=1}} n && /^Address/ {{print $NF; exit}}'); \
         echo \"resolved $ip\"; [ -n \"$ip\" ] && {}",
        get("$ip")
    );
    let fetch = fetch.as_str();
    let build = |name: &str, run: &str, policy: &[&str]| {
        let mut args = vec!["image", "build", "--from", "t/base", "--run", run];
        args.extend_from_slice(policy);
        args.extend_from_slice(&["--name", name]);
        let out = p.cli(&args);
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };

    // No policy: everything outbound denied, the site's address refused at once.
    let direct = get(SITE);
    let (built, err) = build("t/fetch:none", &direct, &[]);
    assert!(!built, "a build without a policy fetched: {err}");
    assert!(err.contains("can't connect"), "{err}");
    // Nor does the name resolve.
    let (built, err) = build("t/fetch:none", fetch, &[]);
    assert!(!built, "a build without a policy fetched: {err}");
    assert!(!err.contains(&format!("resolved {SITE}")), "{err}");
    // Another name allowed: still not this one.
    let (built, err) = build("t/fetch:other", fetch, &["--allow-domain", "other.test"]);
    assert!(!built, "a build allowed another name fetched: {err}");
    assert!(!err.contains(&format!("resolved {SITE}")), "{err}");
    for name in ["t/fetch:none", "t/fetch:other"] {
        let out = p.cli(&["image", "inspect", name]);
        assert!(!out.status.success(), "{name} was saved by a failed build");
    }

    // Allowed by name: the step reaches the site, and its result is in the image.
    ok(&[
        "image",
        "build",
        "--from",
        "t/base",
        "--allow-domain",
        "pypi.test",
        "--run",
        fetch,
        "--name",
        "t/fetch:ok",
    ]);
    p.run(async || {
        let sb = p
            .client()
            .create(&CreateSandbox {
                image: "t/fetch:ok".into(),
                ..Default::default()
            })
            .await
            .unwrap();
        let r = sb
            .exec(&argv(["/bin/busybox", "cat", "/etc/fetched"]))
            .await
            .unwrap();
        assert_eq!(r.stdout, "hi\n");
        sb.kill().await.unwrap();
    });
    p.assert_clean();
}
