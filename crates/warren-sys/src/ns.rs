//! Namespaces of the calling thread beyond mounts: the PID and IPC namespaces a function call's
//! processes get fresh each time (see the guest's `call` module).
//!
//! A thread's `pid_for_children` namespace can be replaced only while it is the thread's own
//! active one, so a thread that makes one per call first steps back into its own
//! ([`enter`] with the descriptor [`own`] gave), then makes the next ([`unshare`]).

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, OwnedFd};

/// A kind of namespace.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// PID namespace (for the thread's children).
    Pid,
    /// System V IPC and POSIX message queues.
    Ipc,
}

impl Kind {
    fn flag(self) -> libc::c_int {
        match self {
            Kind::Pid => libc::CLONE_NEWPID,
            Kind::Ipc => libc::CLONE_NEWIPC,
        }
    }

    fn name(self) -> &'static str {
        match self {
            Kind::Pid => "pid",
            Kind::Ipc => "ipc",
        }
    }
}

/// The calling thread's namespace of `kind` (its active one, for PID), as a descriptor.
pub fn own(kind: Kind) -> io::Result<OwnedFd> {
    Ok(std::fs::File::open(format!("/proc/thread-self/ns/{}", kind.name()))?.into())
}

/// Moves the calling thread into `ns` (for PID: makes it the namespace of its next children).
pub fn enter(ns: BorrowedFd<'_>, kind: Kind) -> io::Result<()> {
    // SAFETY: setns takes a descriptor and a flag.
    if unsafe { libc::setns(ns.as_raw_fd(), kind.flag()) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Removes every System V shared memory segment, semaphore set and message queue of the
/// caller's IPC namespace (needs `CAP_SYS_ADMIN` there, or to own them); how many. The ids come
/// from `/proc/sysvipc`, which shows the reader's IPC namespace.
pub fn remove_all_sysv_ipc() -> io::Result<usize> {
    let mut n = 0;
    for (file, kind) in [("shm", 0), ("sem", 1), ("msg", 2)] {
        let text = std::fs::read_to_string(format!("/proc/sysvipc/{file}"))?;
        for line in text.lines().skip(1) {
            let Some(id) = line.split_whitespace().nth(1).and_then(|v| v.parse().ok()) else {
                continue;
            };
            // SAFETY: the *ctl calls with IPC_RMID take an id and no memory (a null buffer).
            let r = unsafe {
                match kind {
                    0 => libc::shmctl(id, libc::IPC_RMID, std::ptr::null_mut()),
                    1 => libc::semctl(id, 0, libc::IPC_RMID),
                    _ => libc::msgctl(id, libc::IPC_RMID, std::ptr::null_mut()),
                }
            };
            if r != 0 {
                return Err(io::Error::last_os_error());
            }
            n += 1;
        }
    }
    Ok(n)
}

/// Gives the calling thread a new namespace of `kind` (for PID: its next child is the new
/// namespace's init; when that exits, the kernel kills everything else in it).
pub fn unshare(kind: Kind) -> io::Result<()> {
    // SAFETY: unshare takes flags and no memory.
    if unsafe { libc::unshare(kind.flag()) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}
