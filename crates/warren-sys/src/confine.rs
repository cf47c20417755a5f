//! Confining a command between fork and exec: resource limits, Landlock, system-call filters,
//! and handing the agent filter's notification listener to the guest.
//!
//! Everything is prepared once ([`Confinement`]); the child runs only raw system calls on that
//! prepared memory (it is a fork of the multi-threaded guest: no allocation, no locks).

use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::process::Command;
use std::sync::Arc;

use crate::seccomp::Program;

/// A resource limit: `(RLIMIT_*, soft, hard)`.
pub type Rlimit = (u32, u64, u64);

/// What every confined command gets.
#[derive(Debug, Default)]
pub struct Confinement {
    /// Resource limits, set first.
    pub rlimits: Vec<Rlimit>,
    /// A Landlock ruleset to enforce (`landlock_restrict_self`).
    pub landlock: Option<OwnedFd>,
    /// Filters installed as they are (e.g. the ENOSYS filters).
    pub filters: Vec<Program>,
    /// The filter whose notifications the guest answers, installed last with
    /// `SECCOMP_FILTER_FLAG_NEW_LISTENER`; its listener is sent on `listener_to`.
    pub notify: Option<(Program, OwnedFd)>,
}

impl Confinement {
    /// Makes `cmd` apply this confinement in its child, after the user switch and before exec.
    pub fn apply_on_exec(self: &Arc<Self>, cmd: &mut Command) {
        let c = self.clone();
        // Where `c`'s programs are (length, address), computed before the fork; `c` moves into
        // the hook, so they stay valid.
        let raw = |p: &Program| {
            let f = p.fprog();
            (f.len, f.filter as usize)
        };
        let fprogs: Vec<(u16, usize)> = c.filters.iter().map(raw).collect();
        let notify = c
            .notify
            .as_ref()
            .map(|(p, sock)| (raw(p), sock.as_raw_fd()));
        let landlock = c.landlock.as_ref().map(|f| f.as_raw_fd());
        let rlimits: Vec<(u32, libc::rlimit)> = c
            .rlimits
            .iter()
            .map(|&(r, soft, hard)| {
                (
                    r,
                    libc::rlimit {
                        rlim_cur: soft,
                        rlim_max: hard,
                    },
                )
            })
            .collect();
        let hook = move || -> io::Result<()> {
            let _keep = &c;
            for (r, lim) in &rlimits {
                // SAFETY: setrlimit reads the rlimit, which lives in this closure.
                if unsafe { libc::setrlimit(*r as _, lim) } < 0 {
                    return Err(io::Error::last_os_error());
                }
            }
            if let Some(fd) = landlock {
                // SAFETY: landlock_restrict_self takes a descriptor and flags.
                if unsafe { libc::syscall(libc::SYS_landlock_restrict_self, fd, 0u32) } < 0 {
                    return Err(io::Error::last_os_error());
                }
            }
            for &(len, addr) in &fprogs {
                if install(len, addr, 0) < 0 {
                    return Err(io::Error::last_os_error());
                }
            }
            if let Some(((len, addr), sock)) = notify {
                let listener = install(
                    len,
                    addr,
                    libc::SECCOMP_FILTER_FLAG_NEW_LISTENER as libc::c_uint,
                );
                if listener < 0 {
                    return Err(io::Error::last_os_error());
                }
                let sent = send_fd(sock, listener as libc::c_int);
                // SAFETY: closing our copy; the guest holds the one it received.
                unsafe { libc::close(listener as libc::c_int) };
                if !sent {
                    return Err(io::Error::last_os_error());
                }
            }
            Ok(())
        };
        // SAFETY: the hook makes only raw system calls (setrlimit, landlock_restrict_self,
        // seccomp, sendmsg, close) on memory prepared before the fork; it allocates nothing,
        // takes no lock and touches no state shared with the parent. Error values are built
        // from raw OS errors without allocation.
        unsafe {
            cmd.pre_exec(hook);
        }
    }
}

