//! A policy's static elements: what its CIDR rules expand to, per set, made disjoint (the
//! kernel's interval sets refuse overlaps) and bounded in number.

use std::collections::HashMap;
use std::fmt;
use std::net::IpAddr;

use warren_types::net::{Cidr, Policy, PortRange, Protocol, Target};

use super::MAX_ELEMENTS;
use super::element::{Element, Field, Set, proto_name};

/// One element of a policy, without the interface that keys it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Member {
    /// A whole CIDR, every protocol (`any*`, `denyany*`).
    Net(Cidr),
    /// A CIDR by protocol and ports (`allow*`, `deny*`).
    Port(Cidr, Protocol, PortRange),
    /// A TCP port the node may open connections to (`expose`).
    Exposed(u16),
}

impl Member {
    /// The element keyed by `key`: a shared policy's id (its rules), or an interface (the
    /// exposed ports, which are each sandbox's own).
    pub(crate) fn element(&self, key: Field) -> Element {
        Element::new(match *self {
            Member::Net(c) => vec![key, Field::Net(c)],
            Member::Port(c, p, r) => vec![key, Field::Net(c), Field::Proto(p), Field::Ports(r)],
            Member::Exposed(p) => vec![key, Field::Port(p)],
        })
    }
}

impl fmt::Display for Member {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Member::Net(c) => write!(f, "{}", Field::Net(*c)),
            Member::Port(c, p, r) => write!(
                f,
                "{} . {} . {}",
                Field::Net(*c),
                proto_name(*p),
                Field::Ports(*r)
            ),
            Member::Exposed(p) => write!(f, "{p}"),
        }
    }
}

/// The elements one sandbox holds, per set.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Elements {
    /// Set → its members (without the interface key).
    pub(crate) sets: HashMap<Set, Vec<Member>>,
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

    /// Its rules (which sandboxes with the same rules share) and its exposed ports (each
    /// sandbox's own), apart.
    pub(crate) fn split(&self) -> (Elements, Vec<Member>) {
        let mut rules = self.clone();
        let expose = rules.sets.remove(&Set::Expose).unwrap_or_default();
        (rules, expose)
    }

    /// The rules in one canonical text: equal for two policies exactly when their rules'
    /// elements are (what sandboxes share them by).
    pub(crate) fn canonical(&self) -> String {
        let mut out = String::new();
        for (set, members) in self.sorted() {
            if set == Set::Expose {
                continue;
            }
            let mut v: Vec<String> = members.iter().map(Member::to_string).collect();
            v.sort_unstable();
            out.push_str(set.name());
            out.push('{');
            out.push_str(&v.join(","));
            out.push('}');
        }
        out
    }

    /// Set by set, in a stable order.
    pub(crate) fn sorted(&self) -> Vec<(Set, &Vec<Member>)> {
        let mut v: Vec<_> = self.sets.iter().map(|(k, v)| (*k, v)).collect();
        v.sort_by_key(|(k, _)| *k);
        v
    }
}

/// The elements a parsed policy expands to (without the interface key), or why it cannot.
pub fn expand(policy: &Policy) -> Result<Elements, String> {
    let mut out = Elements::default();
    for (rules, any_sets, port_sets) in [
        (
            &policy.allow,
            [Set::Any4, Set::Any6],
            [Set::Allow4, Set::Allow6],
        ),
        (
            &policy.deny,
            [Set::DenyAny4, Set::DenyAny6],
            [Set::Deny4, Set::Deny6],
        ),
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
            set.extend(list.iter().map(|c| Member::Net(*c)));
        }
        let mut protos: Vec<_> = by_port.keys().copied().collect();
        protos.sort_by_key(|p| proto_name(*p));
        for p in protos {
            for fam in 0..2 {
                let pieces = disjoint(&by_port[&p][fam], MAX_ELEMENTS)?;
                let set = out.sets.entry(port_sets[fam]).or_default();
                set.extend(pieces.iter().map(|(c, r)| Member::Port(*c, p, *r)));
            }
        }
    }
    // Exposed ports: the node may open connections to these (its forwarders do).
    out.sets
        .entry(Set::Expose)
        .or_default()
        .extend(policy.expose.iter().map(|p| Member::Exposed(*p)));
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
pub(crate) fn outermost(list: &[Cidr]) -> Vec<Cidr> {
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
        let text = |s: Set| -> Vec<String> { e.sets[&s].iter().map(Member::to_string).collect() };
        assert_eq!(text(Set::Any4), vec!["10.0.0.0/8"]);
        assert_eq!(text(Set::Any6), vec!["2001:db8::/32"]);
        assert_eq!(
            text(Set::Allow4),
            vec![
                "192.168.0.0/16 . tcp . 1-100",
                "192.168.0.0/24 . tcp . 101-200",
                "0.0.0.0/0 . udp . 53-53",
            ]
        );
        assert_eq!(
            text(Set::Deny4),
            vec!["10.9.0.0/16 . tcp . 22-22", "10.9.0.0/16 . udp . 22-22"]
        );
        assert!(!e.sets.contains_key(&Set::Allow6));
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
