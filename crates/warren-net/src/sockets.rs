//! The TCP sockets a network namespace still holds once every process in it is gone: those
//! closing (`FIN_WAIT`, `TIME_WAIT`, `LAST_ACK`, …) live on in the kernel for up to a minute
//! and are listed in `/proc/net/tcp` to whoever runs in the namespace next. Before a finished
//! sandbox's namespace serves another, [`destroy_all`] ends them (`SOCK_DESTROY` over
//! sock_diag, as `ss -K` does; the kernel needs `CONFIG_INET_DIAG_DESTROY`), so nothing of the
//! last sandbox's connections — not even where they went — carries over.

use std::io;
use std::os::fd::BorrowedFd;
use std::time::Duration;

use netlink_packet_core::{
    NLM_F_ACK, NLM_F_DUMP, NLM_F_REQUEST, NLMSG_DONE, NLMSG_ERROR, NetlinkBuffer, NetlinkHeader,
    NetlinkMessage, NetlinkPayload,
};
use netlink_packet_sock_diag::constants::{AF_INET, AF_INET6, IPPROTO_TCP};
use netlink_packet_sock_diag::inet::{ExtensionFlags, InetRequest, SocketId, StateFlags};
use netlink_packet_sock_diag::{SockDiagDestroy, SockDiagMessage};
use netlink_sys::{Socket, constants::NETLINK_SOCK_DIAG};
use rustix::net::sockopt;

/// A dump's parts are at most 32 KiB; this holds any of them.
const RECV_BUF: usize = 64 * 1024;

/// Most sockets one call destroys (a namespace of a finished sandbox holds a few at most).
const MAX_SOCKETS: usize = 65_536;

/// Destroys every TCP socket (IPv4 and IPv6, any state) in the network namespace `netns`,
/// then checks that no socket at all is left there; returns how many it destroyed. Meant for a
/// namespace no process lives in any more: a socket still there then (a UDP or unix socket
/// kept alive in flight inside a unix socket's queue, say) is an error, and the namespace must
/// not serve anyone else. Blocking: runs on a short-lived thread of its own that enters the
/// namespace (a netlink socket acts on the namespace it was made in).
pub fn destroy_all(netns: BorrowedFd<'_>) -> io::Result<usize> {
    std::thread::scope(|s| {
        s.spawn(move || {
            rustix::thread::move_into_link_name_space(
                netns,
                Some(rustix::thread::LinkNameSpaceType::Network),
            )?;
            let mut n = 0;
            // A dump walks the kernel's TCP hash tables, which every namespace shares: costly.
            // The namespace's own counts say first whether there is anything to end.
            for _ in 0..3 {
                if !holds_tcp()? {
                    break;
                }
                let mut d = Diag::open()?;
                for family in [AF_INET, AF_INET6] {
                    for id in d.dump(family)? {
                        n += usize::from(d.destroy(family, id)?);
                    }
                }
            }
            if let Some(what) = leftover()? {
                return Err(io::Error::other(format!(
                    "{what} outlived every process of the namespace (held in flight in a unix \
                     socket, say): the namespace is not reused"
                )));
            }
            Ok(n)
        })
        .join()
        .unwrap_or_else(|_| Err(io::Error::other("the socket-destroying thread panicked")))
    })
}

/// What sockets the calling thread's network namespace still holds, if any: internet sockets
/// of any protocol (its `sockstat` counts) or unix sockets (`/proc/net/unix`).
fn leftover() -> io::Result<Option<String>> {
    for (file, protos) in [
        ("sockstat", &["TCP:", "UDP:", "UDPLITE:", "RAW:"][..]),
        ("sockstat6", &["TCP6:", "UDP6:", "UDPLITE6:", "RAW6:"][..]),
    ] {
        for proto in protos {
            let n = count(file, proto, "inuse")?;
            if n > 0 {
                return Ok(Some(format!(
                    "{n} {} socket(s)",
                    proto.trim_end_matches(':')
                )));
            }
        }
    }
    if count("sockstat", "TCP:", "tw")? > 0 {
        return Ok(Some("a TCP socket in TIME_WAIT".into()));
    }
    let unix = std::fs::read_to_string("/proc/thread-self/net/unix")?;
    let n = unix.lines().count().saturating_sub(1);
    if n > 0 {
        return Ok(Some(format!("{n} unix socket(s)")));
    }
    Ok(None)
}

