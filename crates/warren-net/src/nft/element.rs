//! Set elements as typed values, and the two forms they are written in: the bytes the kernel
//! stores (for netlink batches) and nft's text (for [`super::Firewall::install`]'s script).
//!
//! A key is a concatenation of fields, each padded to 4 bytes as nft lays them out:
//! `ifname` 16 bytes (IFNAMSIZ, NUL-padded), `ipv4_addr` 4, `ipv6_addr` 16, `inet_proto` 1
//! (+3), `inet_service` 2 big-endian (+2), `mark` 4 in host order (nft's `mark` type is
//! host-endian). In an interval set every element is a range: the key holds each field's
//! start and the key's end each field's end (a CIDR is its network address to its last one).

use std::fmt;
use std::net::IpAddr;

use netlink_packet_core::DefaultNla;
use netlink_packet_netfilter::nftables::{DataAttribute, SetElementAttribute};
use warren_types::net::{Cidr, PortRange, Protocol};

/// `NFTA_DATA_VALUE`: raw data inside a key, a key's end or a map's value.
const NFTA_DATA_VALUE: u16 = 1;

/// Interface names are at most this long (IFNAMSIZ, with the NUL).
const IFNAMSIZ: usize = 16;

/// The sets and maps of the table that hold per-sandbox elements.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) enum Set {
    Src4,
    Src6,
    Gen,
    Live,
    Any4,
    Any6,
    DenyAny4,
    DenyAny6,
    Allow4,
    Allow6,
    Deny4,
    Deny6,
    Dyn4,
    Dyn6,
    Expose,
    /// Each sandbox's shared policy (`ifname : mark`, the policy's id).
    Pol,
    /// The per-sandbox log meter (`lograte`, filled by the kernel; deleted with its sandbox).
    LogRate,
}

impl Set {
    /// Its name in the table.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Set::Src4 => "src4",
            Set::Src6 => "src6",
            Set::Gen => "gen",
            Set::Live => "live",
            Set::Any4 => "any4",
            Set::Any6 => "any6",
            Set::DenyAny4 => "denyany4",
            Set::DenyAny6 => "denyany6",
            Set::Allow4 => "allow4",
            Set::Allow6 => "allow6",
            Set::Deny4 => "deny4",
            Set::Deny6 => "deny6",
            Set::Dyn4 => "dyn4",
            Set::Dyn6 => "dyn6",
            Set::Expose => "expose",
            Set::Pol => "pol",
            Set::LogRate => "lograte",
        }
    }

    /// Whether it is an interval set (`flags interval`): its elements carry a key's end.
    pub(crate) fn interval(self) -> bool {
        !matches!(
            self,
            Set::Src4 | Set::Src6 | Set::Gen | Set::Live | Set::Expose | Set::Pol | Set::LogRate
        )
    }
}

impl fmt::Display for Set {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// An interface name as the kernel compares it: NUL-padded to IFNAMSIZ.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct IfName([u8; IFNAMSIZ]);

impl IfName {
    /// `name` (Warren's own `wv<index>` names; longer ones are cut to 15 bytes, as the kernel
    /// would refuse them as interface names anyway).
    pub(crate) fn new(name: &str) -> IfName {
        let mut b = [0u8; IFNAMSIZ];
        let n = name.len().min(IFNAMSIZ - 1);
        b[..n].copy_from_slice(&name.as_bytes()[..n]);
        IfName(b)
    }

    fn as_str(&self) -> &str {
        let n = self.0.iter().position(|&c| c == 0).unwrap_or(IFNAMSIZ);
        std::str::from_utf8(&self.0[..n]).unwrap_or("?")
    }
}

impl fmt::Debug for IfName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}", self.as_str())
    }
}

/// One field of a key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Field {
    /// `ifname`.
    Iface(IfName),
    /// One address (`ipv4_addr`/`ipv6_addr`).
    Addr(IpAddr),
    /// A network: in an interval set, its first to its last address.
    Net(Cidr),
    /// `inet_proto`.
    Proto(Protocol),
    /// `inet_service`: in an interval set, `lo` to `hi`.
    Ports(PortRange),
    /// `inet_service`: one port (sets without intervals).
    Port(u16),
    /// `mark`.
    Mark(u32),
}

