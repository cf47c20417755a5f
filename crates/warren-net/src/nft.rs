//! The node's firewall: one nftables table, `inet warren`, whose rules never grow with the
//! number of sandboxes. Everything per sandbox is an element of a set or map keyed by the name
//! of its interface's node end (`wv<index>`), so a create, a policy change or a kill is one
//! atomic `nft -f -` transaction of element changes.
//!
//! The rules match only Warren's interfaces (`iifname`/`oifname "wv*"`) and, for the NAT,
//! only the pools' source addresses: the host's own traffic never meets them.
//!
//! Outbound, a new connection from a sandbox is checked in this order:
//! 1. its source address must be its own (`src4`/`src6`), else it is dropped;
//! 2. the always-denied ranges (`internal4`/`internal6`: the node, the control plane, the
//!    pools, loopback, link-local, metadata, multicast), less the administrator's exemptions;
//! 3. the sandbox's deny rules (`denyany*` for whole CIDRs, `deny*` by protocol and port);
//! 4. its allow rules: whole CIDRs (`any*`, which lets ICMP through too), by protocol and port
//!    (`allow*`), and the addresses its allowed domains resolved to, for their TTL (`dyn*`,
//!    TCP only);
//! 5. anything else is refused: logged to an NFLOG group (bounded rate per sandbox and per
//!    node) and answered with a
//!    TCP reset or an ICMP "administratively prohibited" — never silently dropped, so a client
//!    fails at once instead of hanging.
//!
//! An allowed connection's conntrack entry is marked with the sandbox's policy generation
//! (`gen`); later packets of it pass only while the generation is current (`live`). A policy
//! change bumps the generation, so every open connection is judged again by the new policy at
//! its next packet: still allowed, it is marked anew; no longer allowed, it is reset.
//!
//! Inbound, nothing reaches a sandbox but replies to its own connections (and neighbour
//! discovery) and the node's connections to the ports it exposes (`expose`: the node's
//! forwarders, see [`crate::expose`]); to the node itself it may reach only the DNS proxy on
//! the gateway address.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::io::{self, Write as _};
use std::net::IpAddr;
use std::process::{Command, Stdio};

use warren_types::net::{Cidr, Policy, PortRange, Protocol, Target};

use crate::link::{Addressing, HOST_PREFIX, Lease};

/// The table's name (family `inet`).
pub const TABLE: &str = "warren";

/// Most firewall elements one sandbox's policy may expand to.
pub const MAX_ELEMENTS: usize = 65_536;

/// Refused packets logged per second, node-wide (the rest are refused unlogged).
pub const LOG_RATE: u32 = 2000;

/// Refused packets logged per second for one sandbox, after a burst of
/// [`LOG_BURST_SANDBOX`]: one flooding sandbox cannot use up the node's log rate (a port scan
/// of a few hundred ports is still logged whole).
pub const LOG_RATE_SANDBOX: u32 = 200;

/// See [`LOG_RATE_SANDBOX`].
pub const LOG_BURST_SANDBOX: u32 = 1000;

/// Most addresses × port ranges one sandbox's domains may have open at once.
pub const MAX_RESOLVED: usize = 1024;

/// How the table is set up.
#[derive(Debug, Clone)]
pub struct FirewallConfig {
    /// The sandbox pools (and the gateway).
    pub addressing: Addressing,
    /// Always denied: the node's own addresses, the control plane, and whatever the
    /// administrator adds (the fixed ranges are added by [`default_internal`]).
    pub internal: Vec<Cidr>,
    /// Exempt from `internal` (still needing an allow rule).
    pub exempt: Vec<Cidr>,
    /// NFLOG group of refused packets.
    pub log_group: u16,
    /// Masquerade allowed traffic leaving through other interfaces.
    pub masquerade: bool,
}

/// The ranges no sandbox reaches by default: unspecified, loopback, link-local (cloud metadata
/// included), multicast and reserved, IPv4-mapped IPv6, the metadata and platform addresses
/// clouds put elsewhere (AWS's IPv6 ones, Alibaba's, Azure's WireServer), plus the pools.
pub fn default_internal(addressing: &Addressing) -> Vec<Cidr> {
    let mut v: Vec<Cidr> = [
        "0.0.0.0/8",
        "127.0.0.0/8",
        "169.254.0.0/16",
        "224.0.0.0/3",
        "::/128",
        "::1/128",
        "::ffff:0:0/96",
        "fe80::/10",
        "ff00::/8",
        "fd00:ec2::254/128",
        // Other clouds' metadata and platform services.
        "100.100.100.200/32",
        "168.63.129.16/32",
        "fd00:ec2::253/128",
        "fd00:ec2::123/128",
    ]
    .iter()
    .filter_map(|c| Cidr::parse(c).ok())
    .collect();
    v.push(addressing.v4);
    v.push(addressing.v6);
    v
}

