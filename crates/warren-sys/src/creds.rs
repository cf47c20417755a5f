//! Credentials: capabilities, securebits, no_new_privs, dumpability, and per-thread file
//! system identity.

use std::io;

use rustix::thread::{CapabilitiesSecureBits, CapabilitySet, CapabilitySets};

/// Highest capability number we drop from the bounding set (the kernel knows up to 40 today;
/// numbers past its last are EINVAL and ignored).
const LAST_CAP: i32 = 63;

/// `CAP_SETPCAP` (linux/capability.h).
const CAP_SETPCAP: i32 = 8;

/// Locks this process and everything it starts out of root's automatic capabilities: with
/// `SECBIT_NOROOT` (locked), a program exec'd by uid 0 gets no capabilities, and with an
/// empty bounding set no file capability can grant any. The caller keeps its own.
///
/// Needs `CAP_SETPCAP`, which it drops from the bounding set last.
pub fn lock_out_exec_capabilities() -> io::Result<()> {
    lock_out_exec_capabilities_but_ambient(false)
}

/// [`lock_out_exec_capabilities`], except that with `ambient` the ambient set stays open to
/// raising: a builder sandbox's spawner raises [`build_capabilities`] into it for the
/// commands it starts as root, which is the only way they get any (the bounding set is
/// still emptied, so no file capability or set-user-id root program grants one).
pub fn lock_out_exec_capabilities_but_ambient(ambient: bool) -> io::Result<()> {
    let mut bits = CapabilitiesSecureBits::NO_ROOT | CapabilitiesSecureBits::NO_ROOT_LOCKED;
    if !ambient {
        bits |= CapabilitiesSecureBits::NO_CAP_AMBIENT_RAISE
            | CapabilitiesSecureBits::NO_CAP_AMBIENT_RAISE_LOCKED;
    }
    rustix::thread::set_capabilities_secure_bits(bits)?;
    rustix::thread::clear_ambient_capability_set()?;
    for cap in (0..=LAST_CAP).filter(|c| *c != CAP_SETPCAP) {
        drop_bounding(cap)?;
    }
    drop_bounding(CAP_SETPCAP)
}

fn drop_bounding(cap: i32) -> io::Result<()> {
    // SAFETY: PR_CAPBSET_DROP takes an integer and touches no memory.
    let r = unsafe { libc::prctl(libc::PR_CAPBSET_DROP, cap as libc::c_ulong, 0, 0, 0) };
    if r < 0 {
        let e = io::Error::last_os_error();
        if e.raw_os_error() == Some(libc::EINVAL) {
            return Ok(()); // a capability this kernel does not know
        }
        return Err(e);
    }
    Ok(())
}

/// What the commands of an image build run as root hold, in a builder sandbox only (never an
/// agent's): what `useradd`, `chown`, `chmod u+s`, package installers and their maintainer
/// scripts need, which is the usual container runtimes' default set less what reaches past the
/// sandbox's own files: no `CAP_MKNOD` (device nodes), `CAP_NET_RAW`, `CAP_SETPCAP`,
/// `CAP_DAC_READ_SEARCH` (`open_by_handle_at` reaches files by handle, past any mount) or
/// `CAP_SYS_*` beyond `chroot`.
pub fn build_capabilities() -> CapabilitySet {
    CapabilitySet::CHOWN
        | CapabilitySet::DAC_OVERRIDE
        | CapabilitySet::FOWNER
        | CapabilitySet::FSETID
        | CapabilitySet::KILL
        | CapabilitySet::SETGID
        | CapabilitySet::SETUID
        | CapabilitySet::SETFCAP
        | CapabilitySet::NET_BIND_SERVICE
        | CapabilitySet::SYS_CHROOT
        | CapabilitySet::AUDIT_WRITE
}

/// Sets this thread's inheritable capabilities to `set` (each must be permitted, and in the
/// bounding set: call before [`lock_out_exec_capabilities`]). Its other sets stay.
pub fn set_inheritable(set: CapabilitySet) -> io::Result<()> {
    let now = rustix::thread::capabilities(None)?;
    rustix::thread::set_capabilities(
        None,
        CapabilitySets {
            effective: now.effective,
            permitted: now.permitted,
            inheritable: set,
        },
    )?;
    Ok(())
}

/// Capabilities the guest agent keeps for itself: switching users, owning files for them,
/// reading and writing where they cannot, signalling their processes.
pub fn keep_only_agent_capabilities() -> io::Result<()> {
    let keep = CapabilitySet::CHOWN
        | CapabilitySet::DAC_OVERRIDE
        | CapabilitySet::DAC_READ_SEARCH
        | CapabilitySet::FOWNER
        | CapabilitySet::FSETID
        | CapabilitySet::KILL
        | CapabilitySet::SETGID
        | CapabilitySet::SETUID;
    rustix::thread::set_capabilities(
        None,
        CapabilitySets {
            effective: keep,
            permitted: keep,
            inheritable: CapabilitySet::empty(),
        },
    )?;
    Ok(())
}

/// Capabilities the guest's grader thread keeps: building each grader command's view (mounts,
/// `setns`, `pivot_root`), switching to the grader's uid, owning its directories, entering the
/// pristine layers' directory.
pub fn keep_only_grader_capabilities() -> io::Result<()> {
    let keep = CapabilitySet::SYS_ADMIN
        | CapabilitySet::SYS_CHROOT
        | CapabilitySet::CHOWN
        | CapabilitySet::DAC_OVERRIDE
        | CapabilitySet::DAC_READ_SEARCH
        | CapabilitySet::FOWNER
        | CapabilitySet::SETGID
        | CapabilitySet::SETUID;
    rustix::thread::set_capabilities(
        None,
        CapabilitySets {
            effective: keep,
            permitted: keep,
            inheritable: CapabilitySet::empty(),
        },
    )?;
    Ok(())
}

