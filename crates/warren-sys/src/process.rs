//! Processes: pidfds, identity that survives pid reuse, signals, reaping.

use std::io;
use std::os::fd::{AsFd, OwnedFd};

use rustix::process::{Pid, PidfdFlags, Signal, WaitIdOptions, WaitOptions};

/// A process's start time in clock ticks after boot (field 22 of `/proc/<pid>/stat`).
///
/// Together with the pid it identifies a process for good: a reused pid has a later start
/// time. `None` when the process does not exist.
pub fn start_time(pid: i32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    parse_start_time(&stat)
}

fn parse_start_time(stat: &str) -> Option<u64> {
    // The command name (field 2) is in parentheses and may hold spaces or parentheses itself,
    // so count fields from the last ')'.
    let rest = &stat[stat.rfind(')')? + 1..];
    // After ')' come field 3 (state) onwards; start time is field 22.
    rest.split_whitespace().nth(22 - 3)?.parse().ok()
}

/// Opens a pidfd for `pid`.
pub fn pidfd_open(pid: i32) -> io::Result<OwnedFd> {
    let pid = Pid::from_raw(pid).ok_or_else(|| io::Error::from(io::ErrorKind::InvalidInput))?;
    Ok(rustix::process::pidfd_open(pid, PidfdFlags::empty())?)
}