/// The elements one sandbox holds, per set.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Elements {
    /// Set name → element texts (without the interface key).
    sets: HashMap<&'static str, Vec<String>>,
}

impl Elements {
    /// How many elements in all.
    pub fn len(&self) -> usize {
        self.sets.values().map(Vec::len).sum()
    }

    /// Whether it has none.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// One sandbox's firewall state.
#[derive(Debug, Clone)]
struct Entry {
    lease: Lease,
    generation: u32,
    static_elements: Elements,
}

/// The table and what each sandbox holds in it.
pub struct Firewall {
    cfg: FirewallConfig,
    entries: HashMap<u32, Entry>,
    /// Dynamic (domain) elements believed present: (index, set, element) → expiry, ms.
    /// The value: expiry (ms) and the domain that resolved to it.
    dynamic: HashMap<(u32, &'static str, String), (u64, String)>,
}

fn iface(lease: &Lease) -> String {
    format!("\"{}\"", lease.host_if())
}

fn proto(p: Protocol) -> &'static str {
    match p {
        Protocol::Tcp => "tcp",
        Protocol::Udp => "udp",
    }
}

/// The elements a parsed policy expands to (without the interface key), or why it cannot.
pub fn expand(policy: &Policy) -> Result<Elements, String> {
    let mut out = Elements::default();
    for (rules, any_sets, port_sets) in [
        (&policy.allow, ["any4", "any6"], ["allow4", "allow6"]),
        (&policy.deny, ["denyany4", "denyany6"], ["deny4", "deny6"]),
    ] {
        // Whole CIDRs, every protocol.
        let mut whole: [Vec<Cidr>; 2] = [Vec::new(), Vec::new()];
        // (protocol) → [(cidr, ports)] per family.
        let mut by_port: HashMap<Protocol, [Vec<(Cidr, PortRange)>; 2]> = HashMap::new();
        for r in rules.iter() {
            let cidrs: Vec<Cidr> = match &r.target {
                Target::Domain(_) => continue,
                Target::Cidr(c) => vec![*c],
                Target::Any => vec![any(false), any(true)],
            };
            for c in cidrs {
                let fam = usize::from(c.addr.is_ipv6());
                match (r.ports, r.protocol) {
                    (None, None) => whole[fam].push(c),
                    (ports, protos) => {
                        let ports = ports.unwrap_or(PortRange { lo: 0, hi: 65535 });
                        let protos = match protos {
                            Some(p) => vec![p],
                            None => vec![Protocol::Tcp, Protocol::Udp],
                        };
                        for p in protos {
                            by_port.entry(p).or_default()[fam].push((c, ports));
                        }
                    }
                }
            }
        }
        for fam in 0..2 {
            let list = outermost(&whole[fam]);
            let set = out.sets.entry(any_sets[fam]).or_default();
            set.extend(list.iter().map(|c| c.to_string()));
        }
        let mut protos: Vec<_> = by_port.keys().copied().collect();
        protos.sort_by_key(|p| proto(*p));
        for p in protos {
            for fam in 0..2 {
                let pieces = disjoint(&by_port[&p][fam], MAX_ELEMENTS)?;
                let set = out.sets.entry(port_sets[fam]).or_default();
                set.extend(
                    pieces
                        .iter()
                        .map(|(c, r)| format!("{c} . {} . {}-{}", proto(p), r.lo, r.hi)),
                );
            }
        }
    }
    // Exposed ports: the node may open connections to these (its forwarders do).
    out.sets
        .entry("expose")
        .or_default()
        .extend(policy.expose.iter().map(|p| p.to_string()));
    out.sets.retain(|_, v| !v.is_empty());
    if out.len() > MAX_ELEMENTS {
        return Err(format!(
            "the policy expands to {} firewall entries, more than {MAX_ELEMENTS}: merge rules \
             into wider CIDRs or port ranges",
            out.len()
        ));
    }
    Ok(out)
}

fn any(v6: bool) -> Cidr {
    if v6 {
        Cidr {
            addr: IpAddr::V6(std::net::Ipv6Addr::UNSPECIFIED),
            prefix: 0,
        }
    } else {
        Cidr {
            addr: IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED),
            prefix: 0,
        }
    }
}

