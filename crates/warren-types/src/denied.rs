//! The always-denied destinations: private, loopback, link-local, metadata, multicast and
//! translation ranges that no sandbox may reach whatever its policy, and that the control plane
//! does not pull images from. The list is reviewed data, `policy/denied-addresses.txt` (a reason
//! for every range), compiled in; a deployment adds its own (a node's addresses, its pools, its
//! control plane) and opens named ranges again with exemptions ([`Denied`]).

use std::net::IpAddr;
use std::sync::LazyLock;

use crate::net::Cidr;

/// The reviewed list, as written.
pub const SOURCE: &str = include_str!("../policy/denied-addresses.txt");

/// One always-denied range and what it protects.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Range {
    pub cidr: Cidr,
    pub why: &'static str,
}

/// Parses the list's text: `CIDR  why` a line, `#` lines and blank lines skipped.
pub fn parse(text: &'static str) -> Result<Vec<Range>, String> {
    let mut out = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let (cidr, why) = line.split_once(char::is_whitespace).unwrap_or((line, ""));
        let cidr = Cidr::parse(cidr).map_err(|e| format!("line {}: {e}", n + 1))?;
        if cidr.addr.to_string() != cidr.addr.to_string().to_lowercase() {
            return Err(format!("line {}: write {cidr} in lower case", n + 1));
        }
        let why = why.trim();
        if why.is_empty() {
            return Err(format!(
                "line {}: {cidr} says nothing about what it protects",
                n + 1
            ));
        }
        out.push(Range { cidr, why });
    }
    Ok(out)
}

static RANGES: LazyLock<Vec<Range>> =
    LazyLock::new(|| parse(SOURCE).expect("policy/denied-addresses.txt (checked by its tests)"));

/// The reviewed ranges.
pub fn ranges() -> &'static [Range] {
    &RANGES
}

/// The reviewed ranges' CIDRs.
pub fn cidrs() -> Vec<Cidr> {
    ranges().iter().map(|r| r.cidr).collect()
}

/// The reviewed range holding `ip`, if one does.
pub fn reviewed(ip: IpAddr) -> Option<&'static Range> {
    ranges().iter().find(|r| r.cidr.contains(ip))
}

/// A deployment's denied destinations: the reviewed ranges, its own (`extra`), less what an
/// operator exempted. An address inside an exemption is allowed, even when a wider denied
/// range holds it — unless it is pinned (the deployment's own machines: no exemption opens
/// them).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Denied {
    pub deny: Vec<Cidr>,
    pub exempt: Vec<Cidr>,
    /// Denied whatever the exemptions say.
    pub pinned: Vec<Cidr>,
}

impl Denied {
    /// The reviewed ranges plus `extra`, less `exempt`.
    pub fn new(extra: &[Cidr], exempt: &[Cidr]) -> Denied {
        let mut deny = cidrs();
        deny.extend_from_slice(extra);
        Denied {
            deny,
            exempt: exempt.to_vec(),
            pinned: Vec::new(),
        }
    }

    /// Denies `more` too, whatever the exemptions say.
    pub fn pin(&mut self, more: impl IntoIterator<Item = Cidr>) {
        self.pinned.extend(more);
    }

    /// The denied range that holds `ip`, unless an exemption holds it. An IPv4-mapped IPv6
    /// address is judged as the IPv4 address too.
    pub fn denies(&self, ip: IpAddr) -> Option<Cidr> {
        let mapped = match ip {
            IpAddr::V6(a) => a.to_ipv4_mapped().map(IpAddr::V4),
            IpAddr::V4(_) => None,
        };
        let judge = mapped.unwrap_or(ip);
        if let Some(p) = self
            .pinned
            .iter()
            .find(|p| p.contains(judge) || p.contains(ip))
        {
            return Some(*p);
        }
        if self.exempt.iter().any(|e| e.contains(judge)) {
            return None;
        }
        self.deny
            .iter()
            .find(|d| d.contains(ip) || mapped.is_some_and(|m| d.contains(m)))
            .copied()
    }

    /// The denied space as plain ranges, exemptions cut out of them (for checks that take one
    /// list).
    pub fn effective(&self) -> Vec<Cidr> {
        let mut v = subtract(&self.deny, &self.exempt);
        v.extend(self.pinned.iter().copied());
        v
    }
}

/// `from` less every address of `holes`, as CIDRs (a range partly inside a hole is split into
/// the halves that are not).
pub fn subtract(from: &[Cidr], holes: &[Cidr]) -> Vec<Cidr> {
    let mut out = Vec::new();
    let mut work: Vec<Cidr> = from.iter().map(Cidr::normalized).collect();
    while let Some(c) = work.pop() {
        if holes.iter().any(|h| h.covers(&c)) {
            continue;
        }
        if !holes.iter().any(|h| c.covers(h)) {
            out.push(c);
            continue;
        }
        work.extend(halves(&c));
    }
    out.sort_by_key(|c| (c.addr.is_ipv6(), c.addr, c.prefix));
    out
}