/// A count in the calling thread's namespace's `/proc/net/<file>`: the number after `field`
/// on the line of `proto`; one (so it is checked the hard way) when the line is not there.
fn count(file: &str, proto: &str, field: &str) -> io::Result<u64> {
    let text = std::fs::read_to_string(format!("/proc/thread-self/net/{file}"))?;
    Ok(text
        .lines()
        .find_map(|l| l.strip_prefix(proto))
        .and_then(|rest| {
            let v: Vec<&str> = rest.split_whitespace().collect();
            v.windows(2)
                .find(|w| w[0] == field)
                .and_then(|w| w[1].parse().ok())
        })
        .unwrap_or(1))
}

/// Whether the calling thread's network namespace has TCP sockets (in use, or in TIME_WAIT),
/// from its `sockstat` counts.
fn holds_tcp() -> io::Result<bool> {
    Ok(count("sockstat", "TCP:", "inuse")? > 0
        || count("sockstat", "TCP:", "tw")? > 0
        || count("sockstat6", "TCP6:", "inuse")? > 0)
}

struct Diag {
    socket: Socket,
    seq: u32,
    buf: Vec<u8>,
}

fn request(family: u8, socket_id: SocketId) -> InetRequest {
    InetRequest {
        family,
        protocol: IPPROTO_TCP,
        extensions: ExtensionFlags::empty(),
        states: StateFlags::all(),
        socket_id,
    }
}

impl Diag {
    fn open() -> io::Result<Diag> {
        let mut socket = Socket::new(NETLINK_SOCK_DIAG).map_err(|e| {
            io::Error::new(e.kind(), format!("opening a sock_diag netlink socket: {e}"))
        })?;
        socket.bind_auto()?;
        sockopt::set_socket_timeout(
            &socket,
            sockopt::Timeout::Recv,
            Some(Duration::from_secs(5)),
        )?;
        Ok(Diag {
            socket,
            seq: 0,
            buf: vec![0; RECV_BUF],
        })
    }

    fn send<T>(&mut self, flags: u16, payload: T) -> io::Result<u32>
    where
        T: netlink_packet_core::NetlinkSerializable,
    {
        self.seq = self.seq.wrapping_add(1);
        let mut h = NetlinkHeader::default();
        h.flags = flags;
        h.sequence_number = self.seq;
        let mut msg = NetlinkMessage::new(h, NetlinkPayload::InnerMessage(payload));
        msg.finalize();
        let mut out = vec![0; msg.buffer_len()];
        msg.serialize(&mut out);
        self.socket.send(&out, 0)?;
        Ok(self.seq)
    }

    fn recv(&mut self) -> io::Result<usize> {
        crate::netlink::recv(&self.socket, &mut self.buf, "sock_diag", 5)
    }

    /// The ids of every TCP socket of `family`.
    fn dump(&mut self, family: u8) -> io::Result<Vec<SocketId>> {
        let empty = if family == AF_INET {
            SocketId::new_v4()
        } else {
            SocketId::new_v6()
        };
        let seq = self.send(
            NLM_F_REQUEST | NLM_F_DUMP,
            SockDiagMessage::InetRequest(request(family, empty)),
        )?;
        let mut ids = Vec::new();
        loop {
            let n = self.recv()?;
            let mut at = 0;
            while at < n {
                let Ok(b) = NetlinkBuffer::new_checked(&self.buf[at..n]) else {
                    break;
                };
                let len = (b.length() as usize).max(16);
                let (kind, mseq) = (b.message_type(), b.sequence_number());
                if mseq == seq {
                    match kind {
                        NLMSG_DONE => return Ok(ids),
                        NLMSG_ERROR => {
                            let code = crate::netlink::error_code(b.payload());
                            if code < 0 {
                                return Err(io::Error::from_raw_os_error(-code));
                            }
                        }
                        _ => {
                            if let Ok(NetlinkPayload::InnerMessage(SockDiagMessage::InetResponse(
                                r,
                            ))) = NetlinkMessage::<SockDiagMessage>::deserialize(
                                &self.buf[at..(at + len).min(n)],
                            )
                            .map(|m| m.payload)
                                && ids.len() < MAX_SOCKETS
                            {
                                ids.push(r.header.socket_id);
                            }
                        }
                    }
                }
                at += (len + 3) & !3;
            }
        }
    }

