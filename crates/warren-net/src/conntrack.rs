//! Connection tracking state of addresses about to be reused. When a finished sandbox's
//! address goes to a new one, no connection state may carry over: an entry left behind would
//! let a packet of the old sandbox's connection (a late reply) reach the new one as
//! "established", and keep the old policy's mark. [`flush`] deletes them — every entry with
//! the address at either end of either direction — over ctnetlink.

use std::io;
use std::net::IpAddr;
use std::time::Duration;

use netlink_packet_core::{
    ErrorBuffer, NLA_TYPE_MASK, NLM_F_ACK, NLM_F_DUMP, NLM_F_DUMP_INTR, NLM_F_REQUEST, NLMSG_DONE,
    NLMSG_ERROR, NetlinkBuffer, NetlinkHeader, NetlinkMessage, NetlinkPayload, NlasIterator,
    Parseable,
};
use netlink_packet_netfilter::conntrack::{ConntrackAttribute, ConntrackMessage, IPTuple, Tuple};
use netlink_packet_netfilter::{NetfilterHeader, NetfilterMessage, NetfilterProtoFamily};
use netlink_sys::{Socket, constants::NETLINK_NETFILTER};
use rustix::io::Errno;
use rustix::net::sockopt;

/// Attributes of an entry.
const CTA_TUPLE_ORIG: u16 = 1;
const CTA_TUPLE_REPLY: u16 = 2;
const CTA_ID: u16 = 12;
const CTA_ZONE: u16 = 18;
/// A dumped entry's message type: `NFNL_SUBSYS_CTNETLINK << 8 | IPCTNL_MSG_CT_NEW`.
const CT_NEW: u16 = 1 << 8;
/// Deletions sent in one `sendmsg`, their acks read before the next ones.
const DELETES_PER_SEND: usize = 64;
/// A dump's parts are at most 32 KiB; this holds any of them.
const RECV_BUF: usize = 64 * 1024;
/// How often a dump that the table's changes interrupted is tried again.
const DUMPS: usize = 4;

/// Deletes every conntrack entry of the calling thread's network namespace whose
/// original-direction source or reply-direction destination is one of `addrs` (IPv4 and
/// IPv6, every zone); returns how many it deleted. An entry that goes away by itself
/// meanwhile is no error.
pub fn flush(addrs: &[IpAddr]) -> io::Result<usize> {
    if addrs.is_empty() {
        return Ok(0);
    }
    let addrs: Vec<IpAddr> = addrs.iter().map(|a| canonical(*a)).collect();
    let addrs = &addrs[..];
    let mut ct = Ctnetlink::open()?;
    let mut deleted = 0;
    for _ in 0..DUMPS {
        let (entries, interrupted) = ct.dump(addrs)?;
        deleted += ct.delete(&entries)?;
        // An interrupted dump may have missed entries: look again.
        if !interrupted {
            return Ok(deleted);
        }
    }
    Err(io::Error::other(format!(
        "conntrack: the table changed under each of {DUMPS} dumps; entries of {addrs:?} may be \
         left"
    )))
}

/// Whether an entry with the addresses `seen` (both ends of both directions) is one of
/// `addrs`'.
fn matches(seen: &[Option<IpAddr>], addrs: &[IpAddr]) -> bool {
    seen.iter().flatten().any(|a| addrs.contains(a))
}

/// An IPv4-mapped IPv6 address as the IPv4 address the kernel tracks.
fn canonical(a: IpAddr) -> IpAddr {
    match a {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(a, IpAddr::V4),
        v4 => v4,
    }
}

/// An entry to delete: what names it to the kernel.
struct Entry {
    family: u8,
    /// Its original tuple, its zone and its id, as dumped.
    attributes: Vec<ConntrackAttribute>,
}

struct Ctnetlink {
    socket: Socket,
    seq: u32,
    buf: Vec<u8>,
}

impl Ctnetlink {
    fn open() -> io::Result<Ctnetlink> {
        let mut socket = Socket::new(NETLINK_NETFILTER).map_err(|e| {
            io::Error::new(e.kind(), format!("opening a conntrack netlink socket: {e}"))
        })?;
        socket.bind_auto()?;
        socket.set_cap_ack(true)?;
        sockopt::set_socket_timeout(
            &socket,
            sockopt::Timeout::Recv,
            Some(Duration::from_secs(5)),
        )?;
        Ok(Ctnetlink {
            socket,
            seq: 0,
            buf: vec![0; RECV_BUF],
        })
    }

    fn message(&mut self, flags: u16, family: u8, m: ConntrackMessage, out: &mut Vec<u8>) -> u32 {
        self.seq = self.seq.wrapping_add(1);
        let mut h = NetlinkHeader::default();
        h.flags = flags;
        h.sequence_number = self.seq;
        let mut msg = NetlinkMessage::new(
            h,
            NetlinkPayload::InnerMessage(NetfilterMessage::new(
                NetfilterHeader::new(NetfilterProtoFamily::from(family), 0, 0),
                m,
            )),
        );
        msg.finalize();
        let start = out.len();
        out.resize(start + msg.buffer_len(), 0);
        msg.serialize(&mut out[start..]);
        self.seq
    }

    fn recv(&mut self) -> io::Result<usize> {
        crate::netlink::recv(&self.socket, &mut self.buf, "conntrack", 5)
    }

