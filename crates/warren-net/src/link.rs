//! A sandbox's interface: a veth pair made with one netlink request, its sandbox end created
//! directly inside the sandbox's network namespace as `eth0`, addresses from the node's pool.
//!
//! Addressing (every sandbox alike, so nothing but the addresses differs between them):
//! - the sandbox has `<v4>/32` and `<v6>/128` on `eth0`, a link route to the gateway and a
//!   default route through it (`fe80::1` for IPv6);
//! - the node's end, `wv<index>`, carries the gateway address (the pool's first address, /32)
//!   and `fe80::1/64`, and a host route to the sandbox's addresses. The same gateway address
//!   on every node end is legal (the kernel keeps a local route per device) and lets one DNS
//!   socket on the gateway address serve every sandbox.
//!
//! Nothing here runs a command: the node's end is configured through the node's own netlink
//! socket, the sandbox's end through a socket opened from a short-lived thread that entered the
//! sandbox's network namespace (a netlink socket stays bound to the namespace it was made in).

use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};

use futures_util::TryStreamExt;
use netlink_packet_route::address::AddressHeaderFlags;
use netlink_packet_route::link::{InfoData, InfoVeth, LinkAttribute};
use netlink_packet_route::route::RouteScope;
use rtnetlink::{Handle, LinkMessageBuilder, LinkUnspec, LinkVeth, RouteMessageBuilder};
use warren_types::net::Cidr;

/// Prefix of the node's ends of sandbox interfaces: Warren's firewall matches only these.
pub const HOST_PREFIX: &str = "wv";

/// The gateway's IPv6 address on every node end (link-local, so it is never routed).
pub const GATEWAY6: Ipv6Addr = Ipv6Addr::new(0xfe80, 0, 0, 0, 0, 0, 0, 1);

/// The node's sandbox address pools.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Addressing {
    /// IPv4 pool (e.g. `10.200.0.0/16`): its first address is the gateway.
    pub v4: Cidr,
    /// IPv6 pool (e.g. `fd77:7761::/64`).
    pub v6: Cidr,
}

/// One sandbox's place in the pools.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Lease {
    /// Its index (2 and up: 0 is the network, 1 the gateway).
    pub index: u32,
    /// Its IPv4 address.
    pub v4: Ipv4Addr,
    /// Its IPv6 address.
    pub v6: Ipv6Addr,
}

impl Lease {
    /// The name of the node's end of its interface (`wv<index>`, at most 15 bytes).
    pub fn host_if(&self) -> String {
        format!("{HOST_PREFIX}{}", self.index)
    }
}

impl Addressing {
    /// Checks the pools: IPv4 and IPv6 in their fields, room for at least 16 sandboxes, and no
    /// more than 2^24 (interface names stay short).
    pub fn new(v4: Cidr, v6: Cidr) -> Result<Addressing, String> {
        if !v4.addr.is_ipv4() || !v6.addr.is_ipv6() {
            return Err("the IPv4 pool must be an IPv4 CIDR and the IPv6 pool an IPv6 one".into());
        }
        if !(8..=27).contains(&v4.prefix) {
            return Err(format!(
                "IPv4 pool {v4}: the prefix must be /8 to /27 (room for 16 to 2^24 sandboxes)"
            ));
        }
        if !(64..=120).contains(&v6.prefix) {
            return Err(format!("IPv6 pool {v6}: the prefix must be /64 to /120"));
        }
        Ok(Addressing { v4, v6 })
    }

    /// How many sandboxes the pools hold.
    pub fn capacity(&self) -> u32 {
        let v4 = (1u64 << (32 - self.v4.prefix as u32)).saturating_sub(3);
        let v6 = 1u64 << (128 - self.v6.prefix as u32).min(63);
        v4.min(v6.saturating_sub(3)).min(1 << 24) as u32
    }

    /// The IPv4 gateway: the pool's first address after the network's.
    pub fn gateway4(&self) -> Ipv4Addr {
        match self.v4.network() {
            IpAddr::V4(a) => Ipv4Addr::from(u32::from(a) + 1),
            IpAddr::V6(_) => Ipv4Addr::UNSPECIFIED,
        }
    }

    /// The lease of `index`, if it is in the pools (2 ..= capacity + 1).
    pub fn lease(&self, index: u32) -> Option<Lease> {
        if index < 2 || index > self.capacity() + 1 {
            return None;
        }
        let (IpAddr::V4(n4), IpAddr::V6(n6)) = (self.v4.network(), self.v6.network()) else {
            return None;
        };
        Some(Lease {
            index,
            v4: Ipv4Addr::from(u32::from(n4) + index),
            v6: Ipv6Addr::from(u128::from(n6) + index as u128),
        })
    }

