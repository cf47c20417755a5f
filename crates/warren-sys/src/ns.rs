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

/// Gives the calling thread a new namespace of `kind` (for PID: its next child is the new
/// namespace's init; when that exits, the kernel kills everything else in it).
pub fn unshare(kind: Kind) -> io::Result<()> {
    // SAFETY: unshare takes flags and no memory.
    if unsafe { libc::unshare(kind.flag()) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}
