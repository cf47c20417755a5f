//! What every command the guest starts is confined by: the system-call policy of
//! `seccomp/agent.json` (compiled to one BPF program at build time, see `build.rs`), resource
//! limits, a Landlock ruleset
//! where the kernel has Landlock, and the handling of the policy's notifications: each
//! denied call is answered `EPERM` and counted as an incident.

use std::os::fd::{AsFd, OwnedFd};
use std::sync::Arc;

use tokio::io::Interest;
use warren_sys::confine::Confinement;
use warren_sys::seccomp::{self, Notification, Program};
use warren_types::guest::GuestLimits;

use crate::incidents::Incidents;

include!(concat!(env!("OUT_DIR"), "/syscall_names.rs"));

/// The whole policy: the allowlist, whose default is "notify the guest", the calls that must
/// look absent (clone3) and ENOSYS for calls newer than the review.
const AGENT_BPF: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/agent.bpf"));

const RLIMIT_CORE: u32 = 4;
const RLIMIT_NOFILE: u32 = 7;

/// Builds the confinement, and the guest's end of the socket the listeners arrive on.
pub fn prepare(limits: GuestLimits) -> std::io::Result<(Arc<Confinement>, OwnedFd)> {
    let (mine, theirs) = seccomp::listener_channel()?;
    let landlock = landlock_ruleset();
    let c = Confinement {
        rlimits: vec![
            // No core dumps: they fill the disk and carry memory out of a crashed process.
            (RLIMIT_CORE, 0, 0),
            (
                RLIMIT_NOFILE,
                limits.open_files.min(limits.max_open_files),
                limits.max_open_files,
            ),
        ],
        landlock,
        filters: Vec::new(),
        notify: None,
    };
    let c = if limits.system_call_filter {
        Confinement {
            notify: Some((Program::from_bytes(AGENT_BPF)?, theirs)),
            ..c
        }
    } else {
        c
    };
    Ok((Arc::new(c), mine))
}

/// A Landlock ruleset that forbids making device nodes anywhere (a second lock beside the
/// missing `CAP_MKNOD`); `None` where the kernel has no Landlock. The rest of the agent's view
/// is bounded by its mount namespace; scoped signals and sockets are not used, as each
/// command would be a Landlock domain of its own and could no longer signal the others.
fn landlock_ruleset() -> Option<OwnedFd> {
    use landlock::{AccessFs, Ruleset, RulesetAttr};
    let created = Ruleset::default()
        .handle_access(AccessFs::MakeChar | AccessFs::MakeBlock)
        .ok()?
        .create()
        .ok()?;
    Option::<OwnedFd>::from(created)
}

/// Receives the listener of every confined command and answers its notifications.
pub async fn serve_listeners(sock: OwnedFd, incidents: Arc<Incidents>) {
    let Ok(sock) = seccomp::watch(sock) else {
        eprintln!("warren-guest: cannot watch the listener socket; denials go unanswered");
        return;
    };
    loop {
        let Ok(mut guard) = sock.readable().await else {
            return;
        };
        loop {
            match seccomp::receive_fd(sock.get_ref().as_fd()) {
                Ok(Some(listener)) => {
                    tokio::spawn(answer(listener, incidents.clone()));
                }
                Ok(None) => return,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    guard.clear_ready();
                    break;
                }
                Err(e) => {
                    eprintln!("warren-guest: receiving a listener: {e}");
                    guard.clear_ready();
                    break;
                }
            }
        }
    }
}