/// The CIDRs of `list` that no other one covers, once each (CIDRs are nested or disjoint, so
/// these are disjoint: the kernel's interval sets refuse overlaps). Time: one hash lookup per
/// CIDR and prefix length kept.
fn outermost(list: &[Cidr]) -> Vec<Cidr> {
    let mut v: Vec<Cidr> = list.to_vec();
    // Widest first, so a covered one always meets its cover before it.
    v.sort_by_key(|c| (c.prefix, c.addr));
    v.dedup();
    let mut kept: Vec<Cidr> = Vec::new();
    let mut nets: std::collections::HashSet<Cidr> = std::collections::HashSet::new();
    let mut prefixes: Vec<u8> = Vec::new();
    for c in v {
        let covered = prefixes.iter().any(|&p| {
            nets.contains(
                &Cidr {
                    addr: c.addr,
                    prefix: p,
                }
                .normalized(),
            )
        });
        if !covered {
            if !prefixes.contains(&c.prefix) {
                prefixes.push(c.prefix);
            }
            nets.insert(c);
            kept.push(c);
        }
    }
    kept
}

/// Work (CIDRs considered across port pieces) past which a policy is refused as too complex.
const WORK_BUDGET: usize = 4_000_000;

/// (CIDR, port range) pairs made disjoint: the port axis cut at every rule's bounds, each piece
/// given the outermost CIDRs that cover it, and neighbouring pieces with the same CIDR joined.
fn disjoint(list: &[(Cidr, PortRange)], max: usize) -> Result<Vec<(Cidr, PortRange)>, String> {
    if list.is_empty() {
        return Ok(Vec::new());
    }
    let too_many = || {
        format!(
            "the policy expands to more than {max} firewall entries: merge rules into wider \
             CIDRs or port ranges"
        )
    };
    let mut by_lo: Vec<(Cidr, PortRange)> = list.to_vec();
    by_lo.sort_by_key(|(_, r)| r.lo);
    let mut cuts: Vec<u32> = Vec::with_capacity(list.len() * 2);
    for (_, r) in list {
        cuts.push(r.lo as u32);
        cuts.push(r.hi as u32 + 1);
    }
    cuts.sort_unstable();
    cuts.dedup();
    let mut out: Vec<(Cidr, PortRange)> = Vec::new();
    // CIDR → its piece that ends just before the current one (to join into).
    let mut open: HashMap<Cidr, usize> = HashMap::new();
    let mut active: Vec<(Cidr, u32)> = Vec::new();
    let mut next = 0;
    let mut work = 0usize;
    for w in cuts.windows(2) {
        let (lo, hi) = (w[0], w[1] - 1);
        while next < by_lo.len() && by_lo[next].1.lo as u32 <= lo {
            active.push((by_lo[next].0, by_lo[next].1.hi as u32));
            next += 1;
        }
        active.retain(|(_, h)| *h >= lo);
        work += active.len();
        if work > WORK_BUDGET {
            return Err(too_many());
        }
        let covering: Vec<Cidr> = active.iter().map(|(c, _)| *c).collect();
        let mut still = HashMap::new();
        for c in outermost(&covering) {
            match open.get(&c) {
                Some(&i) if out[i].1.hi as u32 + 1 == lo => {
                    out[i].1.hi = hi as u16;
                    still.insert(c, i);
                }
                _ => {
                    out.push((
                        c,
                        PortRange {
                            lo: lo as u16,
                            hi: hi as u16,
                        },
                    ));
                    still.insert(c, out.len() - 1);
                }
            }
            if out.len() > max {
                return Err(too_many());
            }
        }
        open = still;
    }
    Ok(out)
}

impl Firewall {
    /// The table as it should be with no sandbox in it.
    pub fn new(cfg: FirewallConfig) -> Firewall {
        Firewall {
            cfg,
            entries: HashMap::new(),
            dynamic: HashMap::new(),
        }
    }

    /// Why no rule can allow `c` here, if none can: it lies inside an always-denied range
    /// (and no exemption covers it).
    pub fn never_allowed(&self, c: &Cidr) -> Option<Cidr> {
        if self.cfg.exempt.iter().any(|e| e.covers(c)) {
            return None;
        }
        default_internal(&self.cfg.addressing)
            .iter()
            .chain(self.cfg.internal.iter())
            .find(|i| i.covers(c))
            .copied()
    }

