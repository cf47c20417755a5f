//! Network policy: what a sandbox may reach, as users write it, and its parsed form.
//!
//! A sandbox's network is `none` (loopback only, no interface) or `filtered` (the default): an
//! interface to its node, with every outbound connection denied unless an `allow` rule matches
//! and no `deny` rule does. Rules name a CIDR or a domain (`pypi.org`, or `*.pythonhosted.org`
//! for every name under it), optionally ports and a protocol. Some destinations — the node's own
//! addresses, the control plane, other sandboxes, loopback, link-local and cloud metadata
//! addresses — are never reachable whatever the rules say, unless the node's administrator
//! allows them.

use std::collections::HashSet;
use std::net::IpAddr;

use serde::{Deserialize, Serialize};

/// Most rules in each of `allow` and `deny`.
pub const MAX_RULES: usize = 4096;

/// Most ports one sandbox may expose.
pub const MAX_EXPOSED: usize = 32;

/// Whether a sandbox has a network interface.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "lowercase")]
pub enum NetworkMode {
    /// Loopback only: no interface, nothing outside the sandbox reachable. The cheapest.
    None,
    /// An interface to the node; outbound traffic denied unless allowed.
    #[default]
    Filtered,
}

/// A transport protocol a rule applies to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "lowercase")]
pub enum Protocol {
    /// TCP.
    Tcp,
    /// UDP.
    Udp,
}

/// One rule: a destination (a CIDR, a domain, or neither for any address), optional ports
/// and protocol.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct NetRule {
    /// An address or CIDR, IPv4 or IPv6: `10.1.2.3`, `10.0.0.0/8`, `2001:db8::/32`. Host bits
    /// must be zero.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(
        feature = "openapi",
        schema(pattern = "^[0-9A-Fa-f:.]+(/[0-9]{1,3})?$")
    )]
    pub cidr: Option<String>,
    /// A domain: `pypi.org` (that name only) or `*.pythonhosted.org` (every name under it, not
    /// the name itself). ASCII (`xn--` for international names). TCP only: a domain allows the
    /// addresses the node's resolver gave the sandbox for it, for their TTL.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(
        feature = "openapi",
        schema(
            pattern = "^(\\*\\.)?[A-Za-z0-9_]([A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?(\\.[A-Za-z0-9_]([A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?)*\\.?$",
            max_length = 253
        )
    )]
    pub domain: Option<String>,
    /// A port (`443`) or range (`8000-8100`); none: every port (and, for a CIDR without a
    /// protocol, ICMP too).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(pattern = "^[0-9]{1,5}(-[0-9]{1,5})?$"))]
    pub ports: Option<String>,
    /// `tcp` or `udp`; none: both (a domain rule is always TCP).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub protocol: Option<Protocol>,
}

/// A sandbox's network policy.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct NetworkPolicy {
    /// `filtered` (default): an interface, outbound denied unless allowed. `none`: loopback
    /// only.
    #[serde(default)]
    pub mode: NetworkMode,
    /// What the sandbox may reach (at most 4096 rules).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[cfg_attr(feature = "openapi", schema(max_items = 4096))]
    pub allow: Vec<NetRule>,
    /// What it may not, even where an allow rule matches (at most 4096 rules).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[cfg_attr(feature = "openapi", schema(max_items = 4096))]
    pub deny: Vec<NetRule>,
    /// TCP ports of the sandbox reachable from outside it (at most 32; mode `filtered`).
    /// Inbound connections are denied except to these. Each gets a port on its node's host
    /// (`exposed` in the sandbox's network status) and, where the control plane has a
    /// `sandbox_domain`, the address `<port>-<sandbox id>.<domain>`. A service must listen on
    /// the sandbox's interface (`0.0.0.0` or `::`), not only on loopback.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[cfg_attr(
        feature = "openapi",
        schema(max_items = 32, value_type = Vec<u16>, minimum = 1, maximum = 65535)
    )]
    pub expose: Vec<u16>,
}

