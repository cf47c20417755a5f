//! Starting a sandbox's init: one clone into new namespaces, then `execve` at once.
//!
//! The node daemon is multi-threaded (tokio), so the child of a clone must not run Rust code
//! that could take a lock (malloc, stdio): only raw system calls on memory prepared before the
//! clone. That is what [`spawn`] does, like `posix_spawn`: `clone(CLONE_VM | CLONE_VFORK)` on
//! a small stack of its own (no page tables copied from the daemon), or, when the child must
//! start inside a cgroup v2 directory, `clone3(CLONE_INTO_CGROUP)` fork-style.

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
    /// A network namespace to join instead of creating one (`namespaces.net` must be off):
    /// the child `setns`es into it before anything else.
    pub join_net: Option<BorrowedFd<'a>>,
    /// cgroup v1 `cgroup.procs` files (opened for writing): the child writes "0" to each,
    /// joining those cgroups before it execs.
    pub join_cgroups: &'a [BorrowedFd<'a>],
    /// cgroup v2 directory to start in (`CLONE_INTO_CGROUP`).
    pub into_cgroup: Option<BorrowedFd<'a>>,
    /// File descriptors for the child: `(fd in the parent, number in the child)`. Every other
    /// descriptor is closed on exec (the daemon opens everything close-on-exec).
    pub fds: &'a [(BorrowedFd<'a>, RawFd)],
    /// Programs tried in turn after `program` when it is missing or not executable (a `PATH`
    /// search prepared by the caller).
    pub search: &'a [&'a Path],
    /// Make the child a child of the caller's parent (`CLONE_PARENT`): it reaps it.
    pub sibling: bool,
    /// `(uid, gid)` to switch to (no supplementary groups) before the exec.
    pub credentials: Option<(u32, u32)>,
    /// Capabilities (a bit per capability number) raised into the ambient set after the
    /// switch, so the exec'd program holds them: each must be in the caller's permitted and
    /// inheritable sets, and ambient raising must not be locked out. Empty: none.
    pub ambient: u64,
    /// Working directory to change to before the exec.
    pub cwd: Option<&'a Path>,
    /// Clone fork-style (the child gets a copy of this address space instead of borrowing it)
    /// and wait at most this long for its exec; past that the child counts as started, and an
    /// exec that fails later only exits 127. For a caller whose child others may stop before
    /// its exec: once the child has switched to `credentials`, that user's
    /// processes may `SIGSTOP` it, and a caller waiting on a borrowed address space (or without
    /// a bound) would wait for as long as they like. `None`: vfork-style, waiting for the exec.
    /// (The page tables are copied: meant for a small caller such as the guest's spawner.)
    pub fork_exec_wait: Option<std::time::Duration>,
    /// Make the terminal on descriptor 0 (after the moves) the child's controlling terminal
    /// (`TIOCSCTTY`, after its `setsid`), as a terminal session's first process has it.
    pub controlling_tty: bool,
}

