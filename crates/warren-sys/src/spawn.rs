//! Starting a sandbox's init: one `clone3` into new namespaces, then `execve` at once.
//!
//! The node daemon is multi-threaded (tokio), so the child of a fork must not run Rust code that
//! could take a lock (malloc, stdio): only raw system calls on memory prepared before the clone.
//! That is what [`spawn`] does, like `posix_spawn`, but with clone3's namespace, pidfd and
//! cgroup features.

use std::ffi::{CStr, CString};
use std::io::{self, Read};
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

/// Namespaces a new sandbox init gets.
#[derive(Debug, Clone, Copy, Default)]
pub struct Namespaces {
    /// New pid namespace: the child is its PID 1.
    pub pid: bool,
    /// New mount namespace.
    pub mount: bool,
    /// New UTS namespace (hostname).
    pub uts: bool,
    /// New IPC namespace.
    pub ipc: bool,
    /// New network namespace (loopback only until configured).
    pub net: bool,
}

impl Namespaces {
    /// Every namespace a container sandbox gets at clone time. (The cgroup namespace is made by
    /// the init itself, after it has joined its cgroups, so that its root is the sandbox's own.)
    pub fn container() -> Self {
        Namespaces {
            pid: true,
            mount: true,
            uts: true,
            ipc: true,
            net: true,
        }
    }

    fn clone_flags(self) -> u64 {
        let mut f = 0u64;
        if self.pid {
            f |= libc::CLONE_NEWPID as u64;
        }
        if self.mount {
            f |= libc::CLONE_NEWNS as u64;
        }
        if self.uts {
            f |= libc::CLONE_NEWUTS as u64;
        }
        if self.ipc {
            f |= libc::CLONE_NEWIPC as u64;
        }
        if self.net {
            f |= libc::CLONE_NEWNET as u64;
        }
        f
    }
}

/// What to start.
pub struct SpawnSpec<'a> {
    /// The program, by absolute host path.
    pub program: &'a Path,
    /// argv, including argv[0].
    pub args: &'a [&'a str],
    /// The complete environment.
    pub env: &'a [(&'a str, &'a str)],
    /// Namespaces to create.
    pub namespaces: Namespaces,
    /// cgroup v1 `cgroup.procs` files (opened for writing): the child writes "0" to each,
    /// joining those cgroups before it execs.
    pub join_cgroups: &'a [BorrowedFd<'a>],
    /// cgroup v2 directory to start in (`CLONE_INTO_CGROUP`).
    pub into_cgroup: Option<BorrowedFd<'a>>,
    /// File descriptors for the child: `(fd in the parent, number in the child)`. Every other
    /// descriptor is closed on exec (the daemon opens everything close-on-exec).
    pub fds: &'a [(BorrowedFd<'a>, RawFd)],
}

/// A started child.
#[derive(Debug)]
pub struct Spawned {
    /// Its pid (in the caller's pid namespace).
    pub pid: i32,
    /// A pidfd for it.
    pub pidfd: OwnedFd,
}

/// Lowest descriptor number that sources are moved to before the clone, so that no source is
/// overwritten while the child moves descriptors into place.
const HIGH_FD: RawFd = 64;

/// `CLONE_INTO_CGROUP` (linux/sched.h); libc declares it with a type too narrow for it.
const CLONE_INTO_CGROUP: u64 = 0x2_0000_0000;

/// Stage codes the child reports on failure (first byte of the error message).
const STAGE_NAMES: [&str; 6] = [
    "setsid",
    "join cgroup",
    "dup2",
    "sigprocmask",
    "execve",
    "unknown",
];

fn cstring(s: &[u8], what: &str) -> io::Result<CString> {
    CString::new(s).map_err(|_| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{what} contains a NUL byte"),
        )
    })
}

