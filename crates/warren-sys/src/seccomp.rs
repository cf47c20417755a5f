//! System-call filters and their notifications.
//!
//! The guest compiles nothing at run time: its filters arrive as BPF programs built from the
//! reviewed policy in the repository (see `warren-guest/build.rs`). This module installs them
//! in a child between fork and exec ([`crate::confine`]) and, on the guest's side, receives
//! the notifications the agent filter raises for every denied call: the guest answers each
//! with `EPERM` and counts it.

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};

/// One BPF program.
#[derive(Debug, Clone)]
pub struct Program {
    insns: Vec<libc::sock_filter>,
}

impl Program {
    /// A program from raw `sock_filter`s (8 bytes each, native endian), as `build.rs` writes
    /// them.
    pub fn from_bytes(b: &[u8]) -> io::Result<Program> {
        if b.is_empty() || !b.len().is_multiple_of(8) || b.len() / 8 > u16::MAX as usize {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!(
                    "a BPF program of {} bytes is not whole instructions",
                    b.len()
                ),
            ));
        }
        let insns = b
            .chunks_exact(8)
            .map(|c| libc::sock_filter {
                code: u16::from_ne_bytes([c[0], c[1]]),
                jt: c[2],
                jf: c[3],
                k: u32::from_ne_bytes([c[4], c[5], c[6], c[7]]),
            })
            .collect();
        Ok(Program { insns })
    }

    pub(crate) fn fprog(&self) -> libc::sock_fprog {
        libc::sock_fprog {
            len: self.insns.len() as u16,
            filter: self.insns.as_ptr() as *mut libc::sock_filter,
        }
    }

    /// The program as raw `sock_filter`s (the form [`Program::from_bytes`] reads).
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.insns.len() * 8);
        for i in &self.insns {
            out.extend_from_slice(&i.code.to_ne_bytes());
            out.push(i.jt);
            out.push(i.jf);
            out.extend_from_slice(&i.k.to_ne_bytes());
        }
        out
    }

    /// Instructions.
    pub fn len(&self) -> usize {
        self.insns.len()
    }

    /// Whether it has none.
    pub fn is_empty(&self) -> bool {
        self.insns.is_empty()
    }
}

/// A system call the agent filter stopped, waiting for the guest's answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Notification {
    /// The kernel's id for it (for the answer).
    pub id: u64,
    /// The calling thread, in the listener's pid namespace (the sandbox's).
    pub pid: u32,
    /// System-call number.
    pub nr: i32,
    /// Audit architecture.
    pub arch: u32,
    /// Arguments.
    pub args: [u64; 6],
}

/// Sizes of the kernel's notification structures, which may be larger than libc's.
fn sizes() -> io::Result<libc::seccomp_notif_sizes> {
    let mut s = libc::seccomp_notif_sizes {
        seccomp_notif: 0,
        seccomp_notif_resp: 0,
        seccomp_data: 0,
    };
    // SAFETY: SECCOMP_GET_NOTIF_SIZES writes a seccomp_notif_sizes into `s`, which outlives the
    // call.
    let r = unsafe {
        libc::syscall(
            libc::SYS_seccomp,
            libc::SECCOMP_GET_NOTIF_SIZES,
            0,
            &mut s as *mut libc::seccomp_notif_sizes,
        )
    };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(s)
}

/// Receives one notification from `listener`. Blocks if none is pending: call it when the
/// descriptor polls readable.
pub fn receive(listener: BorrowedFd<'_>) -> io::Result<Notification> {
    let s = sizes()?;
    let size = (s.seccomp_notif as usize).max(std::mem::size_of::<libc::seccomp_notif>());
    // u64 words: the structure is 8-byte aligned.
    let mut buf = vec![0u64; size.div_ceil(8)];
    // SAFETY: the buffer is zeroed (the kernel requires it) and at least as large as the
    // kernel's seccomp_notif; the ioctl fills it.
    let r = unsafe {
        libc::ioctl(
            listener.as_raw_fd(),
            libc::SECCOMP_IOCTL_NOTIF_RECV,
            buf.as_mut_ptr(),
        )
    };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: the kernel wrote a seccomp_notif at the start of the 8-byte aligned buffer.
    let n = unsafe { std::ptr::read(buf.as_ptr() as *const libc::seccomp_notif) };
    Ok(Notification {
        id: n.id,
        pid: n.pid,
        nr: n.data.nr,
        arch: n.data.arch,
        args: n.data.args,
    })
}