impl<'a> SpawnSpec<'a> {
    /// A spec with nothing but the program, its arguments and environment.
    pub fn new(program: &'a Path, args: &'a [&'a str], env: &'a [(&'a str, &'a str)]) -> Self {
        SpawnSpec {
            program,
            args,
            env,
            namespaces: Namespaces::default(),
            join_net: None,
            join_cgroups: &[],
            into_cgroup: None,
            fds: &[],
            search: &[],
            sibling: false,
            credentials: None,
            ambient: 0,
            cwd: None,
            fork_exec_wait: None,
            controlling_tty: false,
        }
    }
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
const STAGE_NAMES: [&str; 11] = [
    "setsid",
    "join cgroup",
    "dup2",
    "sigprocmask",
    "execve",
    "chdir",
    "switching user",
    "setting capabilities",
    "joining the network namespace",
    "setting the controlling terminal",
    "unknown",
];

/// The stage code of a failed exec (the program could not be run at all).
pub const STAGE_EXEC: &str = "execve";

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
    if spec.join_net.is_some() && spec.namespaces.net {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "a child either joins a network namespace or gets a new one, not both",
        ));
    }
    // Everything the child touches is prepared here, before the clone.
    let program = cstring(spec.program.as_os_str().as_bytes(), "program path")?;
    let alternatives: Vec<CString> = spec
        .search
        .iter()
        .map(|p| cstring(p.as_os_str().as_bytes(), "program path"))
        .collect::<io::Result<_>>()?;
    let alternatives: Vec<&CStr> = alternatives.iter().map(CString::as_c_str).collect();
    let cwd = spec
        .cwd
        .map(|c| cstring(c.as_os_str().as_bytes(), "working directory"))
        .transpose()?;
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
    let join_net: RawFd = spec.join_net.map_or(-1, |f| f.as_raw_fd());

    // Error pipe: close-on-exec, so a successful exec closes it and the parent reads EOF.
    let (err_r, err_w) = rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC)?;
    let err_w_raw = err_w.as_raw_fd();

    // Everything else the daemon has open (its listening socket, connections, other sandboxes'
    // descriptors) is closed first thing in the child: close-on-exec alone would leave them
    // open until the exec, and on cgroup v1 the join before it can wait ~10 ms for an RCU
    // grace period — long enough for a restarted daemon to find its port still taken.
    let mut keep: Vec<u32> = joins
        .iter()
        .chain(moves.iter().map(|(from, _)| from))
        .chain(std::iter::once(&err_w_raw))
        .chain((join_net >= 0).then_some(&join_net))
        .map(|&fd| fd as u32)
        .collect();
    keep.sort_unstable();
    keep.dedup();
    let close = close_ranges(&keep);

    let child = ChildArgs {
        close: &close,
        joins: &joins,
        moves: &moves,
        program: &program,
        alternatives: &alternatives,
        argv: &argv,
        envp: &envp,
        err_fd: err_w_raw,
        cwd: cwd.as_deref(),
        credentials: spec.credentials,
        ambient: spec.ambient,
        join_net,
        controlling_tty: spec.controlling_tty,
    };
    let sibling = if spec.sibling {
        libc::CLONE_PARENT as u64
    } else {
        0
    };
    let mut pidfd: libc::c_int = -1;
    let ret = match (spec.into_cgroup, spec.fork_exec_wait) {
        (None, None) => clone_vfork(spec.namespaces.clone_flags() | sibling, &child, &mut pidfd),
        (None, Some(_)) => clone_fork(spec.namespaces.clone_flags() | sibling, &child, &mut pidfd),
        (Some(cg), _) => clone3_into_cgroup(
            spec.namespaces.clone_flags() | sibling,
            cg,
            &child,
            &mut pidfd,
        ),
    };
    if ret < 0 {
        return Err(io::Error::last_os_error());
    }
    let pid = ret as i32;
    // SAFETY: CLONE_PIDFD made the kernel store a fresh descriptor that we now own.
    let pidfd = unsafe { OwnedFd::from_raw_fd(pidfd) };
    drop(err_w);
    drop(high);

    if let Some(wait) = spec.fork_exec_wait {
        // Readable once the child has exec'd (EOF) or failed (its report); a child stopped
        // before either is left to run when it is continued.
        let mut pfd = [rustix::event::PollFd::new(
            &err_r,
            rustix::event::PollFlags::IN,
        )];
        let timeout = rustix::event::Timespec::try_from(wait).map_err(io::Error::other)?;
        let ready = loop {
            match rustix::event::poll(&mut pfd, Some(&timeout)) {
                Err(rustix::io::Errno::INTR) => continue,
                r => break r?,
            }
        };
        if ready == 0 {
            return Ok(Spawned { pid, pidfd });
        }
    }
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
            SpawnError {
                stage,
                errno,
                message: format!("starting {}: {stage} failed: {os}", spec.program.display()),
            },
        ));
    }
    Ok(Spawned { pid, pidfd })
}

/// The ranges of descriptor numbers not in `keep` (sorted, no duplicates), for `close_range`.
fn close_ranges(keep: &[u32]) -> Vec<(u32, u32)> {
    let mut out = Vec::with_capacity(keep.len() + 1);
    let mut next: u64 = 0;
    for &k in keep {
        if u64::from(k) > next {
            out.push((next as u32, k - 1));
        }
        next = u64::from(k) + 1;
    }
    if next <= u64::from(u32::MAX) {
        out.push((next as u32, u32::MAX));
    }
    out
}

/// Why a spawn failed: the child's stage and errno (inside the `io::Error`).
#[derive(Debug)]
pub struct SpawnError {
    /// The stage that failed (`execve`: the program could not be run).
    pub stage: &'static str,
    /// Its errno.
    pub errno: i32,
    message: String,
}