/// A port of a sandbox reachable from outside it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ExposedPort {
    /// The sandbox's port (TCP).
    pub port: u16,
    /// Where the node's host takes connections for it: `ADDRESS:PORT` (the node's
    /// `[node.network] expose_address` and a port of its `expose_ports` range).
    pub host: String,
}

/// A sandbox's network as it stands: `GET`/`PUT /v1/sandboxes/{id}/network`, and in its info.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct NetworkStatus {
    /// `filtered` or `none`.
    pub mode: NetworkMode,
    /// Its IPv4 address (mode `filtered`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ipv4: Option<String>,
    /// Its IPv6 address (mode `filtered`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ipv6: Option<String>,
    /// Its gateway: the node, and its only DNS resolver (mode `filtered`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gateway: Option<String>,
    /// Its allow rules.
    #[serde(default)]
    pub allow: Vec<NetRule>,
    /// Its deny rules.
    #[serde(default)]
    pub deny: Vec<NetRule>,
    /// Its exposed ports and where the node's host takes connections for each.
    #[serde(default)]
    pub exposed: Vec<ExposedPort>,
}

impl NetworkPolicy {
    /// Loopback only.
    pub fn none() -> NetworkPolicy {
        NetworkPolicy {
            mode: NetworkMode::None,
            ..NetworkPolicy::default()
        }
    }

    /// Every public address, every port: `0.0.0.0/0` and `::/0`, which the always-denied
    /// ranges (`crate::denied`: private networks, loopback, link-local, metadata, ...) narrow.
    pub fn internet() -> NetworkPolicy {
        NetworkPolicy {
            mode: NetworkMode::Filtered,
            allow: vec![NetRule::cidr("0.0.0.0/0"), NetRule::cidr("::/0")],
            deny: Vec::new(),
            expose: Vec::new(),
        }
    }

    /// Checks every rule and returns the parsed policy, or says what is wrong with which
    /// rule.
    pub fn parse(&self) -> Result<Policy, String> {
        if self.mode == NetworkMode::None && !(self.allow.is_empty() && self.deny.is_empty()) {
            return Err(
                "network mode `none` has no interface, so it takes no rules: use mode \
                 `filtered` with the rules"
                    .into(),
            );
        }
        if self.mode == NetworkMode::None && !self.expose.is_empty() {
            return Err(
                "network mode `none` has no interface, so it exposes no ports: use mode \
                 `filtered` with `expose`"
                    .into(),
            );
        }
        if self.expose.len() > MAX_EXPOSED {
            return Err(format!(
                "{} exposed ports is more than {MAX_EXPOSED}: expose fewer (one port can serve \
                 many paths through a reverse proxy in the sandbox)",
                self.expose.len()
            ));
        }
        if self.expose.contains(&0) {
            return Err("expose: port 0 is not a port; give ports 1-65535".into());
        }
        let mut expose = self.expose.clone();
        expose.sort_unstable();
        expose.dedup();
        let mut out = Policy {
            mode: self.mode,
            expose,
            ..Policy::default()
        };
        for (name, rules, into) in [
            ("allow", &self.allow, &mut out.allow),
            ("deny", &self.deny, &mut out.deny),
        ] {
            if rules.len() > MAX_RULES {
                return Err(format!(
                    "{} {name} rules is more than {MAX_RULES}: use wider CIDRs or `*.` domains",
                    rules.len()
                ));
            }
            for (i, r) in rules.iter().enumerate() {
                into.push(r.parse().map_err(|e| format!("{name}[{i}]: {e}"))?);
            }
        }
        Ok(out)
    }
}

impl NetRule {
    /// Every port and protocol of `cidr`.
    pub fn cidr(cidr: &str) -> NetRule {
        NetRule {
            cidr: Some(cidr.into()),
            ..NetRule::default()
        }
    }

    /// TCP to the addresses of `domain`.
    pub fn domain(domain: &str) -> NetRule {
        NetRule {
            domain: Some(domain.into()),
            ..NetRule::default()
        }
    }