/// Answers notification `id`: the system call fails with `errno`.
pub fn deny(listener: BorrowedFd<'_>, id: u64, errno: i32) -> io::Result<()> {
    let s = sizes()?;
    let size = (s.seccomp_notif_resp as usize).max(std::mem::size_of::<libc::seccomp_notif_resp>());
    let mut buf = vec![0u64; size.div_ceil(8)];
    let resp = libc::seccomp_notif_resp {
        id,
        val: 0,
        error: -errno,
        flags: 0,
    };
    // SAFETY: the buffer is 8-byte aligned and at least size_of::<seccomp_notif_resp>().
    unsafe { std::ptr::write(buf.as_mut_ptr() as *mut libc::seccomp_notif_resp, resp) };
    // SAFETY: the buffer holds a valid response at least as large as the kernel's structure.
    let r = unsafe {
        libc::ioctl(
            listener.as_raw_fd(),
            libc::SECCOMP_IOCTL_NOTIF_SEND,
            buf.as_mut_ptr(),
        )
    };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Receives a descriptor sent with `SCM_RIGHTS` on `sock` (non-blocking: `WouldBlock` when
/// nothing is queued; `Ok(None)` when the peer is gone).
pub fn receive_fd(sock: BorrowedFd<'_>) -> io::Result<Option<OwnedFd>> {
    let mut byte = [0u8; 1];
    let mut iov = libc::iovec {
        iov_base: byte.as_mut_ptr().cast(),
        iov_len: 1,
    };
    // Room for one descriptor's control message, 8-byte aligned.
    let mut cmsg = [0u64; 4];
    // SAFETY: an all-zero msghdr is valid.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = cmsg.as_mut_ptr().cast();
    // SAFETY: CMSG_SPACE is a pure computation.
    msg.msg_controllen =
        unsafe { libc::CMSG_SPACE(std::mem::size_of::<libc::c_int>() as u32) } as _;
    // SAFETY: msg points at buffers that live across the call.
    let n = unsafe {
        libc::recvmsg(
            sock.as_raw_fd(),
            &mut msg,
            libc::MSG_DONTWAIT | libc::MSG_CMSG_CLOEXEC,
        )
    };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    if n == 0 {
        return Ok(None);
    }
    // SAFETY: msg was filled by recvmsg; CMSG_FIRSTHDR/CMSG_DATA walk its control buffer.
    unsafe {
        let c = libc::CMSG_FIRSTHDR(&msg);
        if !c.is_null() && (*c).cmsg_level == libc::SOL_SOCKET && (*c).cmsg_type == libc::SCM_RIGHTS
        {
            let fd = std::ptr::read_unaligned(libc::CMSG_DATA(c) as *const libc::c_int);
            return Ok(Some(OwnedFd::from_raw_fd(fd)));
        }
    }
    Err(io::Error::new(
        io::ErrorKind::InvalidData,
        "a message without a descriptor",
    ))
}

/// Whether `fd` has a notification pending, and whether every user of its filter is gone
/// (`POLLHUP`), without waiting.
pub fn pending(fd: BorrowedFd<'_>) -> io::Result<(bool, bool)> {
    use rustix::event::{PollFd, PollFlags, poll};
    let mut fds = [PollFd::new(&fd, PollFlags::IN)];
    let zero = rustix::time::Timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    poll(&mut fds, Some(&zero))?;
    let r = fds[0].revents();
    Ok((
        r.contains(PollFlags::IN),
        r.intersects(PollFlags::HUP | PollFlags::ERR),
    ))
}

/// A connected pair of `SOCK_SEQPACKET` unix sockets (close-on-exec; the first one
/// non-blocking) for handing listeners from confined children to the guest.
pub fn listener_channel() -> io::Result<(OwnedFd, OwnedFd)> {
    use rustix::net::{AddressFamily, SocketFlags, SocketType, socketpair};
    let (a, b) = socketpair(
        AddressFamily::UNIX,
        SocketType::SEQPACKET,
        SocketFlags::CLOEXEC,
        None,
    )?;
    rustix::fs::fcntl_setfl(&a, rustix::fs::OFlags::NONBLOCK)?;
    Ok((a, b))
}

/// Registers a listener (or the listener channel) with the tokio runtime, for readiness.
pub fn watch(fd: OwnedFd) -> io::Result<tokio::io::unix::AsyncFd<OwnedFd>> {
    // SAFETY: the AsyncFd owns the OwnedFd, so the descriptor stays open and names the same
    // file for the AsyncFd's whole life, which is what `register_with_interest` requires.
    unsafe { tokio::io::unix::AsyncFd::register_with_interest(fd, tokio::io::Interest::READABLE) }
        .map_err(|e| e.into_parts().1)
}