    /// Replaces the whole table (an earlier daemon's included) in one transaction, with every
    /// sandbox this firewall knows. Used at start, after re-adopting sandboxes.
    pub fn install(&mut self) -> io::Result<()> {
        self.dynamic.clear();
        let mut s = String::new();
        // `add` then `delete` so that the delete never fails on a missing table.
        let _ = writeln!(s, "add table inet {TABLE}");
        let _ = writeln!(s, "delete table inet {TABLE}");
        s.push_str(&self.skeleton());
        let entries: Vec<Entry> = self.entries.values().cloned().collect();
        for e in &entries {
            add_entry(&mut s, e);
        }
        run(&s)
    }

    /// Removes the table (the node stops for good, or a test ends).
    pub fn remove(&mut self) -> io::Result<()> {
        self.entries.clear();
        self.dynamic.clear();
        run(&format!(
            "add table inet {TABLE}\ndelete table inet {TABLE}\n"
        ))
    }

    /// Records `lease` (a sandbox's interface) with `policy`'s elements at generation `gen`,
    /// in memory only (for [`Firewall::install`] after a restart).
    pub fn adopt(&mut self, lease: Lease, generation: u32, elements: Elements) {
        self.entries.insert(
            lease.index,
            Entry {
                lease,
                generation,
                static_elements: elements,
            },
        );
    }

    /// Adds a sandbox's interface with the elements of its policy (one transaction).
    pub fn add(&mut self, lease: Lease, generation: u32, elements: Elements) -> io::Result<()> {
        if self.entries.contains_key(&lease.index) {
            self.remove_entry(lease.index)?;
        }
        let e = Entry {
            lease,
            generation,
            static_elements: elements,
        };
        let mut s = String::new();
        add_entry(&mut s, &e);
        run(&s)?;
        self.entries.insert(lease.index, e);
        Ok(())
    }

    /// Replaces a sandbox's policy and bumps its generation, in one transaction: its open
    /// connections are judged again by the new policy at their next packet.
    pub fn update(&mut self, index: u32, generation: u32, elements: Elements) -> io::Result<()> {
        self.update_many(vec![(index, generation, elements)])
    }

    /// [`Firewall::update`] for many sandboxes in one transaction (a task's change): all or
    /// none. Addresses resolved for a domain are kept where `keep` says the new policy still
    /// allows that domain on those ports; the rest go with the old policy.
    pub fn update_many(&mut self, updates: Vec<(u32, u32, Elements)>) -> io::Result<()> {
        self.update_keeping(updates, |_, _, _| false)
    }

    /// [`Firewall::update_many`], keeping the resolved addresses for which
    /// `keep(index, domain, ports)` holds.
    pub fn update_keeping(
        &mut self,
        updates: Vec<(u32, u32, Elements)>,
        keep: impl Fn(u32, &str, PortRange) -> bool,
    ) -> io::Result<()> {
        let mut s = String::new();
        let mut new_entries = Vec::with_capacity(updates.len());
        let mut dynamic_gone = Vec::new();
        for (index, generation, elements) in updates {
            let Some(old) = self.entries.get(&index).cloned() else {
                return Err(io::Error::other("the sandbox has no interface"));
            };
            let k = iface(&old.lease);
            delete_elements(&mut s, &k, &old.static_elements);
            dynamic_gone.extend(self.dynamic_of(&mut s, index, &k, &keep));
            let _ = writeln!(s, "delete element inet {TABLE} gen {{ {k} }}");
            let _ = writeln!(
                s,
                "delete element inet {TABLE} live {{ {k} . {} }}",
                old.generation
            );
            let new = Entry {
                lease: old.lease,
                generation,
                static_elements: elements,
            };
            add_policy(&mut s, &new);
            new_entries.push(new);
        }
        run(&s)?;
        for key in dynamic_gone {
            self.dynamic.remove(&key);
        }
        for e in new_entries {
            self.entries.insert(e.lease.index, e);
        }
        Ok(())
    }

    /// A sandbox's current policy generation.
    pub fn generation(&self, index: u32) -> Option<u32> {
        self.entries.get(&index).map(|e| e.generation)
    }

