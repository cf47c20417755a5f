//! How long the firewall's changes take written as netlink batches, against the same
//! transactions written by `nft -f -` (as they were before), in a table that already holds a
//! number of sandboxes with a few rules each (the kernel's interval sets cost more the more
//! elements they hold). For the node's benchmark; the kernel test prints it.

use std::io;
use std::net::{IpAddr, Ipv4Addr};
use std::time::{Duration, Instant};

use warren_types::net::{Cidr, NetRule, NetworkPolicy, PortRange, Protocol};

use super::{Elements, Firewall, FirewallConfig, expand};
use crate::link::Addressing;

/// One operation's median latency by each writer.
#[derive(Debug, Clone)]
pub struct Latency {
    /// The operation.
    pub what: String,
    /// Times it was measured, per writer.
    pub samples: usize,
    /// Median by a netlink batch.
    pub netlink: Duration,
    /// Median by `nft -f -`.
    pub exec: Duration,
}

/// The rows, in order; the task-wide update is measured a tenth as often.
const ADD: usize = 0;
const FIRST_POLICY: usize = 1;
const UPDATE: usize = 2;
const REMOVE: usize = 3;
const TASK: usize = 4;
const RESOLVED: usize = 5;

/// Measures each operation `samples` times per writer (the task-wide update a tenth as
/// often, at least 3) with `population` sandboxes of three rules each in the table (at
/// least one; the task-wide update changes them all). Installs the table `inet warren` in
/// the calling thread's network namespace and removes it: call it in a namespace of its
/// own, never beside a node.
pub fn measure(samples: usize, population: usize) -> io::Result<Vec<Latency>> {
    let samples = samples.max(1);
    let population = population.max(1);
    let netlink = medians(false, samples, population)?;
    let exec = medians(true, samples, population)?;
    let what = [
        "add one sandbox, deny-all (4 elements)".to_string(),
        "its first policy, 3 rules (a create with rules)".to_string(),
        "update one sandbox's policy (3 rules to 3 others)".to_string(),
        "remove one sandbox with 3 rules (a kill)".to_string(),
        format!("update {population} sandboxes in one transaction"),
        "open one resolved address (a DNS answer)".to_string(),
    ];
    Ok(what
        .into_iter()
        .enumerate()
        .map(|(i, what)| Latency {
            what,
            samples: if i == TASK {
                (samples / 10).max(3)
            } else {
                samples
            },
            netlink: netlink[i],
            exec: exec[i],
        })
        .collect())
}

/// The results as a Markdown table.
pub fn table(rows: &[Latency]) -> String {
    let mut s = String::from(
        "| operation | samples | netlink batch (median) | nft -f - (median) | ratio |\n\
         |---|---:|---:|---:|---:|\n",
    );
    for r in rows {
        s.push_str(&format!(
            "| {} | {} | {:.3} ms | {:.3} ms | {:.1}× |\n",
            r.what,
            r.samples,
            ms(r.netlink),
            ms(r.exec),
            ms(r.exec) / ms(r.netlink).max(1e-6),
        ));
    }
    s
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

fn policy(rules: Vec<NetRule>, deny: Vec<NetRule>) -> io::Result<Elements> {
    let p = NetworkPolicy {
        allow: rules,
        deny,
        ..NetworkPolicy::default()
    }
    .parse()
    .map_err(io::Error::other)?;
    expand(&p).map_err(io::Error::other)
}

fn ports(cidr: &str, ports: &str, p: Protocol) -> NetRule {
    NetRule {
        cidr: Some(cidr.into()),
        ports: Some(ports.into()),
        protocol: Some(p),
        ..NetRule::default()
    }
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort_unstable();
    v.get(v.len() / 2).copied().unwrap_or_default()
}

fn medians(exec: bool, samples: usize, population: usize) -> io::Result<[Duration; 6]> {
    let cidr = |s: &str| Cidr::parse(s).map_err(io::Error::other);
    let addressing = Addressing::new(cidr("10.200.0.0/16")?, cidr("fd77:7761::/64")?)
        .map_err(io::Error::other)?;
    let cfg = FirewallConfig {
        addressing,
        internal: vec![],
        exempt: vec![],
        log_group: 0,
        masquerade: false,
        proxy_port: None,
    };
    let mut fw = if exec {
        Firewall::with_exec(cfg)
    } else {
        Firewall::new(cfg)
    };
    // Two policies of three rules each, swapped at every update.
    let a = policy(
        vec![
            NetRule::cidr("198.51.100.0/24"),
            ports("0.0.0.0/0", "443", Protocol::Tcp),
        ],
        vec![ports("10.0.0.0/8", "22", Protocol::Tcp)],
    )?;
    let b = policy(
        vec![
            NetRule::cidr("203.0.113.0/24"),
            ports("0.0.0.0/0", "80", Protocol::Tcp),
            ports("2001:db8::/32", "53", Protocol::Udp),
        ],
        vec![],
    )?;
    let deny_all = policy(vec![], vec![])?;
    let lease = |i: usize| {
        addressing
            .lease(2 + i as u32)
            .ok_or_else(|| io::Error::other("lease out of the pool"))
    };
    // The table with its population, written in one go.
    for i in 0..population {
        fw.adopt(lease(i)?, 1, a.clone());
    }
    fw.install()?;
    let mut generation = 2;
    let r = (|| -> io::Result<[Duration; 6]> {
        let mut t: [Vec<Duration>; 6] = Default::default();
        let mut timed = |row: usize, f: &mut dyn FnMut() -> io::Result<()>| {
            let start = Instant::now();
            f()?;
            t[row].push(start.elapsed());
            io::Result::Ok(())
        };
        // A create, its policy, a kill.
        for i in 0..samples {
            let l = lease(population + i)?;
            timed(ADD, &mut || fw.add(l, generation, deny_all.clone()))?;
            timed(FIRST_POLICY, &mut || {
                fw.update(l.index, generation + 1, a.clone())
            })?;
            timed(REMOVE, &mut || fw.remove_entry(l.index))?;
            generation += 2;
        }
        let index = lease(0)?.index;
        for i in 0..samples {
            let p = if i % 2 == 0 { &b } else { &a };
            timed(UPDATE, &mut || fw.update(index, generation, p.clone()))?;
            generation += 1;
        }
        for i in 0..(samples / 10).max(3) {
            let p = if i % 2 == 0 { &b } else { &a };
            let mut all = Vec::with_capacity(population);
            for j in 0..population {
                all.push((lease(j)?.index, generation, p.clone()));
                generation += 1;
            }
            let mut all = Some(all);
            timed(TASK, &mut || fw.update_many(all.take().unwrap_or_default()))?;
        }
        let https = [PortRange { lo: 443, hi: 443 }];
        for i in 0..samples {
            // A new address each time (from TEST-NET-2 on), on a sandbox in turn.
            let addr = IpAddr::V4(Ipv4Addr::from(0xc633_6400u32 + i as u32));
            let index = lease(i % population)?.index;
            timed(RESOLVED, &mut || {
                fw.allow_resolved(index, "example.com", &[addr], &https, 300)
            })?;
        }
        Ok(t.map(median))
    })();
    let _ = fw.remove();
    r
}
