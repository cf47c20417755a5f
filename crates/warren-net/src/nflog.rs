//! Refused packets, as the firewall logs them to its NFLOG group: a reader thread turns each
//! into a [`Denied`] (source, destination, protocol, port) and hands it on through a bounded
//! channel. Only the first 64 bytes of each packet are copied out of the kernel (the IP and
//! transport headers); when the channel is full, records are counted and dropped, never
//! queued without bound.

use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use netlink_packet_core::{NetlinkMessage, NetlinkPayload};
use netlink_packet_netfilter::nflog::{
    ConfigCmd, ConfigMode, ConfigNla, CopyMode, PacketNla, Timeout, ULogMessage, config_request,
};
use netlink_packet_netfilter::{NetfilterMessage, NetfilterMessageInner, NetfilterProtoFamily};
use netlink_sys::{Socket, constants::NETLINK_NETFILTER};
use tokio::sync::mpsc;

/// Bytes of each packet the kernel copies out.
const COPY: u32 = 64;

/// A refused packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Denied {
    /// Its source (a sandbox's address).
    pub src: IpAddr,
    /// Where it was going.
    pub dst: IpAddr,
    /// IP protocol number (6 TCP, 17 UDP, 1 ICMP, 58 ICMPv6, …).
    pub protocol: u8,
    /// Destination port (TCP and UDP), if any.
    pub port: Option<u16>,
}

impl Denied {
    /// The protocol's name.
    pub fn protocol_name(&self) -> String {
        match self.protocol {
            6 => "tcp".into(),
            17 => "udp".into(),
            1 => "icmp".into(),
            58 => "icmpv6".into(),
            n => format!("ip protocol {n}"),
        }
    }
}

/// Parses the start of an IP packet.
pub fn parse_packet(p: &[u8]) -> Option<(IpAddr, IpAddr, u8, Option<u16>)> {
    let version = p.first()? >> 4;
    let (src, dst, proto, l4) = match version {
        4 => {
            let ihl = usize::from(p.first()? & 0x0f) * 4;
            if ihl < 20 || p.len() < 20 {
                return None;
            }
            let s: [u8; 4] = p.get(12..16)?.try_into().ok()?;
            let d: [u8; 4] = p.get(16..20)?.try_into().ok()?;
            // A fragment after the first has no transport header.
            let frag_offset = u16::from_be_bytes([p[6], p[7]]) & 0x1fff;
            let l4 = if frag_offset == 0 { p.get(ihl..) } else { None };
            (
                IpAddr::V4(Ipv4Addr::from(s)),
                IpAddr::V4(Ipv4Addr::from(d)),
                p[9],
                l4,
            )
        }
        6 => {
            if p.len() < 40 {
                return None;
            }
            let s: [u8; 16] = p.get(8..24)?.try_into().ok()?;
            let d: [u8; 16] = p.get(24..40)?.try_into().ok()?;
            (
                IpAddr::V6(Ipv6Addr::from(s)),
                IpAddr::V6(Ipv6Addr::from(d)),
                p[6],
                p.get(40..),
            )
        }
        _ => return None,
    };
    let port = match (proto, l4) {
        (6 | 17, Some(t)) if t.len() >= 4 => Some(u16::from_be_bytes([t[2], t[3]])),
        _ => None,
    };
    Some((src, dst, proto, port))
}

/// The reader: a thread bound to one NFLOG group of the current network namespace.
pub struct Reader {
    stop: Arc<AtomicBool>,
    /// Records dropped because the channel was full.
    pub dropped: Arc<AtomicU64>,
}

impl Reader {
    /// Binds `group` (in the calling thread's network namespace) and starts reading; records
    /// go to the returned channel (at most `capacity` waiting).
    pub fn start(group: u16, capacity: usize) -> io::Result<(Reader, mpsc::Receiver<Denied>)> {
        let mut socket = Socket::new(NETLINK_NETFILTER)?;
        socket.bind_auto()?;
        let _ = socket.set_rx_buf_sz(1 << 20);
        // Binding the families is a no-op since Linux 3.17; older kernels need it.
        for (family, nlas) in [
            (NetfilterProtoFamily::IPv4, vec![ConfigCmd::PfBind.into()]),
            (NetfilterProtoFamily::IPv6, vec![ConfigCmd::PfBind.into()]),
        ] {
            send(&socket, config_request(family, 0, nlas))?;
            ack(&socket)?;
        }
        send(
            &socket,
            config_request(
                NetfilterProtoFamily::Unspec,
                group,
                vec![
                    ConfigCmd::Bind.into(),
                    ConfigNla::Mode(ConfigMode::new(COPY, CopyMode::Packet)),
                    Timeout::from(Duration::from_millis(20)).into(),
                ],
            ),
        )?;
        ack(&socket).map_err(|e| {
            io::Error::new(
                e.kind(),
                format!("binding NFLOG group {group} (is another node using it?): {e}"),
            )
        })?;
        rustix::net::sockopt::set_socket_timeout(
            &socket,
            rustix::net::sockopt::Timeout::Recv,
            Some(Duration::from_millis(500)),
        )?;
        let (tx, rx) = mpsc::channel(capacity);
        let stop = Arc::new(AtomicBool::new(false));
        let dropped = Arc::new(AtomicU64::new(0));
        let (s2, d2) = (stop.clone(), dropped.clone());
        std::thread::Builder::new()
            .name("warren-nflog".into())
            .spawn(move || read_loop(socket, tx, s2, d2))?;
        Ok((Reader { stop, dropped }, rx))
    }
}