    /// Removes everything of a sandbox's (one transaction); unknown is no error.
    pub fn remove_entry(&mut self, index: u32) -> io::Result<()> {
        let Some(e) = self.entries.get(&index).cloned() else {
            return Ok(());
        };
        let k = iface(&e.lease);
        let mut s = String::new();
        delete_elements(&mut s, &k, &e.static_elements);
        for key in self.dynamic_of(&mut s, index, &k, &|_, _, _| false) {
            self.dynamic.remove(&key);
        }
        let _ = writeln!(s, "delete element inet {TABLE} gen {{ {k} }}");
        let _ = writeln!(
            s,
            "delete element inet {TABLE} live {{ {k} . {} }}",
            e.generation
        );
        let _ = writeln!(
            s,
            "delete element inet {TABLE} src4 {{ {k} . {} }}",
            e.lease.v4
        );
        let _ = writeln!(
            s,
            "delete element inet {TABLE} src6 {{ {k} . {} }}",
            e.lease.v6
        );
        let r = run(&s);
        self.entries.remove(&index);
        r
    }

    /// Lets sandbox `index` reach `addrs` on `ports` over TCP for `ttl_s` seconds (what its
    /// allowed domain resolved to). An address allowed already keeps its element while more
    /// than half its time is left (no transaction at all); otherwise it gets the new expiry.
    /// At most [`MAX_RESOLVED`] such elements per sandbox; the rest are not opened.
    pub fn allow_resolved(
        &mut self,
        index: u32,
        domain: &str,
        addrs: &[IpAddr],
        ports: &[PortRange],
        ttl_s: u32,
    ) -> io::Result<()> {
        let Some(e) = self.entries.get(&index) else {
            return Ok(());
        };
        let k = iface(&e.lease);
        let now = mono_ms();
        self.dynamic.retain(|_, (exp, _)| *exp > now);
        let mut held = self.dynamic.keys().filter(|(i, _, _)| *i == index).count();
        let ttl_ms = u64::from(ttl_s) * 1000;
        // Computed before the transaction: the kernel's timer starts later, so it never
        // expires before this does.
        let expiry = now + ttl_ms;
        let mut s = String::new();
        let mut added = Vec::new();
        for a in addrs {
            let set = if a.is_ipv6() { "dyn6" } else { "dyn4" };
            for p in ports {
                let key = (index, set, format!("{a} . {}-{}", p.lo, p.hi));
                match self.dynamic.get(&key) {
                    Some((exp, _)) if exp.saturating_sub(now) > ttl_ms / 2 => continue,
                    // Alive for more than a second in the kernel too: replace it.
                    Some((exp, _)) if *exp > now + 1000 => {
                        let _ =
                            writeln!(s, "delete element inet {TABLE} {set} {{ {k} . {} }}", key.2);
                    }
                    // About to expire (or gone): `add` of an element that still exists is a
                    // no-op, so refresh it by adding it with its short life, then deleting.
                    Some(_) => {
                        let _ = writeln!(
                            s,
                            "add element inet {TABLE} {set} {{ {k} . {} timeout 2s }}",
                            key.2
                        );
                        let _ =
                            writeln!(s, "delete element inet {TABLE} {set} {{ {k} . {} }}", key.2);
                    }
                    None => {
                        if held >= MAX_RESOLVED {
                            continue;
                        }
                        held += 1;
                    }
                }
                let _ = writeln!(
                    s,
                    "add element inet {TABLE} {set} {{ {k} . {} timeout {ttl_s}s }}",
                    key.2
                );
                added.push(key);
            }
        }
        if s.is_empty() {
            return Ok(());
        }
        run(&s)?;
        // Only what the kernel took is recorded.
        for key in added {
            self.dynamic.insert(key, (expiry, domain.to_string()));
        }
        Ok(())
    }

    /// Writes the deletion of sandbox `index`'s dynamic elements that `keep` does not keep
    /// into `s`; returns their keys (to forget once the transaction succeeded).
    fn dynamic_of(
        &self,
        s: &mut String,
        index: u32,
        k: &str,
        keep: &dyn Fn(u32, &str, PortRange) -> bool,
    ) -> Vec<(u32, &'static str, String)> {
        let now = mono_ms();
        let mut gone = Vec::new();
        for (key, (exp, domain)) in &self.dynamic {
            if key.0 != index {
                continue;
            }
            let ports = key
                .2
                .rsplit_once(" . ")
                .and_then(|(_, p)| PortRange::parse(p).ok())
                .unwrap_or(PortRange { lo: 0, hi: 65535 });
            if keep(index, domain, ports) {
                continue;
            }
            // One that has timed out is gone, and deleting it would fail the whole
            // transaction: those within a second of expiry are left to time out.
            if *exp > now + 1000 {
                let _ = writeln!(
                    s,
                    "delete element inet {TABLE} {} {{ {k} . {} }}",
                    key.1, key.2
                );
            }
            gone.push(key.clone());
        }
        gone
    }