/// Answers one command tree's notifications until no process uses its filter any more.
async fn answer(listener: OwnedFd, incidents: Arc<Incidents>) {
    let Ok(fd) = seccomp::watch(listener) else {
        return;
    };
    loop {
        let Ok(mut guard) = fd.ready(Interest::READABLE).await else {
            return;
        };
        loop {
            match seccomp::pending(fd.get_ref().as_fd()) {
                Ok((true, _)) => {}
                Ok((false, true)) | Err(_) => return, // every user of the filter is gone
                Ok((false, false)) => break,
            }
            match seccomp::receive(fd.get_ref().as_fd()) {
                Ok(n) => {
                    // The caller's name before the answer: once answered it may exit before
                    // its /proc entry is read (it waits meanwhile, so a read of ~10 µs).
                    let comm = comm(n.pid);
                    let _ = seccomp::deny(fd.get_ref().as_fd(), n.id, libc_eperm());
                    let (kind, detail) = classify(&n);
                    incidents.record(kind, detail, Some(n.pid as i32), comm);
                }
                // The caller died meanwhile.
                Err(e) if e.raw_os_error() == Some(2) => {}
                Err(_) => return,
            }
        }
        guard.clear_ready();
    }
}

const fn libc_eperm() -> i32 {
    1
}

/// The name of system call `nr`.
pub fn syscall_name(nr: i32) -> String {
    SYSCALL_NAMES
        .iter()
        .find(|(n, _)| *n as i32 == nr)
        .map(|(_, name)| name.to_string())
        .unwrap_or_else(|| format!("syscall {nr}"))
}

/// An incident's kind and detail: an attempt on PID 1 (the guest agent) is `management`,
/// anything else a denied system call.
fn classify(n: &Notification) -> (&'static str, String) {
    let name = syscall_name(n.nr);
    // Which argument names a process, for the calls the policy refuses on PID 1.
    let target = match name.as_str() {
        "ptrace" => Some(n.args[1]),
        "kill" | "tkill" | "tgkill" | "rt_sigqueueinfo" | "rt_tgsigqueueinfo" | "pidfd_open"
        | "process_vm_readv" | "process_vm_writev" | "prlimit64" | "sched_setaffinity"
        | "sched_setscheduler" | "sched_setparam" | "sched_setattr" => Some(n.args[0]),
        "setpriority" | "ioprio_set" => Some(n.args[1]),
        _ => None,
    };
    match target.map(|t| t as u32) {
        Some(1) => ("management", format!("{name} of PID 1 (the guest agent)")),
        Some(pid) if name == "prlimit64" => ("seccomp", format!("{name} of pid {pid}")),
        _ => ("seccomp", name),
    }
}

/// The command name of `pid` in the sandbox.
fn comm(pid: u32) -> Option<String> {
    std::fs::read_to_string(format!("/proc/{pid}/comm"))
        .ok()
        .map(|s| s.trim_end().to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_compiled_policy_loads() {
        let p = Program::from_bytes(AGENT_BPF).unwrap();
        assert!(p.len() > 100, "the allowlist is there");
        assert_eq!(
            syscall_name(0),
            if SYSCALL_NAMES.is_empty() {
                "syscall 0"
            } else {
                "read"
            }
        );
    }

    /// Every system call the kernel headers know is either allowed by `agent.json` or listed,
    /// with the attack its denial stops, in `denied.txt`: the policy is reviewed as a whole.
    #[test]
    fn every_system_call_is_allowed_or_denied_with_a_reason() {
        let json: serde_json::Value =
            serde_json::from_str(include_str!("../seccomp/agent.json")).unwrap();
        let allowed: std::collections::BTreeSet<String> = json["agent"]["filter"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r["syscall"].as_str().unwrap().to_string())
            .collect();
        let denied: std::collections::BTreeMap<String, String> =
            include_str!("../seccomp/denied.txt")
                .lines()
                .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
                .map(|l| {
                    let (n, why) = l.split_once(':').expect("name: reason");
                    (n.trim().to_string(), why.trim().to_string())
                })
                .collect();
        for (n, why) in &denied {
            assert!(!allowed.contains(n), "{n} is both allowed and denied");
            assert!(why.len() > 8, "{n} needs a reason");
        }
        let unreviewed: Vec<&str> = SYSCALL_NAMES
            .iter()
            .map(|(_, n)| *n)
            .filter(|n| !allowed.contains(*n) && !denied.contains_key(*n))
            .collect();
        assert!(
            unreviewed.is_empty(),
            "system calls neither allowed nor denied with a reason: {unreviewed:?}"
        );
    }
}