/// The protocol's name in nft's text.
pub(crate) fn proto_name(p: Protocol) -> &'static str {
    match p {
        Protocol::Tcp => "tcp",
        Protocol::Udp => "udp",
    }
}

fn proto_number(p: Protocol) -> u8 {
    match p {
        Protocol::Tcp => 6,
        Protocol::Udp => 17,
    }
}

fn push_ip(a: IpAddr, out: &mut Vec<u8>) {
    match a {
        IpAddr::V4(a) => out.extend_from_slice(&a.octets()),
        IpAddr::V6(a) => out.extend_from_slice(&a.octets()),
    }
}

impl Field {
    /// Appends the field's start (or, with `end`, its end) as the kernel stores it: in an
    /// interval set (`interval`) keys compare as big-endian byte strings, so nft stores a host
    /// order field (a mark) there in network order, as it does here.
    fn encode(&self, end: bool, interval: bool, out: &mut Vec<u8>) {
        match *self {
            Field::Iface(n) => out.extend_from_slice(&n.0),
            Field::Addr(a) => push_ip(a, out),
            Field::Net(c) => push_ip(if end { c.last() } else { c.network() }, out),
            Field::Proto(p) => out.extend_from_slice(&[proto_number(p), 0, 0, 0]),
            Field::Ports(r) => {
                let p = if end { r.hi } else { r.lo };
                out.extend_from_slice(&p.to_be_bytes());
                out.extend_from_slice(&[0, 0]);
            }
            Field::Port(p) => {
                out.extend_from_slice(&p.to_be_bytes());
                out.extend_from_slice(&[0, 0]);
            }
            Field::Mark(m) if interval => out.extend_from_slice(&m.to_be_bytes()),
            Field::Mark(m) => out.extend_from_slice(&m.to_ne_bytes()),
        }
    }
}

impl fmt::Display for Field {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Field::Iface(n) => write!(f, "\"{}\"", n.as_str()),
            Field::Addr(a) => write!(f, "{a}"),
            Field::Net(c) => write!(f, "{}/{}", c.network(), c.prefix),
            Field::Proto(p) => f.write_str(proto_name(*p)),
            Field::Ports(r) => write!(f, "{}-{}", r.lo, r.hi),
            Field::Port(p) => write!(f, "{p}"),
            Field::Mark(m) => write!(f, "{m}"),
        }
    }
}

/// One element of a set or map.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct Element {
    /// The key's fields, in the set's order.
    pub(crate) key: Vec<Field>,
    /// A map's value (the `gen` map's mark).
    pub(crate) data: Option<u32>,
    /// How long it lives, in milliseconds (sets with `flags timeout`).
    pub(crate) timeout_ms: Option<u64>,
}

impl Element {
    /// An element of `key` alone.
    pub(crate) fn new(key: Vec<Field>) -> Element {
        Element {
            key,
            data: None,
            timeout_ms: None,
        }
    }

    /// The key's bytes in an interval set: every field's start, or with `end` every field's
    /// end.
    #[cfg(test)]
    pub(crate) fn key_bytes(&self, end: bool) -> Vec<u8> {
        self.key_bytes_in(end, true)
    }

    /// The key's bytes in a set with (`interval`) or without intervals.
    fn key_bytes_in(&self, end: bool, interval: bool) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.key.len() * 16);
        for f in &self.key {
            f.encode(end, interval, &mut out);
        }
        out
    }

    /// Its netlink attributes in `set`: the key (and its end in an interval set) and, with
    /// `whole`, its value and timeout too (an addition; a deletion names the key only).
    pub(crate) fn attributes(&self, set: Set, whole: bool) -> Vec<SetElementAttribute> {
        let mut v = vec![SetElementAttribute::Key(DataAttribute::Value(
            self.key_bytes_in(false, set.interval()),
        ))];
        if set.interval() {
            v.push(SetElementAttribute::KeyEnd(vec![DefaultNla::new(
                NFTA_DATA_VALUE,
                self.key_bytes_in(true, true),
            )]));
        }
        if whole {
            if let Some(d) = self.data {
                v.push(SetElementAttribute::Data(DataAttribute::Value(
                    d.to_ne_bytes().to_vec(),
                )));
            }
            if let Some(t) = self.timeout_ms {
                v.push(SetElementAttribute::Timeout(t));
            }
        }
        v
    }

    /// Its key in nft's text (`"wv2" . 10.0.0.0/8 . tcp . 1-100`).
    pub(crate) fn key_text(&self) -> String {
        let v: Vec<String> = self.key.iter().map(Field::to_string).collect();
        v.join(" . ")
    }
}

