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

#[path = "../common/mod.rs"]
mod common;
mod world;

use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rustls::pki_types::ServerName;
use warren_net::proxy::{Limits, Refusal};

use world::{DENIED_ADDR, NODE_UPLINK, SERIAL, SITE_A, SITE_A6, SITE_B, World, ip, is_root, sa};

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