    /// The table without any sandbox.
    fn skeleton(&self) -> String {
        let c = &self.cfg;
        let list = |v6: bool, cidrs: &[Cidr]| -> String {
            let v: Vec<String> = outermost(
                &cidrs
                    .iter()
                    .filter(|x| x.addr.is_ipv6() == v6)
                    .copied()
                    .collect::<Vec<_>>(),
            )
            .iter()
            .map(|x| x.to_string())
            .collect();
            if v.is_empty() {
                String::new()
            } else {
                format!("elements = {{ {} }}", v.join(", "))
            }
        };
        let mut internal = default_internal(&c.addressing);
        internal.extend(c.internal.iter().copied());
        let gw4 = c.addressing.gateway4();
        let p = HOST_PREFIX;
        let g = c.log_group;
        let nat = if c.masquerade {
            format!(
                "  chain nat {{\n    type nat hook postrouting priority srcnat; policy accept;\n    \
                 ip saddr {} oifname != \"{p}*\" masquerade\n    ip6 saddr {} oifname != \
                 \"{p}*\" masquerade\n  }}\n",
                c.addressing.v4, c.addressing.v6
            )
        } else {
            String::new()
        };
        format!(
            r#"table inet {TABLE} {{
  set src4 {{ type ifname . ipv4_addr; }}
  set src6 {{ type ifname . ipv6_addr; }}
  map gen {{ type ifname : mark; }}
  set live {{ type ifname . mark; }}
  set internal4 {{ type ipv4_addr; flags interval; {i4} }}
  set internal6 {{ type ipv6_addr; flags interval; {i6} }}
  set exempt4 {{ type ipv4_addr; flags interval; {e4} }}
  set exempt6 {{ type ipv6_addr; flags interval; {e6} }}
  set any4 {{ type ifname . ipv4_addr; flags interval; }}
  set any6 {{ type ifname . ipv6_addr; flags interval; }}
  set denyany4 {{ type ifname . ipv4_addr; flags interval; }}
  set denyany6 {{ type ifname . ipv6_addr; flags interval; }}
  set allow4 {{ type ifname . ipv4_addr . inet_proto . inet_service; flags interval; }}
  set allow6 {{ type ifname . ipv6_addr . inet_proto . inet_service; flags interval; }}
  set deny4 {{ type ifname . ipv4_addr . inet_proto . inet_service; flags interval; }}
  set deny6 {{ type ifname . ipv6_addr . inet_proto . inet_service; flags interval; }}
  set dyn4 {{ type ifname . ipv4_addr . inet_service; flags interval, timeout; }}
  set dyn6 {{ type ifname . ipv6_addr . inet_service; flags interval, timeout; }}
  set expose {{ type ifname . inet_service; }}
  set lograte {{ type ifname; flags dynamic, timeout; timeout 10s; size 65536; }}
  chain forward {{
    type filter hook forward priority filter - 10; policy accept;
    iifname "{p}*" jump egress
    oifname "{p}*" jump ingress
  }}
  chain input {{
    type filter hook input priority filter - 10; policy accept;
    iifname "{p}*" jump to_node
    iifname != "{p}*" iifname != "lo" ip daddr {gw4} meta l4proto {{ tcp, udp }} th dport 53 drop
  }}
  chain output {{
    type filter hook output priority filter - 10; policy accept;
    oifname "{p}*" jump from_node
  }}
  chain spoof {{
    meta nfproto ipv4 iifname . ip saddr != @src4 drop
    meta nfproto ipv6 ip6 saddr != fe80::/10 iifname . ip6 saddr != @src6 drop
  }}
  chain egress {{
    jump spoof
    ct state established,related iifname . ct mark @live accept
    ip daddr @internal4 ip daddr != @exempt4 goto refuse
    ip6 daddr @internal6 ip6 daddr != @exempt6 goto refuse
    ct original ip daddr @internal4 ct original ip daddr != @exempt4 goto refuse
    ct original ip6 daddr @internal6 ct original ip6 daddr != @exempt6 goto refuse
    iifname . ip daddr @denyany4 goto refuse
    iifname . ip6 daddr @denyany6 goto refuse
    meta l4proto {{ tcp, udp }} iifname . ip daddr . meta l4proto . th dport @deny4 goto refuse
    meta l4proto {{ tcp, udp }} iifname . ip6 daddr . meta l4proto . th dport @deny6 goto refuse
    iifname . ip daddr @any4 goto pass
    iifname . ip6 daddr @any6 goto pass
    meta l4proto {{ tcp, udp }} iifname . ip daddr . meta l4proto . th dport @allow4 goto pass
    meta l4proto {{ tcp, udp }} iifname . ip6 daddr . meta l4proto . th dport @allow6 goto pass
    meta l4proto tcp iifname . ip daddr . tcp dport @dyn4 goto pass
    meta l4proto tcp iifname . ip6 daddr . tcp dport @dyn6 goto pass
    goto refuse
  }}
  chain pass {{
    ct mark set iifname map @gen
    accept
  }}
  chain refuse {{
    add @lograte {{ iifname limit rate {LOG_RATE_SANDBOX}/second burst {LOG_BURST_SANDBOX} packets }} limit rate {LOG_RATE}/second burst {LOG_RATE} packets log group {g}
    meta l4proto tcp reject with tcp reset
    reject with icmpx admin-prohibited
  }}
  chain ingress {{
    ct state established,related oifname . ct mark @live accept
    ct state established,related jump reverse
    reject with icmpx admin-prohibited
  }}
  chain reverse {{
    oifname . ip saddr @denyany4 drop
    oifname . ip6 saddr @denyany6 drop
    meta l4proto {{ tcp, udp }} oifname . ip saddr . meta l4proto . th sport @deny4 drop
    meta l4proto {{ tcp, udp }} oifname . ip6 saddr . meta l4proto . th sport @deny6 drop
    oifname . ip saddr @any4 goto pass_in
    oifname . ip6 saddr @any6 goto pass_in
    meta l4proto {{ tcp, udp }} oifname . ip saddr . meta l4proto . th sport @allow4 goto pass_in
    meta l4proto {{ tcp, udp }} oifname . ip6 saddr . meta l4proto . th sport @allow6 goto pass_in
    meta l4proto tcp oifname . ip saddr . tcp sport @dyn4 goto pass_in
    meta l4proto tcp oifname . ip6 saddr . tcp sport @dyn6 goto pass_in
    drop
  }}
  chain pass_in {{
    ct mark set oifname map @gen
    accept
  }}
  chain to_node {{
    jump spoof
    icmpv6 type {{ nd-neighbor-solicit, nd-neighbor-advert, nd-router-solicit }} accept
    ct state established,related accept
    ip daddr {gw4} meta l4proto {{ tcp, udp }} th dport 53 accept
    goto refuse
  }}
  chain from_node {{
    icmpv6 type {{ nd-neighbor-solicit, nd-neighbor-advert, nd-router-advert }} accept
    ct state established,related accept
    ct state new meta l4proto tcp oifname . tcp dport @expose accept
    reject with icmpx admin-prohibited
  }}
{nat}}}
"#,
            i4 = list(false, &internal),
            i6 = list(true, &internal),
            e4 = list(false, &c.exempt),
            e6 = list(true, &c.exempt),
        )
    }
}