impl std::fmt::Display for SpawnError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for SpawnError {}

/// What the child needs, all prepared before the clone.
struct ChildArgs<'a> {
    /// Descriptor ranges to close at once.
    close: &'a [(u32, u32)],
    joins: &'a [RawFd],
    moves: &'a [(RawFd, RawFd)],
    program: &'a CStr,
    alternatives: &'a [&'a CStr],
    argv: &'a [*const libc::c_char],
    envp: &'a [*const libc::c_char],
    err_fd: RawFd,
    cwd: Option<&'a CStr>,
    credentials: Option<(u32, u32)>,
    ambient: u64,
    /// A network namespace to enter, or -1.
    join_net: RawFd,
    controlling_tty: bool,
}

/// `_LINUX_CAPABILITY_VERSION_3` (linux/capability.h): two data words of 32 capabilities.
const LINUX_CAPABILITY_VERSION_3: u32 = 0x2008_0522;

/// `struct __user_cap_header_struct`.
#[repr(C)]
struct CapHeader {
    version: u32,
    pid: libc::c_int,
}

/// `struct __user_cap_data_struct`.
#[repr(C)]
struct CapData {
    effective: u32,
    permitted: u32,
    inheritable: u32,
}

/// Stack for the vfork-style child: it runs a few raw system calls and execs.
const CHILD_STACK: usize = 64 * 1024;

/// `clone(CLONE_VM | CLONE_VFORK)` into new namespaces, like `posix_spawn`: the child borrows
/// this address space (no page tables copied, no copy-on-write faults afterwards, which cost
/// a large multi-threaded daemon more than the rest of the spawn) and this thread sleeps until
/// the child has exec'd or failed. Returns the child's pid, or -1 with errno set.
fn clone_vfork(ns_flags: u64, child: &ChildArgs<'_>, pidfd: &mut libc::c_int) -> i64 {
    let mut stack = vec![0u8; CHILD_STACK];
    // The stack grows down: hand clone its (16-byte aligned) top.
    let top = (stack.as_mut_ptr() as usize + CHILD_STACK) & !15;
    let flags = ns_flags as libc::c_int
        | libc::CLONE_VM
        | libc::CLONE_VFORK
        | libc::CLONE_PIDFD
        | libc::SIGCHLD;
    // Block every signal while the child shares our memory; it restores default handlers
    // before it unblocks them, so no handler of ours ever runs in it.
    let old = block_all_signals();
    // SAFETY: `top` is the top of `stack`, which outlives the child's use of it: with
    // CLONE_VFORK this call returns only once the child has exec'd or exited. The child runs
    // `vfork_child` on that stack, touching only `child` (read-only, prepared above) and
    // making raw system calls. CLONE_PIDFD stores the pidfd in `pidfd` (the parent_tid slot).
    let ret = unsafe {
        libc::clone(
            vfork_child,
            top as *mut libc::c_void,
            flags,
            child as *const ChildArgs<'_> as *mut libc::c_void,
            pidfd as *mut libc::c_int,
        )
    };
    let err = io::Error::last_os_error();
    restore_signals(&old);
    drop(stack);
    if ret < 0 {
        // SAFETY: errno is this thread's; restore the clone's error for the caller.
        unsafe { *libc::__errno_location() = err.raw_os_error().unwrap_or(libc::EINVAL) };
        return -1;
    }
    ret as i64
}