impl fmt::Display for Element {
    /// The whole element in nft's text (`"wv2" : 7`, `"wv2" . 1.2.3.4 . 443-443 timeout
    /// 60000ms`).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.key_text())?;
        if let Some(d) = self.data {
            write!(f, " : {d}")?;
        }
        if let Some(t) = self.timeout_ms {
            write!(f, " timeout {t}ms")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cidr(s: &str) -> Cidr {
        Cidr::parse(s).unwrap()
    }

    #[test]
    fn keys_are_laid_out_as_nft_lays_them_out() {
        // What `nft --debug=netlink add element … { "wv2" . 192.168.0.0/16 . tcp . 1-100 }`
        // sends for an `ifname . ipv4_addr . inet_proto . inet_service` interval set.
        let wv2 = Field::Iface(IfName::new("wv2"));
        let e = Element::new(vec![
            wv2,
            Field::Net(cidr("192.168.0.0/16")),
            Field::Proto(Protocol::Tcp),
            Field::Ports(PortRange { lo: 1, hi: 100 }),
        ]);
        let mut name = b"wv2".to_vec();
        name.resize(16, 0);
        let start = [&name[..], &[192, 168, 0, 0], &[6, 0, 0, 0], &[0, 1, 0, 0]].concat();
        let end = [
            &name[..],
            &[192, 168, 255, 255],
            &[6, 0, 0, 0],
            &[0, 100, 0, 0],
        ]
        .concat();
        assert_eq!(e.key_bytes(false), start);
        assert_eq!(e.key_bytes(true), end);
        assert_eq!(e.key_text(), "\"wv2\" . 192.168.0.0/16 . tcp . 1-100");

        // `ifname : mark`: the mark in host order, as nft writes it.
        let g = Element {
            data: Some(258),
            ..Element::new(vec![wv2])
        };
        let attrs = g.attributes(Set::Gen, true);
        assert_eq!(attrs.len(), 2, "a plain map has no key end: {attrs:?}");
        assert_eq!(
            attrs[1],
            SetElementAttribute::Data(DataAttribute::Value(258u32.to_ne_bytes().to_vec()))
        );
        assert_eq!(g.to_string(), "\"wv2\" : 258");
        // A deletion names the key alone.
        assert_eq!(g.attributes(Set::Gen, false).len(), 1);

        // IPv6, and a resolved address with its timeout.
        let d = Element {
            timeout_ms: Some(60_000),
            ..Element::new(vec![
                wv2,
                Field::Addr("2001:db8::1".parse().unwrap()),
                Field::Ports(PortRange { lo: 443, hi: 443 }),
            ])
        };
        let mut want = name.clone();
        want.extend_from_slice(&[0x20, 0x01, 0x0d, 0xb8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1]);
        want.extend_from_slice(&[1, 187, 0, 0]);
        assert_eq!(d.key_bytes(false), want);
        assert_eq!(d.key_bytes(true), want);
        assert_eq!(
            d.attributes(Set::Dyn6, true).last(),
            Some(&SetElementAttribute::Timeout(60_000))
        );
        assert_eq!(
            d.to_string(),
            "\"wv2\" . 2001:db8::1 . 443-443 timeout 60000ms"
        );
        // The whole address space.
        let any = Element::new(vec![wv2, Field::Net(cidr("0.0.0.0/0"))]);
        assert_eq!(&any.key_bytes(false)[16..], &[0, 0, 0, 0]);
        assert_eq!(&any.key_bytes(true)[16..], &[255, 255, 255, 255]);
    }

    #[test]
    fn long_interface_names_are_cut_to_fit() {
        let n = IfName::new("a-name-longer-than-ifnamsiz");
        assert_eq!(n.as_str().len(), 15);
        assert_eq!(n.0[15], 0);
    }
}