fn add_entry(s: &mut String, e: &Entry) {
    let k = iface(&e.lease);
    let _ = writeln!(
        s,
        "add element inet {TABLE} src4 {{ {k} . {} }}",
        e.lease.v4
    );
    let _ = writeln!(
        s,
        "add element inet {TABLE} src6 {{ {k} . {} }}",
        e.lease.v6
    );
    add_policy(s, e);
}

fn add_policy(s: &mut String, e: &Entry) {
    let k = iface(&e.lease);
    let _ = writeln!(
        s,
        "add element inet {TABLE} gen {{ {k} : {} }}",
        e.generation
    );
    let _ = writeln!(
        s,
        "add element inet {TABLE} live {{ {k} . {} }}",
        e.generation
    );
    for (set, els) in sorted(&e.static_elements) {
        for chunk in els.chunks(1024) {
            let v: Vec<String> = chunk.iter().map(|x| format!("{k} . {x}")).collect();
            let _ = writeln!(s, "add element inet {TABLE} {set} {{ {} }}", v.join(", "));
        }
    }
}

fn delete_elements(s: &mut String, k: &str, els: &Elements) {
    for (set, els) in sorted(els) {
        for chunk in els.chunks(1024) {
            let v: Vec<String> = chunk.iter().map(|x| format!("{k} . {x}")).collect();
            let _ = writeln!(
                s,
                "delete element inet {TABLE} {set} {{ {} }}",
                v.join(", ")
            );
        }
    }
}