extern "C" fn vfork_child(arg: *mut libc::c_void) -> libc::c_int {
    // SAFETY: `arg` is the ChildArgs the parent passed, alive while the parent waits for us.
    let a = unsafe { &*(arg as *const ChildArgs<'_>) };
    // Our copy of the signal table still names the parent's handlers; reset them so that
    // unblocking signals before exec cannot run parent code in this shared address space.
    reset_signal_handlers();
    child_after_clone(a)
}

/// `clone` fork-style (no `CLONE_VM`, no new stack): the child runs on a copy of this
/// address space, so nothing it or anyone else does to it before its exec touches the
/// caller's memory or holds the caller up. The child runs raw system calls only (as after
/// any clone here), but the page tables are copied: meant for a small caller. The legacy
/// `clone` call, not `clone3`: confined callers see `clone3` answer ENOSYS. Returns the
/// child's pid, or -1 with errno set; in the child it never returns.
fn clone_fork(ns_flags: u64, child: &ChildArgs<'_>, pidfd: &mut libc::c_int) -> i64 {
    let flags = ns_flags | libc::CLONE_PIDFD as u64 | libc::SIGCHLD as u64;
    // No handler of ours may run in the child before it has reset them: block every signal
    // across the clone (the child clears its mask just before its exec).
    let old = block_all_signals();
    // SAFETY: clone without CLONE_VM and with a null stack behaves like fork. x86-64 and
    // aarch64 argument order: flags, stack, parent_tid (where CLONE_PIDFD stores the pidfd),
    // child_tid, tls. The child runs only `reset_signal_handlers` and `child_after_clone`.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_clone,
            flags,
            0usize,
            pidfd as *mut libc::c_int,
            0usize,
            0usize,
        )
    };
    if ret == 0 {
        reset_signal_handlers();
        child_after_clone(child);
    }
    let err = io::Error::last_os_error();
    restore_signals(&old);
    if ret < 0 {
        // SAFETY: errno is this thread's; restore the clone's error for the caller.
        unsafe { *libc::__errno_location() = err.raw_os_error().unwrap_or(libc::EINVAL) };
        return -1;
    }
    ret
}

/// Blocks every signal on this thread; returns the mask it had.
fn block_all_signals() -> libc::sigset_t {
    // SAFETY: sigset_t is plain data; sigfillset and pthread_sigmask only write into the two
    // sets, which are valid for the call.
    unsafe {
        let mut all: libc::sigset_t = std::mem::zeroed();
        let mut old: libc::sigset_t = std::mem::zeroed();
        libc::sigfillset(&mut all);
        libc::pthread_sigmask(libc::SIG_SETMASK, &all, &mut old);
        old
    }
}

/// Puts back a mask [`block_all_signals`] returned. Leaves errno as it was (callers read
/// the clone's error after it).
fn restore_signals(old: &libc::sigset_t) {
    // SAFETY: `old` is a valid set; pthread_sigmask reports errors by return value, not errno.
    unsafe { libc::pthread_sigmask(libc::SIG_SETMASK, old, std::ptr::null_mut()) };
}

/// In a child before its exec: every handler back to its default, so that unblocking
/// signals cannot run the parent's code (and the program starts with default dispositions).
fn reset_signal_handlers() {
    for sig in 1..=64 {
        if sig == libc::SIGKILL || sig == libc::SIGSTOP {
            continue;
        }
        // SAFETY: a raw rt_sigaction with a zeroed sigaction (SIG_DFL, no flags, empty mask).
        unsafe {
            let dfl: libc::sigaction = std::mem::zeroed();
            libc::syscall(
                libc::SYS_rt_sigaction,
                sig,
                &dfl as *const libc::sigaction,
                std::ptr::null_mut::<libc::sigaction>(),
                8usize,
            );
        }
    }
}

/// clone3 with `CLONE_INTO_CGROUP` (cgroup v2): the child starts in its cgroup, with no
/// migration. Fork-style (no new stack), so the child runs on a copy of this thread's stack.
/// Returns the child's pid, or -1 with errno set; in the child it never returns.
fn clone3_into_cgroup(
    ns_flags: u64,
    cgroup: BorrowedFd<'_>,
    child: &ChildArgs<'_>,
    pidfd: &mut libc::c_int,
) -> i64 {
    // SAFETY: clone_args is a plain C struct; all-zero is its documented default.
    let mut cl: libc::clone_args = unsafe { std::mem::zeroed() };
    cl.flags = ns_flags | libc::CLONE_PIDFD as u64 | CLONE_INTO_CGROUP;
    cl.pidfd = pidfd as *mut libc::c_int as u64;
    cl.exit_signal = libc::SIGCHLD as u64;
    cl.cgroup = cgroup.as_raw_fd() as u64;
    // SAFETY: clone3 with no stack and no CLONE_VM behaves like fork: the child gets a copy of
    // this address space. The child runs only `child_after_clone`, which makes raw system
    // calls on memory prepared before the clone and never returns.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_clone3,
            &cl as *const libc::clone_args,
            std::mem::size_of::<libc::clone_args>(),
        )
    };
    if ret == 0 {
        child_after_clone(child);
    }
    ret
}