    /// Parses the rule.
    pub fn parse(&self) -> Result<Rule, String> {
        let ports = match &self.ports {
            Some(p) => Some(PortRange::parse(p)?),
            None => None,
        };
        let target = match (&self.cidr, &self.domain) {
            (Some(_), Some(_)) => {
                return Err("a rule names a cidr or a domain, not both: make two rules".into());
            }
            (Some(c), None) => Target::Cidr(Cidr::parse(c)?),
            (None, Some(d)) => {
                if self.protocol == Some(Protocol::Udp) {
                    return Err(format!(
                        "domain {d:?} with protocol udp: a domain allows TCP only (QUIC and \
                         other UDP need a cidr rule)"
                    ));
                }
                Target::Domain(DomainPattern::parse(d)?)
            }
            (None, None) => {
                if ports.is_none() {
                    return Err(
                        "a rule needs a cidr, a domain or ports: for every address use cidr \
                         `0.0.0.0/0` and `::/0`"
                            .into(),
                    );
                }
                Target::Any
            }
        };
        let protocol = match target {
            Target::Domain(_) => Some(Protocol::Tcp),
            _ => self.protocol,
        };
        Ok(Rule {
            target,
            ports,
            protocol,
        })
    }
}

/// A parsed policy.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Policy {
    /// Interface or not.
    pub mode: NetworkMode,
    /// Allow rules.
    pub allow: Vec<Rule>,
    /// Deny rules.
    pub deny: Vec<Rule>,
    /// Exposed TCP ports, sorted, once each.
    pub expose: Vec<u16>,
}

impl Policy {
    /// The domain patterns of its allow rules, for the resolver.
    pub fn allowed_domains(&self) -> DomainSet {
        let mut set = DomainSet::default();
        for r in &self.allow {
            if let Target::Domain(d) = &r.target {
                set.insert(d.clone());
            }
        }
        set
    }

    /// The domain patterns of its deny rules.
    pub fn denied_domains(&self) -> DomainSet {
        let mut set = DomainSet::default();
        for r in &self.deny {
            if let Target::Domain(d) = &r.target {
                set.insert(d.clone());
            }
        }
        set
    }
}

/// A parsed rule.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rule {
    /// What it names.
    pub target: Target,
    /// Its ports; none: all.
    pub ports: Option<PortRange>,
    /// Its protocol; none: TCP and UDP (and ICMP for a CIDR without ports).
    pub protocol: Option<Protocol>,
}

/// What a rule names.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Target {
    /// Every address (a rule of ports only).
    Any,
    /// The addresses of a CIDR.
    Cidr(Cidr),
    /// The addresses a domain resolves to.
    Domain(DomainPattern),
}

/// An inclusive port range, 1 to 65535.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct PortRange {
    /// First port.
    pub lo: u16,
    /// Last port.
    pub hi: u16,
}

impl PortRange {
    /// Parses `443` or `8000-8100`.
    pub fn parse(s: &str) -> Result<PortRange, String> {
        let bad = || {
            format!("ports {s:?} are not valid: give a port (1-65535) or a range such as 8000-8100")
        };
        let port = |p: &str| -> Result<u16, String> {
            match p.trim().parse::<u32>() {
                Ok(n) if (1..=65535).contains(&n) => Ok(n as u16),
                _ => Err(bad()),
            }
        };
        let (lo, hi) = match s.split_once('-') {
            Some((a, b)) => (port(a)?, port(b)?),
            None => {
                let p = port(s)?;
                (p, p)
            }
        };
        if lo > hi {
            return Err(format!(
                "ports {s:?}: the range ends before it starts; write it low-high"
            ));
        }
        Ok(PortRange { lo, hi })
    }
}

impl std::fmt::Display for PortRange {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.lo == self.hi {
            write!(f, "{}", self.lo)
        } else {
            write!(f, "{}-{}", self.lo, self.hi)
        }
    }
}

/// An IPv4 or IPv6 network.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Cidr {
    /// Its first address.
    pub addr: IpAddr,
    /// Its prefix length.
    pub prefix: u8,
}

