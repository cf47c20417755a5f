//! Warren's syscall layer: the only crate in the workspace allowed `unsafe` code.
//!
//! Everything here is a narrow, typed wrapper over one kernel interface, so the logic above it
//! (node runtime, guest agent) is safe Rust. Where a well-kept crate already wraps a call
//! safely (`rustix`), we use it; raw `libc` calls are for what it lacks (clone3, setfsuid,
//! interface flags).
//!
//! - [`spawn`]: a vfork-style clone (or clone3 into a v2 cgroup) straight into new namespaces
//!   and exec, with no Rust code beyond raw system calls in the child (safe to call from a
//!   multi-threaded daemon).
//! - [`process`]: pidfds, process identity (pid + start time), reaping.
//! - [`mount`]: mounts, bind mounts, pivot_root.
//! - [`creds`]: capabilities, securebits, no_new_privs, per-thread file system credentials.
//! - [`net`]: bringing up loopback in a fresh network namespace.
//! - [`seccomp`]: system-call filters and their notifications.
//! - [`unix`]: messages with descriptors; a fork for single-threaded processes.
//! - [`confine`]: what a sandbox command gets between fork and exec (limits, Landlock,
//!   filters), and the sandbox's own session keyring.

pub mod blockdev;
pub mod btrfs;
pub mod confine;
pub mod creds;
pub mod mount;
pub mod net;
pub mod ns;
pub mod process;
pub mod pty;
pub mod sched;
pub mod seccomp;
pub mod spawn;
pub mod unix;

pub use rustix::io::Errno;