/// Keeps only `CAP_SETUID` and `CAP_SETGID`, effective, permitted, inheritable and ambient,
/// so that a program this process execs as root holds those two and nothing else (the
/// bounding set emptied and `SECBIT_NOROOT` locked beforehand with
/// [`lock_out_exec_capabilities_but_ambient`]`(true)`, after [`set_inheritable`] of the two).
/// For a function-call worker's Python zygote, which forks each call's child and switches it
/// to the grader's uid.
pub fn keep_only_uid_switch_for_exec() -> io::Result<()> {
    let keep = CapabilitySet::SETUID | CapabilitySet::SETGID;
    rustix::thread::set_capabilities(
        None,
        CapabilitySets {
            effective: keep,
            permitted: keep,
            inheritable: keep,
        },
    )?;
    // CAP_SETGID is 6, CAP_SETUID 7 (linux/capability.h).
    for cap in [6u32, 7u32] {
        // SAFETY: prctl with integer arguments only.
        let r = unsafe {
            libc::prctl(
                libc::PR_CAP_AMBIENT,
                libc::PR_CAP_AMBIENT_RAISE as libc::c_ulong,
                cap as libc::c_ulong,
                0 as libc::c_ulong,
                0 as libc::c_ulong,
            )
        };
        if r < 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(())
}

/// Becomes `uid`/`gid` (no supplementary groups) while keeping `CAP_SETUID` and `CAP_SETGID`
/// only, so that the caller can start processes as any user but no process of another uid can
/// signal or trace it. For a single-threaded process (the guest's spawner). `extra` stays
/// permitted and inheritable (not effective), to be raised into its children's ambient sets:
/// empty but for a builder sandbox ([`build_capabilities`], made inheritable beforehand with
/// [`set_inheritable`]).
pub fn become_spawner(uid: u32, gid: u32, extra: CapabilitySet) -> io::Result<()> {
    use rustix::process::{Gid, Uid};
    rustix::thread::set_keep_capabilities(true)?;
    rustix::thread::set_thread_groups(&[])?;
    let (g, u) = (Gid::from_raw(gid), Uid::from_raw(uid));
    rustix::thread::set_thread_res_gid(g, g, g)?;
    rustix::thread::set_thread_res_uid(u, u, u)?;
    let keep = CapabilitySet::SETUID | CapabilitySet::SETGID;
    rustix::thread::set_capabilities(
        None,
        CapabilitySets {
            effective: keep,
            permitted: keep | extra,
            inheritable: extra,
        },
    )?;
    rustix::thread::set_keep_capabilities(false)?;
    Ok(())
}

/// Sets `no_new_privs`: nothing this process execs can gain privileges (set-user-id bits and
/// file capabilities are ignored). Inherited by every child.
pub fn set_no_new_privs() -> io::Result<()> {
    Ok(rustix::thread::set_no_new_privs(true)?)
}

/// Marks the process not dumpable: no core dumps, and `/proc/<pid>/` entries (fd, environ,
/// maps, mem) become inaccessible to processes without `CAP_SYS_PTRACE`.
pub fn set_not_dumpable() -> io::Result<()> {
    Ok(rustix::process::set_dumpable_behavior(
        rustix::process::DumpableBehavior::NotDumpable,
    )?)
}

/// Marks the process dumpable again after a change of uid made it not (the kernel does so on
/// every credential change): its `/proc/<pid>/` entries then belong to its own uid rather
/// than to root, so a root without capabilities (a sandbox's) cannot list its descriptors or
/// raise its `oom_score_adj`; tracing it still needs its uid or `CAP_SYS_PTRACE`.
pub fn set_dumpable() -> io::Result<()> {
    Ok(rustix::process::set_dumpable_behavior(
        rustix::process::DumpableBehavior::Dumpable,
    )?)
}

/// Runs file system calls on this thread as `uid`/`gid` (with no supplementary groups) until
/// dropped: files it creates belong to them and permission checks are theirs. Only this
/// thread changes; the kernel drops the thread's file capabilities while fsuid is not 0.
#[derive(Debug)]
pub struct ActAs {
    _not_send: std::marker::PhantomData<*const ()>,
}

impl ActAs {
    /// Switches this thread's file system identity.
    pub fn new(uid: u32, gid: u32) -> io::Result<ActAs> {
        // setgroups through rustix is a raw per-thread system call (glibc's would change every
        // thread of the process).
        rustix::thread::set_thread_groups(&[])?;
        // SAFETY: setfsgid/setfsuid take integers, touch no memory, and in glibc are direct
        // per-thread system calls.
        unsafe {
            libc::setfsgid(gid);
            libc::setfsuid(uid);
        }
        // setfsuid reports no errors; check that it took.
        // SAFETY: as above; -1 is never a valid id, so this only queries.
        let now = unsafe { libc::setfsuid(u32::MAX) };
        if now as u32 != uid {
            Self::restore();
            return Err(io::Error::other(format!("setfsuid({uid}) did not take")));
        }
        Ok(ActAs {
            _not_send: std::marker::PhantomData,
        })
    }

    fn restore() {
        // SAFETY: as in `new`; back to root for this thread.
        unsafe {
            libc::setfsuid(0);
            libc::setfsgid(0);
        }
        let _ = rustix::thread::set_thread_groups(&[rustix::process::Gid::ROOT]);
    }
}

impl Drop for ActAs {
    fn drop(&mut self) {
        Self::restore();
    }
}