impl Cidr {
    /// Parses `10.0.0.0/8`, `2001:db8::/32` or a lone address (a /32 or /128). Host bits must
    /// be zero, so a typo does not silently widen or move the range.
    pub fn parse(s: &str) -> Result<Cidr, String> {
        let (a, p) = match s.split_once('/') {
            Some((a, p)) => (a, Some(p)),
            None => (s, None),
        };
        let addr: IpAddr = a.trim().parse().map_err(|_| {
            format!("cidr {s:?} is not valid: give an address or address/prefix, e.g. 10.0.0.0/8")
        })?;
        let max = if addr.is_ipv4() { 32 } else { 128 };
        let prefix = match p {
            Some(p) => match p.trim().parse::<u8>() {
                Ok(n) if n <= max => n,
                _ => return Err(format!("cidr {s:?}: the prefix length must be 0 to {max}")),
            },
            None => max,
        };
        let c = Cidr { addr, prefix };
        if c.network() != addr {
            return Err(format!(
                "cidr {s:?} has host bits set: did you mean {}/{prefix}?",
                c.network()
            ));
        }
        Ok(c)
    }

    /// Its first address (the address with the host bits cleared).
    pub fn network(&self) -> IpAddr {
        match self.addr {
            IpAddr::V4(a) => {
                let m = if self.prefix == 0 {
                    0
                } else {
                    u32::MAX << (32 - self.prefix as u32)
                };
                IpAddr::V4((u32::from(a) & m).into())
            }
            IpAddr::V6(a) => {
                let m = if self.prefix == 0 {
                    0
                } else {
                    u128::MAX << (128 - self.prefix as u32)
                };
                IpAddr::V6((u128::from(a) & m).into())
            }
        }
    }

    /// Its last address.
    pub fn last(&self) -> IpAddr {
        match self.network() {
            IpAddr::V4(a) => {
                let h = if self.prefix == 0 {
                    u32::MAX
                } else {
                    (1u32 << (32 - self.prefix as u32)).wrapping_sub(1)
                };
                IpAddr::V4((u32::from(a) | h).into())
            }
            IpAddr::V6(a) => {
                let h = if self.prefix == 0 {
                    u128::MAX
                } else {
                    (1u128 << (128 - self.prefix as u32)).wrapping_sub(1)
                };
                IpAddr::V6((u128::from(a) | h).into())
            }
        }
    }

    /// Whether `ip` is in it.
    pub fn contains(&self, ip: IpAddr) -> bool {
        match (self.network(), ip) {
            (IpAddr::V4(_), IpAddr::V4(_)) | (IpAddr::V6(_), IpAddr::V6(_)) => {
                Cidr {
                    addr: ip,
                    prefix: self.prefix,
                }
                .network()
                    == self.network()
            }
            _ => false,
        }
    }

    /// The same network with its host bits cleared.
    pub fn normalized(&self) -> Cidr {
        Cidr {
            addr: self.network(),
            prefix: self.prefix,
        }
    }

    /// Whether all of `other` is inside it.
    pub fn covers(&self, other: &Cidr) -> bool {
        self.prefix <= other.prefix && self.contains(other.addr)
    }
}

impl std::fmt::Display for Cidr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.addr, self.prefix)
    }
}

/// A domain pattern: one name, or every name under a suffix.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum DomainPattern {
    /// Exactly this name (lower case, no trailing dot).
    Exact(String),
    /// Every name strictly under this one (`*.example.com` matches `a.example.com` and
    /// `a.b.example.com`, not `example.com`).
    Suffix(String),
}

impl DomainPattern {
    /// Parses `name` or `*.name`. Names are ASCII (international names in their `xn--` form),
    /// of labels of 1 to 63 letters, digits, `-` and `_`, 253 characters at most.
    pub fn parse(s: &str) -> Result<DomainPattern, String> {
        let lower = s.trim().trim_end_matches('.').to_ascii_lowercase();
        let (wild, name) = match lower.strip_prefix("*.") {
            Some(rest) => (true, rest),
            None => (false, lower.as_str()),
        };
        check_name(name).map_err(|why| {
            format!(
                "domain {s:?} is not valid ({why}): give a name such as `pypi.org` or \
                 `*.pythonhosted.org`"
            )
        })?;
        Ok(if wild {
            DomainPattern::Suffix(name.into())
        } else {
            DomainPattern::Exact(name.into())
        })
    }