/// Sends SIGKILL through a pidfd. Succeeds when the process is already gone.
pub fn pidfd_kill(pidfd: impl AsFd) -> io::Result<()> {
    match rustix::process::pidfd_send_signal(pidfd, Signal::KILL) {
        Ok(()) | Err(rustix::io::Errno::SRCH) => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// Whether the process behind a pidfd has exited (the pidfd polls readable).
pub fn pidfd_exited(pidfd: impl AsFd) -> bool {
    pidfd_wait(pidfd, std::time::Duration::ZERO)
}

/// Waits up to `timeout` for the process behind a pidfd to exit; returns whether it has.
pub fn pidfd_wait(pidfd: impl AsFd, timeout: std::time::Duration) -> bool {
    let mut fds = [rustix::event::PollFd::new(
        &pidfd,
        rustix::event::PollFlags::IN,
    )];
    let ts = rustix::time::Timespec {
        tv_sec: timeout.as_secs() as i64,
        tv_nsec: timeout.subsec_nanos() as i64,
    };
    loop {
        match rustix::event::poll(&mut fds, Some(&ts)) {
            Ok(n) => return n > 0,
            Err(rustix::io::Errno::INTR) => continue,
            Err(_) => return false,
        }
    }
}

/// Reaps the process behind a pidfd if it is our child and has exited. Returns whether it was
/// reaped; `false` for a process that is not our child (e.g. adopted after a restart).
pub fn pidfd_reap(pidfd: impl AsFd) -> bool {
    matches!(
        rustix::process::waitid(
            rustix::process::WaitId::PidFd(pidfd.as_fd()),
            WaitIdOptions::EXITED | WaitIdOptions::NOHANG,
        ),
        Ok(Some(_))
    )
}

/// Resolves when the process behind `pidfd` exits (the pidfd becomes readable). Needs a tokio
/// runtime with I/O enabled.
pub async fn exited<T: std::os::fd::AsRawFd>(pidfd: T) -> io::Result<()> {
    // SAFETY: the AsyncFd owns `pidfd` (an OwnedFd, or an Arc of one that keeps it open), so
    // the descriptor stays open and refers to the same pidfd for the AsyncFd's whole life,
    // which is what `register` requires.
    let fd = unsafe { tokio::io::unix::AsyncFd::register(pidfd) }.map_err(|e| e.into_parts().1)?;
    let _ = fd.readable().await?;
    Ok(())
}

/// How a reaped child ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exit {
    /// It exited with a code.
    Code(i32),
    /// A signal ended it.
    Signal(i32),
}

/// Reaps one exited child of this process without blocking: `Some((pid, how))`, or `None`
/// when no child has exited (or there are no children).
pub fn reap_any() -> Option<(i32, Exit)> {
    // waitpid(-1): any child. (rustix's waitpid(None) is pid 0, this process group only.)
    match rustix::process::wait(WaitOptions::NOHANG) {
        Ok(Some((pid, status))) => {
            let how = if let Some(code) = status.exit_status() {
                Exit::Code(code)
            } else if let Some(sig) = status.terminating_signal() {
                Exit::Signal(sig)
            } else {
                return None;
            };
            Some((pid.as_raw_nonzero().get(), how))
        }
        _ => None,
    }
}

/// Sends `signal` to the process group `pgid`.
pub fn kill_group(pgid: i32, signal: i32) -> io::Result<()> {
    let pid = Pid::from_raw(pgid).ok_or_else(|| io::Error::from(io::ErrorKind::InvalidInput))?;
    // SAFETY: from_raw_unchecked accepts any number; the kernel validates it.
    let sig = unsafe { Signal::from_raw_unchecked(signal) };
    Ok(rustix::process::kill_process_group(pid, sig)?)
}

/// Sends `signal` to the process `pid`.
pub fn kill(pid: i32, signal: i32) -> io::Result<()> {
    let pid = Pid::from_raw(pid).ok_or_else(|| io::Error::from(io::ErrorKind::InvalidInput))?;
    // SAFETY: from_raw_unchecked accepts any number; the kernel validates it.
    let sig = unsafe { Signal::from_raw_unchecked(signal) };
    Ok(rustix::process::kill_process(pid, sig)?)
}

/// Parses a signal name (`TERM`, `SIGTERM`, `sigkill`) or number.
pub fn parse_signal(s: &str) -> Option<i32> {
    if let Ok(n) = s.parse::<i32>() {
        return (1..=64).contains(&n).then_some(n);
    }
    let up = s.to_ascii_uppercase();
    let name = up.strip_prefix("SIG").unwrap_or(&up);
    Some(match name {
        "HUP" => libc::SIGHUP,
        "INT" => libc::SIGINT,
        "QUIT" => libc::SIGQUIT,
        "KILL" => libc::SIGKILL,
        "USR1" => libc::SIGUSR1,
        "USR2" => libc::SIGUSR2,
        "PIPE" => libc::SIGPIPE,
        "ALRM" => libc::SIGALRM,
        "TERM" => libc::SIGTERM,
        "CONT" => libc::SIGCONT,
        "STOP" => libc::SIGSTOP,
        "TSTP" => libc::SIGTSTP,
        "WINCH" => libc::SIGWINCH,
        _ => return None,
    })
}

/// Number of threads on the host and `kernel.pid_max`, for admission.
pub fn thread_usage() -> io::Result<(u32, u32)> {
    let loadavg = std::fs::read_to_string("/proc/loadavg")?;
    // "0.00 0.01 0.05 1/123 4567": the fourth field is running/total.
    let threads = loadavg
        .split_whitespace()
        .nth(3)
        .and_then(|f| f.split('/').nth(1))
        .and_then(|n| n.parse().ok())
        .ok_or_else(|| io::Error::other("unexpected /proc/loadavg format"))?;
    let pid_max = std::fs::read_to_string("/proc/sys/kernel/pid_max")?
        .trim()
        .parse()
        .map_err(|_| io::Error::other("unexpected kernel.pid_max"))?;
    Ok((threads, pid_max))
}

/// Takes ownership of descriptor `fd`, inherited from the parent across exec. Fails when no
/// such descriptor is open.
pub fn inherited_fd(fd: i32) -> io::Result<OwnedFd> {
    // SAFETY: F_GETFD only queries the descriptor table.
    if unsafe { libc::fcntl(fd, libc::F_GETFD) } < 0 {
        return Err(io::Error::new(
            io::ErrorKind::NotFound,
            format!("descriptor {fd} was not passed to this process"),
        ));
    }
    // SAFETY: the descriptor is open (checked above) and nothing else in this process owns it:
    // it was inherited, and callers take each number once at start-up.
    let owned = unsafe { <OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fd) };
    rustix::io::fcntl_setfd(&owned, rustix::io::FdFlags::CLOEXEC)?;
    Ok(owned)
}

/// CPU time process `pid` used, and its reaped children (`utime + stime + cutime + cstime`
/// of `/proc/<pid>/stat`), ns; `None` when it is gone.
pub fn cpu_time_ns(pid: i32) -> Option<u64> {
    // Bytes, not text: a process may name itself with bytes that are not UTF-8.
    let stat = std::fs::read(format!("/proc/{pid}/stat")).ok()?;
    // The command name is in parentheses and may hold anything: fields count from after it.
    let after = stat.iter().rposition(|b| *b == b')')? + 1;
    let rest = std::str::from_utf8(&stat[after..]).ok()?;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // After the name: state is field 3, utime 14 ... cstime 17 (1-based, proc(5)).
    let ticks: u64 = fields
        .get(11..15)?
        .iter()
        .filter_map(|f| f.parse::<u64>().ok())
        .sum();
    let hz = rustix::param::clock_ticks_per_second().max(1);
    Some(ticks.saturating_mul(1_000_000_000) / hz)
}

/// The most of a process's `/proc/<pid>/maps` read (a process may hold ~65,000 mappings,
/// ~100 bytes each).
const MAPS_MAX: u64 = 8 << 20;