fn sorted(e: &Elements) -> Vec<(&'static str, &Vec<String>)> {
    let mut v: Vec<_> = e.sets.iter().map(|(k, v)| (*k, v)).collect();
    v.sort_by_key(|(k, _)| *k);
    v
}

/// Milliseconds on a monotonic clock (the kernel's set timeouts are monotonic too: a wall
/// clock that steps would make the bookkeeping disagree with the table).
fn mono_ms() -> u64 {
    static START: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
    START
        .get_or_init(std::time::Instant::now)
        .elapsed()
        .as_millis() as u64
        + 1
}

/// Runs one `nft -f -` transaction (all of it or nothing).
fn run(script: &str) -> io::Result<()> {
    let mut child = Command::new("nft")
        .args(["-f", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| {
            io::Error::new(e.kind(), format!("running nft (the nftables package): {e}"))
        })?;
    if let Some(mut stdin) = child.stdin.take() {
        stdin.write_all(script.as_bytes())?;
    }
    let out = child.wait_with_output()?;
    if out.status.success() {
        Ok(())
    } else {
        let err = String::from_utf8_lossy(&out.stderr);
        let first: String = err.lines().take(6).collect::<Vec<_>>().join("; ");
        Err(io::Error::other(format!("nft: {first}")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use warren_types::net::{NetRule, NetworkPolicy};

    fn parse(allow: Vec<NetRule>, deny: Vec<NetRule>) -> Policy {
        NetworkPolicy {
            allow,
            deny,
            ..NetworkPolicy::default()
        }
        .parse()
        .unwrap()
    }

    fn rule(cidr: &str, ports: &str, p: Option<Protocol>) -> NetRule {
        NetRule {
            cidr: Some(cidr.into()),
            ports: Some(ports.into()),
            protocol: p,
            ..NetRule::default()
        }
    }

    #[test]
    fn covered_cidrs_go_and_overlapping_ports_become_disjoint() {
        let p = parse(
            vec![
                NetRule::cidr("10.0.0.0/8"),
                NetRule::cidr("10.1.0.0/16"),
                NetRule::cidr("10.0.0.0/8"),
                NetRule::cidr("2001:db8::/32"),
                rule("192.168.0.0/16", "1-100", Some(Protocol::Tcp)),
                rule("192.168.0.0/24", "50-200", Some(Protocol::Tcp)),
                rule("0.0.0.0/0", "53", Some(Protocol::Udp)),
                NetRule::domain("pypi.org"),
            ],
            vec![rule("10.9.0.0/16", "22", None)],
        );
        let e = expand(&p).unwrap();
        assert_eq!(e.sets["any4"], vec!["10.0.0.0/8"]);
        assert_eq!(e.sets["any6"], vec!["2001:db8::/32"]);
        assert_eq!(
            e.sets["allow4"],
            vec![
                "192.168.0.0/16 . tcp . 1-100",
                "192.168.0.0/24 . tcp . 101-200",
                "0.0.0.0/0 . udp . 53-53",
            ]
        );
        assert_eq!(
            e.sets["deny4"],
            vec!["10.9.0.0/16 . tcp . 22-22", "10.9.0.0/16 . udp . 22-22"]
        );
        assert!(!e.sets.contains_key("allow6"));
    }

    #[test]
    fn a_policy_that_explodes_is_refused() {
        // Every address on 2000 single ports, and 100 networks on all ports: each network is
        // cut into 2001 pieces around the single ports, 200,100 entries in all.
        let mut allow: Vec<NetRule> = (1..=2000)
            .map(|k| rule("0.0.0.0/0", &(2 * k).to_string(), Some(Protocol::Tcp)))
            .collect();
        allow.extend(
            (1..=100).map(|j| rule(&format!("10.{j}.0.0/16"), "1-65535", Some(Protocol::Tcp))),
        );
        let e = expand(&parse(allow, vec![])).unwrap_err();
        assert!(e.contains("more than 65536"), "{e}");
        // Many disjoint networks on ranges that overlap are fine: each stays one entry.
        let allow: Vec<NetRule> = (0..2000)
            .map(|i| {
                rule(
                    &format!("10.{}.{}.0/24", i / 256, i % 256),
                    &format!("{}-65535", i + 1),
                    Some(Protocol::Tcp),
                )
            })
            .collect();
        assert_eq!(expand(&parse(allow, vec![])).unwrap().len(), 2000);
    }
}