    /// Whether `name` (any case, trailing dot or not) matches.
    pub fn matches(&self, name: &str) -> bool {
        let mut set = DomainSet::default();
        set.insert(self.clone());
        set.matches(name)
    }
}

impl std::fmt::Display for DomainPattern {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DomainPattern::Exact(n) => f.write_str(n),
            DomainPattern::Suffix(n) => write!(f, "*.{n}"),
        }
    }
}

fn check_name(name: &str) -> Result<(), &'static str> {
    if name.is_empty() {
        return Err("empty name");
    }
    if name.len() > 253 {
        return Err("longer than 253 characters");
    }
    for label in name.split('.') {
        if label.is_empty() || label.len() > 63 {
            return Err("each label must be 1 to 63 characters");
        }
        if !label
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        {
            return Err("only letters, digits, `-` and `_` (and a leading `*.`)");
        }
        if label.starts_with('-') || label.ends_with('-') {
            return Err("a label may not start or end with `-`");
        }
    }
    Ok(())
}

/// A set of domain patterns that matches a name in time proportional to its number of labels,
/// however many patterns it holds.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DomainSet {
    exact: HashSet<String>,
    suffixes: HashSet<String>,
}

impl DomainSet {
    /// Adds a pattern.
    pub fn insert(&mut self, p: DomainPattern) {
        match p {
            DomainPattern::Exact(n) => self.exact.insert(n),
            DomainPattern::Suffix(n) => self.suffixes.insert(n),
        };
    }

    /// Whether it holds no pattern.
    pub fn is_empty(&self) -> bool {
        self.exact.is_empty() && self.suffixes.is_empty()
    }