/// Runs in the child between the clone and execve. Raw system calls only; never returns.
fn child_after_clone(a: &ChildArgs<'_>) -> ! {
    let ChildArgs {
        close,
        joins,
        moves,
        program,
        alternatives,
        argv,
        envp,
        err_fd,
        cwd,
        credentials,
        ambient,
        join_net,
        controlling_tty,
    } = *a;
    let fail = |stage: u8| -> ! {
        // SAFETY: errno location is thread-local and valid; write and exit_group are raw
        // system calls on a buffer on this stack.
        unsafe {
            let e = *libc::__errno_location();
            // A parent that stopped waiting has closed its end: no SIGPIPE for the report,
            // the exit status says enough.
            let ign = libc::sigaction {
                sa_sigaction: libc::SIG_IGN,
                ..std::mem::zeroed()
            };
            libc::syscall(
                libc::SYS_rt_sigaction,
                libc::SIGPIPE,
                &ign as *const libc::sigaction,
                std::ptr::null_mut::<libc::sigaction>(),
                8usize,
            );
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
        for &(lo, hi) in close {
            // Only this child's descriptor table: the clone shared no CLONE_FILES.
            libc::syscall(libc::SYS_close_range, lo, hi, 0u32);
        }
        if join_net >= 0 {
            if libc::syscall(libc::SYS_setns, join_net, libc::CLONE_NEWNET) < 0 {
                fail(8);
            }
            libc::syscall(libc::SYS_close, join_net);
        }
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
        // Before the switch of user: taking a terminal that is no session's needs nothing,
        // but the order keeps it independent of who the child becomes.
        if controlling_tty && libc::syscall(libc::SYS_ioctl, 0, libc::TIOCSCTTY, 0) < 0 {
            fail(9);
        }
        if let Some((uid, gid)) = credentials {
            // Raw system calls: this thread's credentials only (the child has one thread).
            if libc::syscall(libc::SYS_setgroups, 0usize, std::ptr::null::<libc::gid_t>()) < 0
                || libc::syscall(libc::SYS_setresgid, gid, gid, gid) < 0
                || libc::syscall(libc::SYS_setresuid, uid, uid, uid) < 0
            {
                fail(6);
            }
        }
        let mut cap = 0;
        while cap < 64 {
            if ambient & (1u64 << cap) != 0
                && libc::syscall(
                    libc::SYS_prctl,
                    libc::PR_CAP_AMBIENT,
                    libc::PR_CAP_AMBIENT_RAISE,
                    cap as libc::c_ulong,
                    0usize,
                    0usize,
                ) < 0
            {
                fail(7);
            }
            cap += 1;
        }
        if credentials.is_some() {
            // A child switched to a user keeps nothing but its ambient set: permitted,
            // effective and inheritable cut to it. (A switch between two non-zero uids clears
            // nothing by itself, and an inheritable capability would meet a file's
            // inheritable ones at the exec.)
            let header = CapHeader {
                version: LINUX_CAPABILITY_VERSION_3,
                pid: 0,
            };
            let (lo, hi) = (ambient as u32, (ambient >> 32) as u32);
            let data = [
                CapData {
                    effective: lo,
                    permitted: lo,
                    inheritable: lo,
                },
                CapData {
                    effective: hi,
                    permitted: hi,
                    inheritable: hi,
                },
            ];
            if libc::syscall(libc::SYS_capset, &header as *const CapHeader, data.as_ptr()) < 0 {
                fail(7);
            }
        }
        // After the switch: the directory must be the user's to enter.
        if let Some(dir) = cwd
            && libc::syscall(libc::SYS_chdir, dir.as_ptr()) < 0
        {
            fail(5);
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
        // A PATH search: on to the next candidate while the error says "not this one"; a
        // permission error is remembered (it wins over "not found", as in a shell).
        let first = *libc::__errno_location();
        if first != libc::EACCES && first != libc::ENOENT && first != libc::ENOTDIR {
            fail(4);
        }
        let mut denied = first == libc::EACCES;
        for alt in alternatives {
            libc::syscall(libc::SYS_execve, alt.as_ptr(), argv.as_ptr(), envp.as_ptr());
            let e = *libc::__errno_location();
            if e == libc::EACCES {
                denied = true;
            } else if e != libc::ENOENT && e != libc::ENOTDIR {
                fail(4);
            }
        }
        if denied {
            *libc::__errno_location() = libc::EACCES;
        }
    }
    fail(4)
}

#[cfg(test)]
mod close_tests {
    use super::close_ranges;

    #[test]
    fn close_ranges_skip_the_kept_descriptors() {
        assert_eq!(close_ranges(&[]), vec![(0, u32::MAX)]);
        assert_eq!(close_ranges(&[0]), vec![(1, u32::MAX)]);
        assert_eq!(
            close_ranges(&[3, 4, 70]),
            vec![(0, 2), (5, 69), (71, u32::MAX)]
        );
        assert_eq!(close_ranges(&[u32::MAX]), vec![(0, u32::MAX - 1)]);
    }
}

#[cfg(test)]
mod tests {
    use std::io::Read;
    use std::os::fd::AsFd;
    use std::path::Path;

    use super::*;

    fn plain<'a>(
        program: &'a Path,
        args: &'a [&'a str],
        fds: &'a [(BorrowedFd<'a>, RawFd)],
    ) -> SpawnSpec<'a> {
        SpawnSpec {
            program,
            args,
            env: &[("PATH", "/usr/bin:/bin")],
            namespaces: Namespaces::default(),
            join_net: None,
            join_cgroups: &[],
            into_cgroup: None,
            fds,
            search: &[],
            sibling: false,
            credentials: None,
            ambient: 0,
            cwd: None,
            fork_exec_wait: None,
            controlling_tty: false,
        }
    }

    #[test]
    fn moves_descriptors_and_execs() {
        let (mut r, w) = std::io::pipe().unwrap();
        let fds = [(w.as_fd(), 3)];
        let s = spawn(&plain(
            Path::new("/bin/sh"),
            &["sh", "-c", "echo hi >&3"],
            &fds,
        ))
        .unwrap();
        drop(w);
        let mut out = String::new();
        r.read_to_string(&mut out).unwrap();
        assert_eq!(out, "hi\n");
        assert!(crate::process::pidfd_wait(
            &s.pidfd,
            std::time::Duration::from_secs(5)
        ));
        assert!(crate::process::pidfd_reap(&s.pidfd));
    }

    #[test]
    fn joins_a_network_namespace_instead_of_making_one() {
        if !rustix::process::geteuid().is_root() {
            eprintln!("skipped: needs root");
            return;
        }
        let ns = crate::net::new_netns().unwrap();
        let want = rustix::fs::fstat(&ns).unwrap().st_ino;
        let (mut r, w) = std::io::pipe().unwrap();
        let s = {
            let fds = [(w.as_fd(), 3)];
            let mut spec = plain(
                Path::new("/bin/sh"),
                &["sh", "-c", "stat -L -c %i /proc/self/ns/net >&3"],
                &fds,
            );
            spec.join_net = Some(ns.as_fd());
            let s = spawn(&spec).unwrap();
            // Joining one and making one at once is refused before any clone.
            spec.namespaces.net = true;
            let e = spawn(&spec).unwrap_err();
            assert_eq!(e.kind(), io::ErrorKind::InvalidInput);
            s
        };
        drop(w);
        let mut out = String::new();
        r.read_to_string(&mut out).unwrap();
        assert_eq!(out.trim(), want.to_string());
        assert!(crate::process::pidfd_wait(
            &s.pidfd,
            std::time::Duration::from_secs(5)
        ));
        assert!(crate::process::pidfd_reap(&s.pidfd));
    }

    #[test]
    fn a_failed_exec_is_an_error_naming_the_step() {
        let err = spawn(&plain(Path::new("/nonexistent/prog"), &["prog"], &[])).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::NotFound);
        assert!(err.to_string().contains("execve failed"), "{err}");
    }

    #[test]
    fn fork_style_execs_reports_failures_and_waits_only_so_long() {
        let wait = Some(std::time::Duration::from_millis(300));
        let (mut r, w) = std::io::pipe().unwrap();
        let fds = [(w.as_fd(), 3)];
        let spec = SpawnSpec {
            fork_exec_wait: wait,
            ..plain(Path::new("/bin/sh"), &["sh", "-c", "echo hi >&3"], &fds)
        };
        let s = spawn(&spec).unwrap();
        drop(w);
        let mut out = String::new();
        r.read_to_string(&mut out).unwrap();
        assert_eq!(out, "hi\n");
        assert!(crate::process::pidfd_wait(
            &s.pidfd,
            std::time::Duration::from_secs(5)
        ));
        assert!(crate::process::pidfd_reap(&s.pidfd));
        let spec = SpawnSpec {
            fork_exec_wait: wait,
            ..plain(Path::new("/nonexistent/prog"), &["prog"], &[])
        };
        let err = spawn(&spec).unwrap_err();
        assert!(err.to_string().contains("execve failed"), "{err}");
        // A child held up before its exec (here: writing into a full pipe, as a "cgroup" to
        // join) does not hold the caller up past the wait; it execs once let go.
        let (mut held_r, held_w) = std::io::pipe().unwrap();
        rustix::io::ioctl_fionbio(&held_w, true).unwrap();
        while rustix::io::write(&held_w, &[0u8; 4096]).is_ok() {}
        rustix::io::ioctl_fionbio(&held_w, false).unwrap();
        let (mut r, w) = std::io::pipe().unwrap();
        let fds = [(w.as_fd(), 3)];
        let joins = [held_w.as_fd()];
        let spec = SpawnSpec {
            fork_exec_wait: wait,
            join_cgroups: &joins,
            ..plain(Path::new("/bin/sh"), &["sh", "-c", "echo late >&3"], &fds)
        };
        let t = std::time::Instant::now();
        let s = spawn(&spec).unwrap();
        assert!(
            t.elapsed() < std::time::Duration::from_secs(3),
            "held up for {:?}",
            t.elapsed()
        );
        drop(w);
        drop(held_w);
        let mut sink = vec![0u8; 1 << 20];
        while held_r.read(&mut sink).unwrap() == sink.len() {}
        let mut out = String::new();
        r.read_to_string(&mut out).unwrap();
        assert_eq!(out, "late\n");
        assert!(crate::process::pidfd_wait(
            &s.pidfd,
            std::time::Duration::from_secs(5)
        ));
        assert!(crate::process::pidfd_reap(&s.pidfd));
    }
}