    /// The index of a node end's name (`wv<index>`), if it is one of ours.
    pub fn index_of(&self, ifname: &str) -> Option<u32> {
        let n = ifname.strip_prefix(HOST_PREFIX)?;
        if n.is_empty() || n.starts_with('0') || !n.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        n.parse().ok().filter(|i| self.lease(*i).is_some())
    }
}

fn nl(e: rtnetlink::Error) -> io::Error {
    match e {
        rtnetlink::Error::NetlinkError(m) => match m.code {
            Some(c) => io::Error::from_raw_os_error(-c.get()),
            None => io::Error::other("netlink: unexpected acknowledgement"),
        },
        other => io::Error::other(other.to_string()),
    }
}

/// A network the node's namespace uses (see [`Links::taken_networks`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Taken {
    /// The network.
    pub net: Cidr,
    /// The node's own address in it, for an address.
    pub address: Option<IpAddr>,
    /// What it is, for messages.
    pub what: String,
}

/// A netlink connection in the node's own network namespace.
#[derive(Clone)]
pub struct Links {
    handle: Handle,
    addressing: Addressing,
}

impl Links {
    /// Opens the node's netlink socket; its connection runs on the current tokio runtime.
    pub fn new(addressing: Addressing) -> io::Result<Links> {
        let (conn, handle, _) = rtnetlink::new_connection()?;
        tokio::spawn(conn);
        Ok(Links { handle, addressing })
    }

    /// Makes `lease`'s interface for the sandbox whose network namespace is `netns`: the pair
    /// in one request (the sandbox's end born inside `netns` as `eth0`), then both ends'
    /// addresses and routes. On failure the pair is deleted again.
    pub async fn attach(&self, netns: BorrowedFd<'_>, lease: &Lease) -> io::Result<()> {
        let host_if = lease.host_if();
        let peer = LinkMessageBuilder::<LinkUnspec>::new()
            .name("eth0".to_string())
            .setns_by_fd(netns.as_raw_fd())
            .build();
        let msg = LinkVeth::new(&host_if, "eth0")
            .set_info_data(InfoData::Veth(InfoVeth::Peer(peer)))
            .build();
        self.handle.link().add(msg).execute().await.map_err(nl)?;
        let r = self.configure(netns, lease, &host_if).await;
        if r.is_err() {
            let _ = self.detach(lease).await;
        }
        r
    }

    async fn configure(
        &self,
        netns: BorrowedFd<'_>,
        lease: &Lease,
        host_if: &str,
    ) -> io::Result<()> {
        let gw4 = self.addressing.gateway4();
        // The node's end.
        let index = self.index_by_name(&self.handle, host_if).await?;
        add_address(&self.handle, index, IpAddr::V4(gw4), 32).await?;
        add_address(&self.handle, index, IpAddr::V6(GATEWAY6), 64).await?;
        self.handle
            .link()
            .set(LinkUnspec::new_with_index(index).up().build())
            .execute()
            .await
            .map_err(nl)?;
        let to4 = RouteMessageBuilder::<Ipv4Addr>::new()
            .destination_prefix(lease.v4, 32)
            .output_interface(index)
            .scope(RouteScope::Link)
            .build();
        self.handle.route().add(to4).execute().await.map_err(nl)?;
        let to6 = RouteMessageBuilder::<Ipv6Addr>::new()
            .destination_prefix(lease.v6, 128)
            .output_interface(index)
            .build();
        self.handle.route().add(to6).execute().await.map_err(nl)?;
        // The sandbox's end, through a socket of its namespace.
        let inside = netlink_in(netns)?;
        let eth0 = self.index_by_name(&inside, "eth0").await?;
        add_address(&inside, eth0, IpAddr::V4(lease.v4), 32).await?;
        add_address(&inside, eth0, IpAddr::V6(lease.v6), 128).await?;
        inside
            .link()
            .set(LinkUnspec::new_with_index(eth0).up().build())
            .execute()
            .await
            .map_err(nl)?;
        let gw = RouteMessageBuilder::<Ipv4Addr>::new()
            .destination_prefix(gw4, 32)
            .output_interface(eth0)
            .scope(RouteScope::Link)
            .build();
        inside.route().add(gw).execute().await.map_err(nl)?;
        let default4 = RouteMessageBuilder::<Ipv4Addr>::new()
            .gateway(gw4)
            .output_interface(eth0)
            .build();
        inside.route().add(default4).execute().await.map_err(nl)?;
        let default6 = RouteMessageBuilder::<Ipv6Addr>::new()
            .gateway(GATEWAY6)
            .output_interface(eth0)
            .build();
        inside.route().add(default6).execute().await.map_err(nl)?;
        Ok(())
    }

