//! CPU scheduling of other processes: `SCHED_IDLE` and core-scheduling cookies.
//!
//! The node applies these to a sandbox's processes from outside (it is root); what a process
//! forks inherits both, so setting them on a sandbox's init and spawner covers every command
//! it starts later.

use std::io;

/// `PR_SCHED_CORE` and its commands (`linux/prctl.h`), and `PIDTYPE_TGID`.
const PR_SCHED_CORE: libc::c_int = 62;
const PR_SCHED_CORE_GET: libc::c_ulong = 0;
const PR_SCHED_CORE_CREATE: libc::c_ulong = 1;
const PIDTYPE_PID: libc::c_ulong = 0;
const PIDTYPE_TGID: libc::c_ulong = 1;

/// Puts thread `tid` under `SCHED_IDLE` (it runs only when nothing else of normal priority
/// wants the CPU).
pub fn set_sched_idle(tid: i32) -> io::Result<()> {
    let param = libc::sched_param { sched_priority: 0 };
    // SAFETY: `param` is a valid sched_param that outlives the call; the call reads it only.
    let r = unsafe { libc::sched_setscheduler(tid, libc::SCHED_IDLE, &param) };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Thread `tid`'s scheduling policy (`SCHED_OTHER`, `SCHED_IDLE`, ...).
pub fn policy(tid: i32) -> io::Result<i32> {
    // SAFETY: no pointers; the kernel only looks the thread up.
    let r = unsafe { libc::sched_getscheduler(tid) };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(r)
}

/// What the kernel offers for core scheduling.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CoreSched {
    /// Built without it (`CONFIG_SCHED_CORE` unset): `prctl` does not know the command.
    Unsupported,
    /// Built with it, but the CPUs have no SMT (no two tasks share a core): nothing to do.
    NoSmt,
    /// Usable.
    Available,
}

/// Probes core scheduling by asking for the calling thread's cookie.
pub fn core_sched() -> CoreSched {
    let mut cookie: u64 = 0;
    // SAFETY: PR_SCHED_CORE_GET writes one u64 to the address given, which is `cookie`.
    let r = unsafe {
        libc::prctl(
            PR_SCHED_CORE,
            PR_SCHED_CORE_GET,
            0 as libc::c_ulong,
            PIDTYPE_PID,
            &mut cookie as *mut u64 as libc::c_ulong,
        )
    };
    if r == 0 {
        return CoreSched::Available;
    }
    match io::Error::last_os_error().raw_os_error() {
        Some(libc::ENODEV) => CoreSched::NoSmt,
        _ => CoreSched::Unsupported,
    }
}

/// Gives process `pid` (all its threads) a new core-scheduling cookie of its own: no task
/// without the same cookie runs on the other hardware threads of a core it runs on. Children
/// it forks later inherit the cookie.
pub fn core_sched_create(pid: i32) -> io::Result<()> {
    // SAFETY: no pointers are passed.
    let r = unsafe {
        libc::prctl(
            PR_SCHED_CORE,
            PR_SCHED_CORE_CREATE,
            pid as libc::c_ulong,
            PIDTYPE_TGID,
            0 as libc::c_ulong,
        )
    };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_thread_can_be_made_idle() {
        std::thread::spawn(|| {
            let tid = rustix::thread::gettid().as_raw_nonzero().get();
            assert_eq!(policy(tid).unwrap(), libc::SCHED_OTHER);
            set_sched_idle(tid).unwrap();
            assert_eq!(policy(tid).unwrap(), libc::SCHED_IDLE);
        })
        .join()
        .unwrap();
    }

    #[test]
    fn the_probe_answers() {
        // Whatever the kernel has, the probe says one of the three without failing.
        let c = core_sched();
        assert!(matches!(
            c,
            CoreSched::Unsupported | CoreSched::NoSmt | CoreSched::Available
        ));
    }
}