/// The cgroup v2 path (`clone3` with `CLONE_INTO_CGROUP`), exercised on whatever cgroup2 mount
/// the machine has: CLONE_INTO_CGROUP needs no controller, so a hybrid host's hugetlb-only
/// `unified` hierarchy serves.
#[cfg(test)]
mod v2_tests {
    use std::io::Read;
    use std::os::fd::AsFd;
    use std::path::{Path, PathBuf};

    use super::*;

    fn cgroup2_mount() -> Option<PathBuf> {
        let info = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
        info.lines().find_map(|l| {
            let (left, right) = l.split_once(" - ")?;
            let mount_point = left.split(' ').nth(4)?;
            right
                .starts_with("cgroup2 ")
                .then(|| PathBuf::from(mount_point))
        })
    }

    #[test]
    fn clone_into_cgroup_starts_the_child_in_it() {
        let Some(root) = cgroup2_mount() else {
            eprintln!("SKIP clone_into_cgroup_starts_the_child_in_it: no cgroup2 mount");
            return;
        };
        let dir = root.join(format!("warren-test-spawn-{}", std::process::id()));
        if std::fs::create_dir(&dir).is_err() {
            eprintln!(
                "SKIP clone_into_cgroup_starts_the_child_in_it: cannot create {} (needs root)",
                dir.display()
            );
            return;
        }
        let cg = std::fs::File::open(&dir).unwrap();
        let (mut r, w) = std::io::pipe().unwrap();
        let fds = [(w.as_fd(), 3)];
        let spec = SpawnSpec {
            program: Path::new("/bin/sh"),
            args: &["sh", "-c", "cat /proc/self/cgroup >&3"],
            env: &[("PATH", "/usr/bin:/bin")],
            namespaces: Namespaces::default(),
            join_net: None,
            join_cgroups: &[],
            into_cgroup: Some(cg.as_fd()),
            fds: &fds,
            search: &[],
            sibling: false,
            credentials: None,
            ambient: 0,
            cwd: None,
            fork_exec_wait: None,
            controlling_tty: false,
        };
        let spawned = spawn(&spec);
        drop(w);
        let mut out = String::new();
        let _ = r.read_to_string(&mut out);
        if let Ok(s) = &spawned {
            crate::process::pidfd_wait(&s.pidfd, std::time::Duration::from_secs(5));
            crate::process::pidfd_reap(&s.pidfd);
        }
        let _ = std::fs::remove_dir(&dir);
        spawned.unwrap();
        let name = dir.file_name().unwrap().to_string_lossy().into_owned();
        assert!(
            out.lines()
                .any(|l| l.starts_with("0::") && l.ends_with(&name)),
            "{out}"
        );
    }
}