    /// Destroys one socket; whether it was there to destroy.
    fn destroy(&mut self, family: u8, id: SocketId) -> io::Result<bool> {
        let seq = self.send(
            NLM_F_REQUEST | NLM_F_ACK,
            SockDiagDestroy::new(SockDiagMessage::InetRequest(request(family, id))),
        )?;
        loop {
            let n = self.recv()?;
            let mut at = 0;
            while at < n {
                let Ok(b) = NetlinkBuffer::new_checked(&self.buf[at..n]) else {
                    break;
                };
                let len = (b.length() as usize).max(16);
                if b.sequence_number() == seq && b.message_type() == NLMSG_ERROR {
                    let code = crate::netlink::error_code(b.payload());
                    return match -code {
                        0 => Ok(true),
                        // Gone by itself meanwhile.
                        libc_enoent if libc_enoent == rustix::io::Errno::NOENT.raw_os_error() => {
                            Ok(false)
                        }
                        e => Err(io::Error::new(
                            io::Error::from_raw_os_error(e).kind(),
                            format!(
                                "destroying a closing TCP socket: {} (the kernel needs \
                                 CONFIG_INET_DIAG_DESTROY)",
                                io::Error::from_raw_os_error(e)
                            ),
                        )),
                    };
                }
                at += (len + 3) & !3;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;
    use std::os::fd::AsFd;

    /// A network namespace of the test's own, deleted when dropped.
    struct Ns(String);

    impl Drop for Ns {
        fn drop(&mut self) {
            let _ = std::process::Command::new("ip")
                .args(["netns", "del", &self.0])
                .status();
        }
    }

    #[test]
    fn closing_and_listening_sockets_of_a_namespace_are_destroyed() {
        let root = std::fs::read_to_string("/proc/self/status").is_ok_and(|s| {
            s.lines()
                .any(|l| l.starts_with("Uid:") && l.split_whitespace().nth(1) == Some("0"))
        });
        if !root {
            eprintln!("skipped: needs root");
            return;
        }
        let ns = Ns(format!("wt-sock-{}", std::process::id()));
        let ip = |args: &[&str]| {
            assert!(
                std::process::Command::new("ip")
                    .args(args)
                    .status()
                    .unwrap()
                    .success()
            )
        };
        ip(&["netns", "add", &ns.0]);
        ip(&["-n", &ns.0, "link", "set", "lo", "up"]);
        let fd = std::fs::File::open(format!("/run/netns/{}", ns.0)).unwrap();
        // A connection closed from one side (TIME_WAIT on it) and a listener, made by a thread
        // in the namespace; the listener is kept open here.
        let (listener, before) = std::thread::scope(|s| {
            s.spawn(|| {
                rustix::thread::move_into_link_name_space(
                    fd.as_fd(),
                    Some(rustix::thread::LinkNameSpaceType::Network),
                )
                .unwrap();
                let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
                let c = std::net::TcpStream::connect(l.local_addr().unwrap()).unwrap();
                let (mut a, _) = l.accept().unwrap();
                drop(c);
                let _ = a.read(&mut [0u8; 1]);
                drop(a);
                let tcp = std::fs::read_to_string("/proc/thread-self/net/tcp").unwrap();
                (l, tcp)
            })
            .join()
            .unwrap()
        });
        assert!(before.lines().count() >= 3, "{before}");
        drop(listener);
        let n = destroy_all(fd.as_fd()).unwrap();
        assert!(n >= 1, "{n}");
        assert_eq!(
            destroy_all(fd.as_fd()).unwrap(),
            0,
            "nothing left the second time"
        );
        // A socket that outlives the namespace's processes (here: held by the test) and is not
        // TCP: the namespace is reported not clean, so it is not reused.
        let udp = std::thread::scope(|s| {
            s.spawn(|| {
                rustix::thread::move_into_link_name_space(
                    fd.as_fd(),
                    Some(rustix::thread::LinkNameSpaceType::Network),
                )
                .unwrap();
                std::net::UdpSocket::bind("127.0.0.1:0").unwrap()
            })
            .join()
            .unwrap()
        });
        let e = destroy_all(fd.as_fd()).unwrap_err();
        assert!(e.to_string().contains("UDP"), "{e}");
        drop(udp);
        assert_eq!(destroy_all(fd.as_fd()).unwrap(), 0);
    }
}