    /// Deletes `lease`'s interface (both ends go together); one already gone is no error.
    pub async fn detach(&self, lease: &Lease) -> io::Result<()> {
        self.delete_by_name(&lease.host_if()).await
    }

    /// Deletes the node end named `name`; gone already is no error.
    pub async fn delete_by_name(&self, name: &str) -> io::Result<()> {
        let index = match self.index_by_name(&self.handle, name).await {
            Ok(i) => i,
            Err(e) if e.raw_os_error() == Some(libc_enodev()) => return Ok(()),
            Err(e) => return Err(e),
        };
        match self.handle.link().del(index).execute().await.map_err(nl) {
            Err(e) if e.raw_os_error() == Some(libc_enodev()) => Ok(()),
            r => r,
        }
    }

    /// The names of every node end of the pools' form (`wv<index>`, a veth) that exists.
    pub async fn existing(&self) -> io::Result<Vec<(String, u32)>> {
        Ok(self
            .interfaces()
            .await?
            .into_iter()
            .filter(|(_, veth)| *veth)
            .filter_map(|(name, _)| self.addressing.index_of(&name).map(|i| (name, i)))
            .collect())
    }

    /// Interfaces whose names Warren's firewall would match (`wv*`) but that are not node
    /// ends of its form: another program's, which the node must not take over.
    pub async fn foreign(&self) -> io::Result<Vec<String>> {
        Ok(self
            .interfaces()
            .await?
            .into_iter()
            .filter(|(name, veth)| {
                name.starts_with(HOST_PREFIX)
                    && !(*veth && self.addressing.index_of(name).is_some())
            })
            .map(|(name, _)| name)
            .collect())
    }

    /// Every interface's name, and whether it is a veth.
    async fn interfaces(&self) -> io::Result<Vec<(String, bool)>> {
        use netlink_packet_route::link::{InfoKind, LinkInfo};
        let mut out = Vec::new();
        let mut links = self.handle.link().get().execute();
        while let Some(msg) = links.try_next().await.map_err(nl)? {
            let mut name = None;
            let mut veth = false;
            for a in &msg.attributes {
                match a {
                    LinkAttribute::IfName(n) => name = Some(n.clone()),
                    LinkAttribute::LinkInfo(infos) => {
                        veth |= infos
                            .iter()
                            .any(|i| matches!(i, LinkInfo::Kind(InfoKind::Veth)))
                    }
                    _ => {}
                }
            }
            if let Some(n) = name {
                out.push((n, veth));
            }
        }
        Ok(out)
    }

    /// The networks the node's namespace uses outside Warren's interfaces — every address
    /// (with its prefix) and every route but the default ones — each with what it is, to
    /// check that the pools overlap none of them.
    pub async fn taken_networks(&self) -> io::Result<Vec<Taken>> {
        let mut names: std::collections::HashMap<u32, String> = std::collections::HashMap::new();
        let mut links = self.handle.link().get().execute();
        while let Some(msg) = links.try_next().await.map_err(nl)? {
            for a in &msg.attributes {
                if let LinkAttribute::IfName(n) = a {
                    names.insert(msg.header.index, n.clone());
                }
            }
        }
        let ours = |i: u32| {
            names
                .get(&i)
                .is_some_and(|n| self.addressing.index_of(n).is_some())
        };
        let mut out = Vec::new();
        let mut addrs = self.handle.address().get().execute();
        while let Some(msg) = addrs.try_next().await.map_err(nl)? {
            if ours(msg.header.index) {
                continue;
            }
            for a in &msg.attributes {
                if let netlink_packet_route::address::AddressAttribute::Address(ip) = a {
                    let c = Cidr {
                        addr: *ip,
                        prefix: msg.header.prefix_len,
                    }
                    .normalized();
                    let on = names.get(&msg.header.index).cloned().unwrap_or_default();
                    out.push(Taken {
                        net: c,
                        address: Some(*ip),
                        what: format!("address {ip}/{} on {on}", msg.header.prefix_len),
                    });
                }
            }
        }
        for v6 in [false, true] {
            let msg = if v6 {
                RouteMessageBuilder::<Ipv6Addr>::new().build()
            } else {
                RouteMessageBuilder::<Ipv4Addr>::new().build()
            };
            let mut routes = self.handle.route().get(msg).execute();
            while let Some(r) = routes.try_next().await.map_err(nl)? {
                let mut dst = None;
                let mut oif = None;
                for a in &r.attributes {
                    match a {
                        netlink_packet_route::route::RouteAttribute::Destination(
                            netlink_packet_route::route::RouteAddress::Inet(a),
                        ) => dst = Some(IpAddr::V4(*a)),
                        netlink_packet_route::route::RouteAttribute::Destination(
                            netlink_packet_route::route::RouteAddress::Inet6(a),
                        ) => dst = Some(IpAddr::V6(*a)),
                        netlink_packet_route::route::RouteAttribute::Oif(i) => oif = Some(*i),
                        _ => {}
                    }
                }
                let prefix = r.header.destination_prefix_length;
                if prefix == 0 || oif.is_some_and(ours) {
                    continue;
                }
                if let Some(d) = dst {
                    // Local-table and multicast routes of the host's own addresses are
                    // already among the addresses; link-local ones never overlap a pool.
                    let c = Cidr { addr: d, prefix }.normalized();
                    out.push(Taken {
                        net: c,
                        address: None,
                        what: format!("route {c}"),
                    });
                }
            }
        }
        Ok(out)
    }