impl Confinement {
    /// Applies the confinement to the calling process itself, once (the guest's spawner: every
    /// process it starts inherits it). The process must have one thread.
    pub fn apply_to_self(&self) -> io::Result<()> {
        for &(r, soft, hard) in &self.rlimits {
            let lim = libc::rlimit {
                rlim_cur: soft,
                rlim_max: hard,
            };
            // SAFETY: setrlimit reads the rlimit on this stack.
            if unsafe { libc::setrlimit(r as _, &lim) } < 0 {
                return Err(io::Error::last_os_error());
            }
        }
        if let Some(fd) = &self.landlock {
            // SAFETY: landlock_restrict_self takes a descriptor and flags.
            if unsafe { libc::syscall(libc::SYS_landlock_restrict_self, fd.as_raw_fd(), 0u32) } < 0
            {
                return Err(io::Error::last_os_error());
            }
        }
        for p in &self.filters {
            let f = p.fprog();
            if install(f.len, f.filter as usize, 0) < 0 {
                return Err(io::Error::last_os_error());
            }
        }
        if let Some((p, sock)) = &self.notify {
            let f = p.fprog();
            let listener = install(
                f.len,
                f.filter as usize,
                libc::SECCOMP_FILTER_FLAG_NEW_LISTENER as libc::c_uint,
            );
            if listener < 0 {
                return Err(io::Error::last_os_error());
            }
            // SAFETY: the kernel just returned this descriptor, which we now own.
            let listener =
                unsafe { <OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(listener as i32) };
            if !send_fd(sock.as_raw_fd(), listener.as_raw_fd()) {
                return Err(io::Error::last_os_error());
            }
        }
        Ok(())
    }
}

/// Installs the filter of `len` instructions at `addr` (for the child: a raw system call on a
/// `sock_fprog` built on the stack).
fn install(len: u16, addr: usize, flags: libc::c_uint) -> libc::c_long {
    let prog = libc::sock_fprog {
        len,
        filter: addr as *mut libc::sock_filter,
    };
    // SAFETY: `addr` points at `len` instructions owned by the Confinement that the hook
    // keeps alive; `prog` lives across the call, which only reads it.
    unsafe {
        libc::syscall(
            libc::SYS_seccomp,
            libc::SECCOMP_SET_MODE_FILTER,
            flags,
            &prog as *const libc::sock_fprog,
        )
    }
}

/// Sends `fd` with `SCM_RIGHTS` on `sock`, with only raw system calls (for the child).
fn send_fd(sock: libc::c_int, fd: libc::c_int) -> bool {
    let mut byte = [0u8; 1];
    let mut iov = libc::iovec {
        iov_base: byte.as_mut_ptr().cast(),
        iov_len: 1,
    };
    let mut cmsg = [0u64; 4];
    // SAFETY: an all-zero msghdr is valid; every pointer set below is to stack memory alive
    // for the sendmsg call; CMSG_* are pure computations on that buffer.
    unsafe {
        let mut msg: libc::msghdr = std::mem::zeroed();
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        msg.msg_control = cmsg.as_mut_ptr().cast();
        msg.msg_controllen = libc::CMSG_SPACE(std::mem::size_of::<libc::c_int>() as u32) as _;
        let c = libc::CMSG_FIRSTHDR(&msg);
        (*c).cmsg_level = libc::SOL_SOCKET;
        (*c).cmsg_type = libc::SCM_RIGHTS;
        (*c).cmsg_len = libc::CMSG_LEN(std::mem::size_of::<libc::c_int>() as u32) as _;
        std::ptr::write_unaligned(libc::CMSG_DATA(c) as *mut libc::c_int, fd);
        libc::sendmsg(sock, &msg, libc::MSG_NOSIGNAL) == 1
    }
}

/// Gives the calling process a new, empty session keyring, so keys never cross sandboxes or
/// reach the daemon's keyring. Inherited by every child.
pub fn join_new_session_keyring() -> io::Result<()> {
    const KEYCTL_JOIN_SESSION_KEYRING: libc::c_long = 1;
    // SAFETY: a null name asks for a new anonymous keyring; no memory is passed.
    let r = unsafe {
        libc::syscall(
            libc::SYS_keyctl,
            KEYCTL_JOIN_SESSION_KEYRING,
            std::ptr::null::<libc::c_char>(),
        )
    };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Raises this process's own `RLIMIT_NOFILE` (soft and hard) to `n` where it can: the guest
/// does so before it drops its capabilities, so that its commands can be given up to `n`
/// without privilege. Returns the hard limit it ended with (lower than `n` where the host
/// withholds `CAP_SYS_RESOURCE`).
pub fn raise_own_open_files(n: u64) -> u64 {
    use rustix::process::{Resource, Rlimit, getrlimit, setrlimit};
    let now = getrlimit(Resource::Nofile).maximum.unwrap_or(u64::MAX);
    let want = Rlimit {
        current: Some(n),
        maximum: Some(n),
    };
    if setrlimit(Resource::Nofile, want).is_ok() {
        return n;
    }
    let _ = setrlimit(
        Resource::Nofile,
        Rlimit {
            current: Some(now),
            maximum: Some(now),
        },
    );
    now.min(n)
}