    /// The entries of `addrs`, and whether the dump was interrupted by changes.
    fn dump(&mut self, addrs: &[IpAddr]) -> io::Result<(Vec<Entry>, bool)> {
        let mut out = Vec::new();
        // Both families (AF_UNSPEC).
        let seq = self.message(
            NLM_F_REQUEST | NLM_F_DUMP,
            0,
            ConntrackMessage::Get(vec![]),
            &mut out,
        );
        self.socket.send(&out, 0)?;
        let mut found = Vec::new();
        let mut interrupted = false;
        loop {
            let n = self.recv()?;
            let mut off = 0;
            while off < n {
                let Ok(m) = NetlinkBuffer::new_checked(&self.buf[off..n]) else {
                    break;
                };
                let len = m.length() as usize;
                if m.sequence_number() == seq {
                    interrupted |= m.flags() & NLM_F_DUMP_INTR != 0;
                    match m.message_type() {
                        NLMSG_DONE => return Ok((found, interrupted)),
                        NLMSG_ERROR => {
                            if let Some(c) = ErrorBuffer::new_checked(m.payload())
                                .ok()
                                .and_then(|e| e.code())
                            {
                                let e = io::Error::from_raw_os_error(-c.get());
                                return Err(io::Error::new(
                                    e.kind(),
                                    format!("conntrack: listing the entries: {e}"),
                                ));
                            }
                        }
                        CT_NEW => {
                            if let Some(e) = entry(m.payload(), addrs) {
                                found.push(e);
                            }
                        }
                        _ => {}
                    }
                }
                if len == 0 {
                    break;
                }
                off += (len + 3) & !3;
            }
        }
    }

    /// Deletes `entries`; returns how many were still there.
    fn delete(&mut self, entries: &[Entry]) -> io::Result<usize> {
        let mut deleted = 0;
        for chunk in entries.chunks(DELETES_PER_SEND) {
            let mut out = Vec::new();
            let mut seqs = Vec::with_capacity(chunk.len());
            for e in chunk {
                seqs.push(self.message(
                    NLM_F_REQUEST | NLM_F_ACK,
                    e.family,
                    ConntrackMessage::Delete(e.attributes.clone()),
                    &mut out,
                ));
            }
            self.socket.send(&out, 0)?;
            let mut answered = 0;
            while answered < seqs.len() {
                let n = self.recv()?;
                let mut off = 0;
                while off < n {
                    let Ok(m) = NetlinkBuffer::new_checked(&self.buf[off..n]) else {
                        break;
                    };
                    let len = m.length() as usize;
                    if m.message_type() == NLMSG_ERROR && seqs.contains(&m.sequence_number()) {
                        answered += 1;
                        match ErrorBuffer::new_checked(m.payload()).map(|e| e.code()) {
                            Ok(None) => deleted += 1,
                            // Gone meanwhile (timed out, or closed).
                            Ok(Some(c)) if -c.get() == Errno::NOENT.raw_os_error() => {}
                            Ok(Some(c)) => {
                                let e = io::Error::from_raw_os_error(-c.get());
                                return Err(io::Error::new(
                                    e.kind(),
                                    format!("conntrack: deleting an entry: {e}"),
                                ));
                            }
                            Err(e) => return Err(io::Error::other(format!("conntrack: {e}"))),
                        }
                    }
                    if len == 0 {
                        break;
                    }
                    off += (len + 3) & !3;
                }
            }
        }
        Ok(deleted)
    }
}

/// The dumped entry in `payload` (nfgenmsg and attributes), if it is one of `addrs`'.
fn entry(payload: &[u8], addrs: &[IpAddr]) -> Option<Entry> {
    let family = *payload.first()?;
    let mut attributes = Vec::new();
    // Every address of the entry: both ends of both directions (a connection the node opened
    // to a sandbox has the sandbox as its original destination).
    let mut seen: Vec<Option<IpAddr>> = Vec::with_capacity(4);
    for nla in NlasIterator::new(payload.get(4..)?).map_while(Result::ok) {
        // Only what names the entry is parsed: the rest (protocol state, counters) is not
        // needed, and need not parse.
        if !matches!(
            nla.kind() & NLA_TYPE_MASK,
            CTA_TUPLE_ORIG | CTA_TUPLE_REPLY | CTA_ZONE | CTA_ID
        ) {
            continue;
        }
        match ConntrackAttribute::parse(&nla).ok()? {
            ConntrackAttribute::CtaTupleReply(t) => {
                seen.push(address(&t, true));
                seen.push(address(&t, false));
            }
            a => {
                if let ConntrackAttribute::CtaTupleOrig(t) = &a {
                    seen.push(address(t, true));
                    seen.push(address(t, false));
                }
                attributes.push(a);
            }
        }
    }
    matches(&seen, addrs).then_some(Entry { family, attributes })
}

/// A tuple's source (or destination) address.
fn address(tuple: &[Tuple], source: bool) -> Option<IpAddr> {
    tuple.iter().find_map(|t| match t {
        Tuple::Ip(ips) => ips.iter().find_map(|ip| match ip {
            IPTuple::SourceAddress(a) if source => Some(*a),
            IPTuple::DestinationAddress(a) if !source => Some(*a),
            _ => None,
        }),
        _ => None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_entry_is_the_addresses_by_its_original_source_or_its_reply_destination() {
        let a: IpAddr = "10.200.0.2".parse().unwrap();
        let other: IpAddr = "10.200.0.3".parse().unwrap();
        assert!(matches(&[Some(a), Some(other)], &[a]));
        assert!(matches(&[Some(other), Some(other), Some(a), None], &[a]));
        assert!(!matches(&[Some(other), Some(other)], &[a]));
        assert!(!matches(&[None, None], &[a]));
        // An IPv4-mapped address is its IPv4 one.
        assert_eq!(canonical("::ffff:10.200.0.2".parse().unwrap()), a);
        assert_eq!(canonical(other), other);
    }
}