    async fn index_by_name(&self, handle: &Handle, name: &str) -> io::Result<u32> {
        let mut links = handle.link().get().match_name(name.to_string()).execute();
        match links.try_next().await {
            Ok(Some(msg)) => Ok(msg.header.index),
            Ok(None) => Err(io::Error::from_raw_os_error(libc_enodev())),
            Err(e) => Err(nl(e)),
        }
    }
}

const fn libc_enodev() -> i32 {
    19
}

async fn add_address(handle: &Handle, index: u32, addr: IpAddr, prefix: u8) -> io::Result<()> {
    let mut req = handle.address().add(index, addr, prefix);
    if addr.is_ipv6() {
        // No duplicate address detection: the link has two ends, both ours; waiting for it
        // would leave the address unusable for a second.
        req.message_mut().header.flags = AddressHeaderFlags::Nodad;
    }
    req.execute().await.map_err(nl)
}

/// A netlink connection inside the network namespace `netns`: the socket is made by a thread
/// that entered it (and then ends), and its connection runs on the current runtime.
fn netlink_in(netns: BorrowedFd<'_>) -> io::Result<Handle> {
    let fd: OwnedFd = netns.try_clone_to_owned()?;
    let rt = tokio::runtime::Handle::current();
    let made = std::thread::spawn(move || -> io::Result<_> {
        let _enter = rt.enter();
        rustix::thread::move_into_link_name_space(
            fd.as_fd(),
            Some(rustix::thread::LinkNameSpaceType::Network),
        )?;
        rtnetlink::new_connection()
    })
    .join()
    .map_err(|_| io::Error::other("the netlink thread panicked"))??;
    let (conn, handle, _) = made;
    tokio::spawn(conn);
    Ok(handle)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pools() -> Addressing {
        Addressing::new(
            Cidr::parse("10.200.0.0/16").unwrap(),
            Cidr::parse("fd77:7761::/64").unwrap(),
        )
        .unwrap()
    }

    #[test]
    fn leases_map_indexes_to_addresses_and_names() {
        let a = pools();
        assert_eq!(a.gateway4(), Ipv4Addr::new(10, 200, 0, 1));
        assert_eq!(a.capacity(), 65533);
        assert!(a.lease(0).is_none() && a.lease(1).is_none());
        let l = a.lease(2).unwrap();
        assert_eq!(l.v4, Ipv4Addr::new(10, 200, 0, 2));
        assert_eq!(l.v6, "fd77:7761::2".parse::<Ipv6Addr>().unwrap());
        assert_eq!(l.host_if(), "wv2");
        let last = a.lease(65534).unwrap();
        assert_eq!(last.v4, Ipv4Addr::new(10, 200, 255, 254));
        assert!(a.lease(65535).is_none());
        assert_eq!(a.index_of("wv300"), Some(300));
        for not_ours in ["wv", "wv0", "wv01", "wv1", "wvx", "eth0", "wv99999999"] {
            assert_eq!(a.index_of(not_ours), None, "{not_ours}");
        }
        assert!(a.lease(16_777_216).is_none());
        assert!("wv16777216".len() <= 15);
    }

    #[test]
    fn pools_are_checked() {
        let v6 = Cidr::parse("fd77::/64").unwrap();
        assert!(Addressing::new(Cidr::parse("10.0.0.0/28").unwrap(), v6).is_err());
        assert!(Addressing::new(Cidr::parse("10.0.0.0/7").unwrap(), v6).is_err());
        assert!(Addressing::new(v6, v6).is_err());
        assert!(
            Addressing::new(
                Cidr::parse("10.0.0.0/24").unwrap(),
                Cidr::parse("fd77::/56").unwrap()
            )
            .is_err()
        );
    }
}