    /// Whether some pattern matches `name` (any case, with or without its trailing dot).
    pub fn matches(&self, name: &str) -> bool {
        let name = name.strip_suffix('.').unwrap_or(name);
        let lower;
        let name = if name.bytes().any(|b| b.is_ascii_uppercase()) {
            lower = name.to_ascii_lowercase();
            lower.as_str()
        } else {
            name
        };
        if self.exact.contains(name) {
            return true;
        }
        if self.suffixes.is_empty() {
            return false;
        }
        let mut rest = name;
        while let Some((_, tail)) = rest.split_once('.') {
            if self.suffixes.contains(tail) {
                return true;
            }
            rest = tail;
        }
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cidrs_parse_and_refuse_host_bits() {
        let c = Cidr::parse("10.0.0.0/8").unwrap();
        assert!(c.contains("10.200.3.4".parse().unwrap()));
        assert!(!c.contains("11.0.0.1".parse().unwrap()));
        assert!(!c.contains("::1".parse().unwrap()));
        assert_eq!(c.last().to_string(), "10.255.255.255");
        assert_eq!(Cidr::parse("1.2.3.4").unwrap().prefix, 32);
        assert_eq!(Cidr::parse("2001:db8::/32").unwrap().prefix, 32);
        assert_eq!(
            Cidr::parse("0.0.0.0/0").unwrap().last().to_string(),
            "255.255.255.255"
        );
        let e = Cidr::parse("10.0.0.1/8").unwrap_err();
        assert!(e.contains("did you mean 10.0.0.0/8"), "{e}");
        assert!(Cidr::parse("10.0.0.0/33").unwrap_err().contains("0 to 32"));
        assert!(Cidr::parse("banana").unwrap_err().contains("not valid"));
        assert!(
            Cidr::parse("10.0.0.0/8")
                .unwrap()
                .covers(&Cidr::parse("10.1.0.0/16").unwrap())
        );
        assert!(
            !Cidr::parse("10.1.0.0/16")
                .unwrap()
                .covers(&Cidr::parse("10.0.0.0/8").unwrap())
        );
    }

    #[test]
    fn ports_parse() {
        assert_eq!(
            PortRange::parse("443").unwrap(),
            PortRange { lo: 443, hi: 443 }
        );
        assert_eq!(
            PortRange::parse("8000-8100").unwrap(),
            PortRange { lo: 8000, hi: 8100 }
        );
        for bad in ["0", "65536", "x", "10-5", "-1", ""] {
            assert!(PortRange::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn domains_match_exactly_or_strictly_under() {
        let mut set = DomainSet::default();
        set.insert(DomainPattern::parse("PyPI.org.").unwrap());
        set.insert(DomainPattern::parse("*.pythonhosted.org").unwrap());
        assert!(set.matches("pypi.org"));
        assert!(set.matches("PYPI.ORG."));
        assert!(!set.matches("evil-pypi.org"));
        assert!(!set.matches("www.pypi.org"));
        assert!(set.matches("files.pythonhosted.org"));
        assert!(set.matches("a.b.pythonhosted.org"));
        assert!(!set.matches("pythonhosted.org"));
        assert!(!set.matches("pythonhosted.org.evil.com"));
        assert!(!set.matches("xpythonhosted.org"));
        for bad in [
            "",
            "*",
            "*.",
            "a..b",
            "a b.com",
            "-a.com",
            "ünï.com",
            "*.*.com",
        ] {
            assert!(DomainPattern::parse(bad).is_err(), "{bad:?}");
        }
        assert!(DomainPattern::parse(&"a.".repeat(130)).is_err());
    }

    #[test]
    fn policies_parse_and_say_which_rule_is_wrong() {
        let p = NetworkPolicy {
            mode: NetworkMode::Filtered,
            allow: vec![
                NetRule::domain("pypi.org"),
                NetRule {
                    ports: Some("53".into()),
                    protocol: Some(Protocol::Udp),
                    ..NetRule::default()
                },
            ],
            deny: vec![NetRule::cidr("10.0.0.0/9")],
            expose: vec![8080, 80, 8080],
        };
        let parsed = p.parse().unwrap();
        assert_eq!(parsed.expose, vec![80, 8080], "sorted, once each");
        assert_eq!(parsed.allow[0].protocol, Some(Protocol::Tcp));
        assert!(parsed.allowed_domains().matches("pypi.org"));
        let e = NetworkPolicy {
            deny: vec![NetRule::cidr("10.0.0.1/8")],
            ..p.clone()
        }
        .parse()
        .unwrap_err();
        assert!(e.starts_with("deny[0]:"), "{e}");
        let e = NetworkPolicy {
            allow: vec![NetRule::default()],
            ..NetworkPolicy::default()
        }
        .parse()
        .unwrap_err();
        assert!(e.contains("needs a cidr"), "{e}");
        let e = NetworkPolicy {
            mode: NetworkMode::None,
            allow: vec![NetRule::cidr("1.2.3.4")],
            ..NetworkPolicy::default()
        }
        .parse()
        .unwrap_err();
        assert!(e.contains("takes no rules"), "{e}");
        let e = NetworkPolicy {
            expose: vec![8000],
            ..NetworkPolicy::none()
        }
        .parse()
        .unwrap_err();
        assert!(e.contains("exposes no ports"), "{e}");
        let e = NetworkPolicy {
            expose: vec![0],
            ..NetworkPolicy::default()
        }
        .parse()
        .unwrap_err();
        assert!(e.contains("port 0"), "{e}");
        let e = NetworkPolicy {
            expose: (1..=40).collect(),
            ..NetworkPolicy::default()
        }
        .parse()
        .unwrap_err();
        assert!(e.contains("more than 32"), "{e}");
        let udp_domain = NetRule {
            protocol: Some(Protocol::Udp),
            ..NetRule::domain("a.com")
        };
        assert!(udp_domain.parse().unwrap_err().contains("TCP only"));
        let json: NetworkPolicy =
            serde_json::from_str(r#"{"allow":[{"cidr":"1.2.3.0/24","ports":"80"}]}"#).unwrap();
        assert_eq!(json.mode, NetworkMode::Filtered);
        assert!(serde_json::from_str::<NetworkPolicy>(r#"{"alow":[]}"#).is_err());
    }
}