/// Ranges of a process's memory worth reading back after a reclaim: its writable mappings
/// (anonymous memory, heap, stacks, shared memory), not the kernel's special ones.
fn prefetch_ranges(maps: &[u8]) -> Vec<(usize, usize)> {
    let mut out = Vec::new();
    for line in maps.split(|b| *b == b'\n') {
        // `start-end perms offset dev inode [name]`; the name may hold anything, so only the
        // first five fields are split off and the rest is the name.
        let Ok(line) = std::str::from_utf8(line) else {
            // A name that is not UTF-8: the fields before it are ASCII.
            let mut f = line.splitn(6, |b| *b == b' ');
            let (Some(range), Some(perms)) = (f.next(), f.next()) else {
                continue;
            };
            if let (Ok(r), Ok(p)) = (std::str::from_utf8(range), std::str::from_utf8(perms))
                && let Some(x) = parse_range(r, p, "")
            {
                out.push(x);
            }
            continue;
        };
        let mut f = line.splitn(6, ' ');
        let (Some(range), Some(perms)) = (f.next(), f.next()) else {
            continue;
        };
        let name = f.nth(3).unwrap_or("").trim_start();
        if let Some(x) = parse_range(range, perms, name) {
            out.push(x);
        }
    }
    out
}

fn parse_range(range: &str, perms: &str, name: &str) -> Option<(usize, usize)> {
    if perms.as_bytes().get(1) != Some(&b'w') {
        return None;
    }
    if name.starts_with('[')
        && !(name == "[heap]" || name.starts_with("[stack") || name.starts_with("[anon"))
    {
        return None;
    }
    let (a, b) = range.split_once('-')?;
    let a = usize::from_str_radix(a, 16).ok()?;
    let b = usize::from_str_radix(b, 16).ok()?;
    (b > a).then_some((a, b - a))
}

/// Asks the kernel to read back what of process `pid`'s writable memory was swapped out
/// (`process_madvise(MADV_WILLNEED)` over its writable mappings), so that it does not fault
/// page by page when it next runs. Returns the bytes of the ranges advised (not what was
/// read: most of it may never have left); 0 for a process that is gone. Blocking: on zram
/// the reads decompress at once.
///
/// The mappings are read from `/proc/<pid>/maps` after a pidfd is taken, and the pidfd is
/// checked to be alive after: so the mappings are that process's, and the advice goes to it
/// alone whatever they say (`MADV_WILLNEED` changes no contents).
pub fn prefetch_swapped(pid: i32) -> io::Result<u64> {
    use std::io::Read;
    use std::os::fd::AsRawFd;
    let gone = |e: &io::Error| {
        e.raw_os_error() == Some(libc::ESRCH) || e.kind() == io::ErrorKind::NotFound
    };
    let pidfd = match pidfd_open(pid) {
        Ok(fd) => fd,
        Err(e) if gone(&e) => return Ok(0),
        Err(e) => return Err(e),
    };
    let mut maps = Vec::new();
    let read = std::fs::File::open(format!("/proc/{pid}/maps"))
        .and_then(|f| f.take(MAPS_MAX).read_to_end(&mut maps));
    match read {
        Ok(_) => {}
        // A process that exited between the two reads maps nothing any more.
        Err(e) if gone(&e) || pidfd_exited(&pidfd) => return Ok(0),
        Err(e) => return Err(e),
    }
    if pidfd_exited(&pidfd) {
        return Ok(0);
    }
    let ranges = prefetch_ranges(&maps);
    let mut advised = 0u64;
    // At most UIO_MAXIOV (1024) ranges per call; the kernel stops at the first range it
    // refuses and returns what it advised before it, so that range is stepped over.
    let mut rest = &ranges[..];
    while !rest.is_empty() {
        let batch = &rest[..rest.len().min(1024)];
        let iov: Vec<libc::iovec> = batch
            .iter()
            .map(|&(start, len)| libc::iovec {
                iov_base: start as *mut libc::c_void,
                iov_len: len,
            })
            .collect();
        // SAFETY: `iov` points at `iov.len()` initialised iovecs that outlive the call; the
        // addresses in them are the other process's and are never dereferenced here.
        let n = unsafe {
            libc::syscall(
                libc::SYS_process_madvise,
                pidfd.as_raw_fd(),
                iov.as_ptr(),
                iov.len(),
                libc::MADV_WILLNEED,
                0u32,
            )
        };
        let mut skip = 0usize;
        if n < 0 {
            let e = io::Error::last_os_error();
            match e.raw_os_error() {
                Some(libc::ESRCH) => return Ok(advised),
                // This kernel has no process_madvise, or it is not allowed here.
                Some(libc::ENOSYS) | Some(libc::EPERM) => return Err(e),
                // The first range was refused (gone, special): step over it.
                _ => skip = 1,
            }
        } else {
            let mut done = n as usize;
            advised += done as u64;
            for &(_, len) in batch {
                if done < len {
                    break;
                }
                done -= len;
                skip += 1;
            }
            if skip < batch.len() {
                // The range it stopped in was refused (or advised in part): step over it.
                skip += 1;
            }
        }
        rest = &rest[skip.min(rest.len())..];
    }
    Ok(advised)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn start_time_parses_odd_command_names() {
        let stat = "42 (a) b) c) S 1 42 42 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 1 0 987654 1000 10";
        assert_eq!(parse_start_time(stat), Some(987654));
        assert!(start_time(std::process::id() as i32).is_some());
    }

    #[test]
    fn signals_parse_by_name_and_number() {
        assert_eq!(parse_signal("TERM"), Some(15));
        assert_eq!(parse_signal("sigkill"), Some(9));
        assert_eq!(parse_signal("2"), Some(2));
        assert_eq!(parse_signal("0"), None);
        assert_eq!(parse_signal("BOGUS"), None);
    }

    #[test]
    fn cpu_time_counts_this_process() {
        let start = std::time::Instant::now();
        let mut x = 0u64;
        while start.elapsed() < std::time::Duration::from_millis(50) {
            x = x.wrapping_add(std::hint::black_box(1));
        }
        std::hint::black_box(x);
        let ns = super::cpu_time_ns(std::process::id() as i32).unwrap();
        assert!(ns >= 10_000_000, "{ns}");
        assert!(super::cpu_time_ns(i32::MAX).is_none());
    }

    #[test]
    fn prefetch_ranges_take_writable_memory_only() {
        let maps = b"5555-6666 r-xp 00000000 08:01 123 /usr/bin/x\n\
7000-8000 rw-p 00000000 00:00 0 [heap]\n\
9000-a000 rw-p 00000000 00:00 0 \n\
b000-c000 rw-s 00000000 00:05 77 /dev/shm/a b [heap]\n\
c000-d000 r--p 00000000 00:00 0 [vvar]\n\
d000-e000 rw-p 00000000 00:00 0 [vsyscall]\n\
e000-f000 rw-p 00000000 00:00 0 [stack]\n\
f000-f000 rw-p 00000000 00:00 0\n\
garbage\n\
10000-11000 rw-p 00000000 08:01 9 /odd\xff\n";
        assert_eq!(
            prefetch_ranges(maps),
            vec![
                (0x7000, 0x1000),
                (0x9000, 0x1000),
                (0xb000, 0x1000),
                (0xe000, 0x1000),
                (0x10000, 0x1000)
            ]
        );
    }

    #[test]
    fn prefetch_advises_this_process() {
        let v = vec![1u8; 4 << 20];
        let n = super::prefetch_swapped(std::process::id() as i32).unwrap();
        assert!(n >= 4 << 20, "{n}");
        std::hint::black_box(v);
        assert_eq!(super::prefetch_swapped(i32::MAX).unwrap(), 0);
    }
}