impl Drop for Reader {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

fn send(socket: &Socket, msg: NetlinkMessage<NetfilterMessage>) -> io::Result<()> {
    let mut buf = vec![0; msg.buffer_len()];
    msg.serialize(&mut buf);
    socket.send(&buf, 0)?;
    Ok(())
}

fn ack(socket: &Socket) -> io::Result<()> {
    let mut buf = vec![0u8; 4096];
    let n = socket.recv(&mut &mut buf[..], 0)?;
    let msg = NetlinkMessage::<NetfilterMessage>::deserialize(&buf[..n])
        .map_err(|e| io::Error::other(format!("nflog: {e}")))?;
    match msg.payload {
        NetlinkPayload::Error(e) => match e.code {
            None => Ok(()),
            Some(c) => Err(io::Error::from_raw_os_error(-c.get())),
        },
        _ => Ok(()),
    }
}

fn read_loop(
    socket: Socket,
    tx: mpsc::Sender<Denied>,
    stop: Arc<AtomicBool>,
    dropped: Arc<AtomicU64>,
) {
    let mut buf = vec![0u8; 1 << 16];
    while !stop.load(Ordering::Relaxed) && !tx.is_closed() {
        let n = match socket.recv(&mut &mut buf[..], 0) {
            Ok(n) => n,
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock
                        | io::ErrorKind::TimedOut
                        | io::ErrorKind::Interrupted
                ) =>
            {
                continue;
            }
            // ENOBUFS: the kernel dropped records while we were slow; go on.
            Err(e) if e.raw_os_error() == Some(105) => {
                dropped.fetch_add(1, Ordering::Relaxed);
                continue;
            }
            Err(e) => {
                tracing::error!("reading refused packets: {e}");
                return;
            }
        };
        let mut off = 0;
        while off < n {
            let Ok(msg) = NetlinkMessage::<NetfilterMessage>::deserialize(&buf[off..n]) else {
                break;
            };
            let len = msg.header.length as usize;
            if let NetlinkPayload::InnerMessage(NetfilterMessage {
                inner: NetfilterMessageInner::ULog(ULogMessage::Packet(nlas)),
                ..
            }) = &msg.payload
            {
                for nla in nlas {
                    if let PacketNla::Payload(p) = nla
                        && let Some((src, dst, protocol, port)) = parse_packet(p)
                        && tx
                            .try_send(Denied {
                                src,
                                dst,
                                protocol,
                                port,
                            })
                            .is_err()
                    {
                        dropped.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }
            if len == 0 {
                break;
            }
            off += (len + 3) & !3;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn packets_parse_to_their_destination_and_port() {
        let mut v4 = vec![0u8; 24];
        v4[0] = 0x45;
        v4[9] = 6;
        v4[12..16].copy_from_slice(&[10, 200, 0, 2]);
        v4[16..20].copy_from_slice(&[10, 200, 0, 1]);
        v4[22..24].copy_from_slice(&22u16.to_be_bytes());
        assert_eq!(
            parse_packet(&v4),
            Some((
                "10.200.0.2".parse().unwrap(),
                "10.200.0.1".parse().unwrap(),
                6,
                Some(22)
            ))
        );
        // A later fragment: no port.
        v4[6] = 0x00;
        v4[7] = 0x10;
        assert_eq!(parse_packet(&v4).unwrap().3, None);
        let mut v6 = vec![0u8; 44];
        v6[0] = 0x60;
        v6[6] = 17;
        v6[23] = 2;
        v6[39] = 1;
        v6[42..44].copy_from_slice(&853u16.to_be_bytes());
        let (s, d, p, port) = parse_packet(&v6).unwrap();
        assert_eq!(
            (s.to_string(), d.to_string(), p, port),
            ("::2".into(), "::1".into(), 17, Some(853))
        );
        for bad in [&[][..], &[0x45][..], &[0x60; 10][..], &[0x15; 40][..]] {
            assert!(parse_packet(bad).is_none());
        }
    }
}