/// The two halves of `c` (which has room for them: a hole strictly inside it).
fn halves(c: &Cidr) -> [Cidr; 2] {
    let p = c.prefix + 1;
    let hi = match c.network() {
        IpAddr::V4(a) => IpAddr::V4((u32::from(a) | (1u32 << (32 - p as u32))).into()),
        IpAddr::V6(a) => IpAddr::V6((u128::from(a) | (1u128 << (128 - p as u32))).into()),
    };
    [
        Cidr {
            addr: c.network(),
            prefix: p,
        },
        Cidr {
            addr: hi,
            prefix: p,
        },
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn cidr(s: &str) -> Cidr {
        Cidr::parse(s).unwrap()
    }

    #[test]
    fn pinned_ranges_stay_denied_inside_an_exemption() {
        let mut d = Denied::new(&[], &[cidr("10.0.0.0/8")]);
        assert_eq!(d.denies(ip("10.1.2.3")), None);
        d.pin([cidr("10.1.2.3/32")]);
        assert_eq!(d.denies(ip("10.1.2.3")), Some(cidr("10.1.2.3/32")));
        assert_eq!(d.denies(ip("::ffff:10.1.2.3")), Some(cidr("10.1.2.3/32")));
        assert_eq!(d.denies(ip("10.1.2.4")), None);
        assert!(d.effective().contains(&cidr("10.1.2.3/32")));
    }

    #[test]
    fn the_list_parses_and_gives_a_reason_for_every_range() {
        let r = parse(SOURCE).unwrap();
        assert!(r.len() > 20, "{r:?}");
        for x in &r {
            assert!(x.why.len() > 15, "{}: say what it protects", x.cidr);
        }
        assert!(parse("10.0.0.0/8\n").unwrap_err().contains("says nothing"));
        assert!(parse("10.0.0.1/8 x\n").unwrap_err().contains("host bits"));
    }

    #[test]
    fn no_range_covers_another() {
        let r = ranges();
        for a in r {
            for b in r {
                if a != b {
                    assert!(
                        !a.cidr.covers(&b.cidr),
                        "{} covers {}: say so in its reason and drop the narrower one",
                        a.cidr,
                        b.cidr
                    );
                }
            }
        }
    }

    #[test]
    fn every_range_the_review_named_is_denied() {
        // Security review, issue 29: the private space and the translation prefixes, on top of
        // loopback, link-local and metadata.
        for c in [
            "10.0.0.0/8",
            "172.16.0.0/12",
            "192.168.0.0/16",
            "100.64.0.0/10",
            "198.18.0.0/15",
            "fc00::/7",
            "64:ff9b::/96",
            "2002::/16",
            "127.0.0.0/8",
            "169.254.0.0/16",
            "0.0.0.0/8",
            "::1/128",
            "::/128",
            "::ffff:0:0/96",
            "fe80::/10",
            "224.0.0.0/4",
            "240.0.0.0/4",
            "ff00::/8",
        ] {
            let c = cidr(c);
            assert!(
                ranges().iter().any(|r| r.cidr.covers(&c)),
                "{c} is not always denied"
            );
        }
        let d = Denied::new(&[], &[]);
        for a in [
            "169.254.169.254",
            "100.100.100.200",
            "168.63.129.16",
            "fd00:ec2::254",
            "10.200.0.1",
            "172.17.0.1",
            "192.168.1.1",
            "100.64.0.1",
            "198.19.255.255",
            "::ffff:10.0.0.1",
            "::ffff:8.8.8.8",
            "64:ff9b::a00:1",
            "2002:a00:1::1",
            "255.255.255.255",
        ] {
            assert!(d.denies(ip(a)).is_some(), "{a}");
        }
    }

    #[test]
    fn public_and_documentation_addresses_are_not_denied() {
        let d = Denied::new(&[], &[]);
        for a in [
            "8.8.8.8",
            "1.1.1.1",
            "151.101.0.223",
            "2606:4700:4700::1111",
            "2a04:4e42::223",
            "198.51.100.1",
            "203.0.113.9",
            "192.0.2.1",
            "2001:db8::1",
            "172.32.0.1",
            "100.128.0.1",
            "11.0.0.1",
        ] {
            assert_eq!(d.denies(ip(a)), None, "{a}");
        }
    }

    #[test]
    fn exemptions_open_part_of_a_range_and_extra_ranges_close_more() {
        let d = Denied::new(&[cidr("203.0.113.7/32")], &[cidr("10.1.0.0/16")]);
        assert_eq!(d.denies(ip("10.1.2.3")), None);
        assert_eq!(d.denies(ip("::ffff:10.1.2.3")), None);
        assert_eq!(d.denies(ip("10.2.0.1")), Some(cidr("10.0.0.0/8")));
        assert_eq!(d.denies(ip("203.0.113.7")), Some(cidr("203.0.113.7/32")));
        let eff = d.effective();
        assert!(!eff.iter().any(|c| c.contains(ip("10.1.2.3"))), "{eff:?}");
        assert!(eff.iter().any(|c| c.contains(ip("10.2.0.1"))), "{eff:?}");
        assert!(
            eff.iter().any(|c| c.contains(ip("10.0.255.255"))),
            "{eff:?}"
        );
        assert!(!eff.iter().any(|c| c.contains(ip("10.1.255.255"))));
    }

    #[test]
    fn subtract_splits_around_holes() {
        let s = subtract(&[cidr("10.0.0.0/8")], &[cidr("10.1.0.0/16")]);
        assert_eq!(s.len(), 8, "{s:?}");
        assert!(s.contains(&cidr("10.0.0.0/16")));
        assert!(s.contains(&cidr("10.128.0.0/9")));
        assert_eq!(
            subtract(&[cidr("10.0.0.0/8")], &[cidr("10.0.0.0/7")]),
            vec![]
        );
        assert_eq!(
            subtract(&[cidr("fc00::/7")], &[cidr("fd77::1/128")]).len(),
            121
        );
    }
}