/// Resource limits a function call's step gets (see the guest's `call` module).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StepLimits {
    /// CPU seconds (`RLIMIT_CPU`).
    pub cpu_seconds: u64,
    /// Largest file it may write, bytes (`RLIMIT_FSIZE`).
    pub file_size: u64,
}

/// Makes `cmd`'s child get `limits`, after the switch to its user and before anything else
/// runs.
pub fn on_exec_limits(cmd: &mut std::process::Command, limits: StepLimits) {
    use std::os::unix::process::CommandExt;
    let set = [
        (libc::RLIMIT_CPU, limits.cpu_seconds),
        (libc::RLIMIT_FSIZE, limits.file_size),
    ];
    // SAFETY: the closure makes only async-signal-safe calls (setrlimit) on values copied
    // into it.
    unsafe {
        cmd.pre_exec(move || {
            for (res, v) in set {
                let lim = libc::rlimit {
                    rlim_cur: v,
                    rlim_max: v,
                };
                if libc::setrlimit(res, &lim) < 0 {
                    return Err(io::Error::last_os_error());
                }
            }
            Ok(())
        });
    }
}

/// What this process's waited-for children used: CPU time (user and system) in microseconds,
/// and the largest resident set among them in bytes.
pub fn children_usage() -> (u64, u64) {
    // SAFETY: all-zero is a valid rusage (plain integers).
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: `ru` is valid for writes.
    if unsafe { libc::getrusage(libc::RUSAGE_CHILDREN, &mut ru) } < 0 {
        return (0, 0);
    }
    let us = |t: libc::timeval| t.tv_sec.max(0) as u64 * 1_000_000 + t.tv_usec.max(0) as u64;
    (
        us(ru.ru_utime) + us(ru.ru_stime),
        ru.ru_maxrss.max(0) as u64 * 1024,
    )
}