/// Starts `spec.program` in new namespaces and returns once it has exec'd (or failed to).
///
/// The child calls `setsid` (so a terminal's signals never reach sandboxes), joins the given
/// cgroups, moves the given descriptors into place, clears its signal mask and execs. An error
/// in any of those steps comes back as this function's error, with the step named.
pub fn spawn(spec: &SpawnSpec<'_>) -> io::Result<Spawned> {
    // Everything the child touches is prepared here, before the clone.
    let program = cstring(spec.program.as_os_str().as_bytes(), "program path")?;
    let args: Vec<CString> = spec
        .args
        .iter()
        .map(|a| cstring(a.as_bytes(), "argument"))
        .collect::<io::Result<_>>()?;
    let env: Vec<CString> = spec
        .env
        .iter()
        .map(|(k, v)| cstring(format!("{k}={v}").as_bytes(), "environment"))
        .collect::<io::Result<_>>()?;
    let argv: Vec<*const libc::c_char> = args
        .iter()
        .map(|a| a.as_ptr())
        .chain(std::iter::once(std::ptr::null()))
        .collect();
    let envp: Vec<*const libc::c_char> = env
        .iter()
        .map(|a| a.as_ptr())
        .chain(std::iter::once(std::ptr::null()))
        .collect();

    // Move sources above every target number so dup2 in the child never clobbers a source.
    let mut high: Vec<OwnedFd> = Vec::with_capacity(spec.fds.len());
    for (fd, _) in spec.fds {
        high.push(rustix::io::fcntl_dupfd_cloexec(fd, HIGH_FD)?);
    }
    let moves: Vec<(RawFd, RawFd)> = high
        .iter()
        .zip(spec.fds)
        .map(|(h, (_, target))| (h.as_raw_fd(), *target))
        .collect();
    let joins: Vec<RawFd> = spec.join_cgroups.iter().map(|f| f.as_raw_fd()).collect();

    // Error pipe: close-on-exec, so a successful exec closes it and the parent reads EOF.
    let (err_r, err_w) = rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC)?;
    let err_w_raw = err_w.as_raw_fd();

    let mut pidfd: libc::c_int = -1;
    // SAFETY: clone_args is a plain C struct; all-zero is its documented default.
    let mut cl: libc::clone_args = unsafe { std::mem::zeroed() };
    cl.flags = spec.namespaces.clone_flags() | libc::CLONE_PIDFD as u64;
    cl.pidfd = &mut pidfd as *mut libc::c_int as u64;
    cl.exit_signal = libc::SIGCHLD as u64;
    if let Some(cg) = spec.into_cgroup {
        cl.flags |= CLONE_INTO_CGROUP;
        cl.cgroup = cg.as_raw_fd() as u64;
    }

    // SAFETY: clone3 with no stack and no CLONE_VM behaves like fork: the child gets a copy of
    // this address space. The child runs only `child_after_clone`, which makes raw system
    // calls on memory prepared above and never returns.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_clone3,
            &cl as *const libc::clone_args,
            std::mem::size_of::<libc::clone_args>(),
        )
    };
    if ret == 0 {
        child_after_clone(&joins, &moves, &program, &argv, &envp, err_w_raw);
    }
    if ret < 0 {
        return Err(io::Error::last_os_error());
    }
    let pid = ret as i32;
    // SAFETY: CLONE_PIDFD made the kernel store a fresh descriptor that we now own.
    let pidfd = unsafe { OwnedFd::from_raw_fd(pidfd) };
    drop(err_w);
    drop(high);

    let mut report = Vec::new();
    std::fs::File::from(err_r).read_to_end(&mut report)?;
    if report.len() >= 5 {
        let stage = STAGE_NAMES[(report[0] as usize).min(STAGE_NAMES.len() - 1)];
        let errno = i32::from_ne_bytes([report[1], report[2], report[3], report[4]]);
        // The child has exited; reap it so it does not linger as a zombie.
        let _ = rustix::process::waitid(
            rustix::process::WaitId::PidFd(rustix::fd::AsFd::as_fd(&pidfd)),
            rustix::process::WaitIdOptions::EXITED,
        );
        let os = io::Error::from_raw_os_error(errno);
        return Err(io::Error::new(
            os.kind(),
            format!("starting {}: {stage} failed: {os}", spec.program.display()),
        ));
    }
    Ok(Spawned { pid, pidfd })
}

/// Runs in the child between clone3 and execve. Raw system calls only; never returns.
fn child_after_clone(
    joins: &[RawFd],
    moves: &[(RawFd, RawFd)],
    program: &CStr,
    argv: &[*const libc::c_char],
    envp: &[*const libc::c_char],
    err_fd: RawFd,
) -> ! {
    let fail = |stage: u8| -> ! {
        // SAFETY: errno location is thread-local and valid; write and exit_group are raw
        // system calls on a buffer on this stack.
        unsafe {
            let e = *libc::__errno_location();
            let b = e.to_ne_bytes();
            let msg = [stage, b[0], b[1], b[2], b[3]];
            libc::write(err_fd, msg.as_ptr().cast(), msg.len());
            libc::syscall(libc::SYS_exit_group, 127);
        }
        #[allow(clippy::empty_loop)]
        loop {}
    };
    // SAFETY: raw system calls with arguments prepared by the parent before the clone.
    unsafe {
        if libc::syscall(libc::SYS_setsid) < 0 {
            fail(0);
        }
        for &fd in joins {
            if libc::syscall(libc::SYS_write, fd, b"0".as_ptr(), 1usize) < 0 {
                fail(1);
            }
        }
        for &(from, to) in moves {
            if libc::syscall(libc::SYS_dup2, from, to) < 0 {
                fail(2);
            }
        }
        let empty: libc::sigset_t = std::mem::zeroed();
        if libc::syscall(
            libc::SYS_rt_sigprocmask,
            libc::SIG_SETMASK,
            &empty as *const libc::sigset_t,
            std::ptr::null_mut::<libc::sigset_t>(),
            8usize,
        ) < 0
        {
            fail(3);
        }
        libc::syscall(
            libc::SYS_execve,
            program.as_ptr(),
            argv.as_ptr(),
            envp.as_ptr(),
        );
    }
    fail(4)
}
