//! The grader role: commands that run as a uid of their own, with the image's pristine system
//! files and the agent's workspace.
//!
//! An agent may overwrite `/bin/bash`, plant a `python3` earlier in `PATH` or edit `/etc`, even
//! as root: its writable layer is its own. A grader command must not run what the agent left.
//! Each one gets a fresh mount namespace of its own, built by a dedicated thread of the guest
//! (the only one that keeps the capabilities to mount; agent commands are forked from other
//! threads): an overlay of the image's read-only layers (bound at start under
//! [`crate::setup::PRISTINE`], before anything of the agent's existed) over a fresh tmpfs,
//! the image's host paths, the agent's workspace directories bound in (found without
//! following links), `/proc`, `/sys` and the device nodes; then `pivot_root` into it, and the
//! fork. The agent's processes cannot signal, trace or read the grader's: it runs as another
//! uid, and they have no capabilities.

use std::io;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::sync::mpsc;

use warren_sys::mount::{self, flags};
use warren_types::guest::{GraderSpec, InitConfig};

use crate::setup::PRISTINE;
use crate::users::User;

/// A spawn the grader thread does.
struct Job {
    cmd: Command,
    cwd: Option<String>,
    reply: mpsc::Sender<io::Result<Child>>,
}

/// What the grader thread is asked to do.
enum Work {
    /// A grader command in a fresh view.
    Spawn(Job),
}

/// The handle on the grader thread.
pub struct Grader {
    jobs: mpsc::Sender<Work>,
    spec: GraderSpec,
}

/// What the grader's view is made of (and a function-call worker's call root: see the
/// `call` module).
pub(crate) struct Plan {
    pub(crate) lowers: usize,
    pub(crate) binds: Vec<String>,
    pub(crate) spec: GraderSpec,
}

impl Grader {
    /// Starts the grader thread. Call it after the root is built and before the guest drops
    /// its capabilities: the thread keeps the few it needs, the others drop theirs.
    pub fn start(cfg: &InitConfig) -> io::Result<Grader> {
        let plan = Plan {
            lowers: cfg.rootfs.lowers.len(),
            binds: cfg.rootfs.binds.iter().map(|b| b.target.clone()).collect(),
            spec: cfg.grader.clone(),
        };
        let (tx, rx) = mpsc::channel::<Work>();
        let (ready_tx, ready_rx) = mpsc::channel::<io::Result<()>>();
        std::thread::Builder::new()
            .name("grader".into())
            .spawn(move || {
                let base = match prepare_thread() {
                    Ok(ns) => {
                        let _ = ready_tx.send(Ok(()));
                        ns
                    }
                    Err(e) => {
                        let _ = ready_tx.send(Err(e));
                        return;
                    }
                };
                for work in rx {
                    match work {
                        Work::Spawn(job) => {
                            let r = spawn_in_view(&plan, &base, job.cmd, job.cwd);
                            let _ = job.reply.send(r);
                        }
                    }
                }
            })?;
        ready_rx
            .recv()
            .map_err(|_| io::Error::other("the grader thread died at start"))??;
        Ok(Grader {
            jobs: tx,
            spec: cfg.grader.clone(),
        })
    }

    /// The user grader commands run as.
    pub fn user(&self) -> User {
        User {
            name: "grader".into(),
            uid: self.spec.uid,
            gid: self.spec.uid,
            home: "/home/grader".into(),
            shell: "/bin/sh".into(),
        }
    }

    /// Spawns `cmd` in a fresh grader view, in `cwd` (default: the first workspace there is).
    pub fn spawn(&self, cmd: Command, cwd: Option<String>) -> io::Result<Child> {
        let (reply, rx) = mpsc::channel();
        self.jobs
            .send(Work::Spawn(Job { cmd, cwd, reply }))
            .map_err(|_| gone())?;
        rx.recv().map_err(|_| gone())?
    }
}

fn gone() -> io::Error {
    io::Error::other("the grader thread is gone")
}

/// The thread's own set-up: a file-system context of its own, its capabilities cut to what it
/// needs, no_new_privs (so nothing it starts gains privilege, set-user-id files included).
/// Returns the agent's mount namespace, to come back to after each command.
fn prepare_thread() -> io::Result<OwnedFd> {
    mount::unshare_fs_for_thread()?;
    let base = mount::own_mount_namespace()?;
    warren_sys::creds::lock_out_exec_capabilities()?;
    warren_sys::creds::keep_only_grader_capabilities()?;
    warren_sys::creds::set_no_new_privs()?;
    Ok(base)
}

/// Builds a fresh view, spawns `cmd` in it, and comes back to the agent's namespace.
fn spawn_in_view(
    plan: &Plan,
    base: &OwnedFd,
    mut cmd: Command,
    cwd: Option<String>,
) -> io::Result<Child> {
    mount::enter_mount_namespace(base.as_fd())?;
    let r = (|| {
        mount::unshare_mount_namespace()?;
        build_view(plan)?;
        let cwd = cwd.unwrap_or_else(|| {
            plan.spec
                .workspaces
                .iter()
                .find(|w| Path::new(w).is_dir())
                .cloned()
                .unwrap_or_else(|| "/".into())
        });
        cmd.current_dir(cwd);
        cmd.spawn()
    })();
    // Back to the agent's namespace whatever happened (the new one lives on in the child).
    mount::enter_mount_namespace(base.as_fd())?;
    r
}

/// In a fresh copy of the agent's namespace: mounts the grader's root and pivots into it.
fn build_view(plan: &Plan) -> io::Result<()> {
    build_view_with(plan, |_, _| Ok(()))
}

/// [`build_view`], with `extra` run on the new root (and the tmpfs `g` under it) just before
/// the pivot.
pub(crate) fn build_view_with(
    plan: &Plan,
    extra: impl FnOnce(&Path, &Path) -> io::Result<()>,
) -> io::Result<()> {
    let pristine = Path::new(PRISTINE);
    let g = pristine.join("g");
    let size = format!("size={},mode=0755", plan.spec.tmp_size);
    mount::mount_fs("tmpfs", &g, flags::NOSUID | flags::NODEV, Some(&size))?;
    for d in ["upper", "work", "root"] {
        std::fs::create_dir(g.join(d))?;
    }
    let lowers: Vec<String> = (0..plan.lowers)
        .map(|i| pristine.join(format!("l{i}")).display().to_string())
        .collect();
    let lowers: Vec<&str> = lowers.iter().map(String::as_str).collect();
    let root = g.join("root");
    let (upper, work) = (g.join("upper"), g.join("work"));
    mount::mount_overlay(
        &root,
        &lowers,
        &upper.display().to_string(),
        &work.display().to_string(),
    )?;
    let ro = flags::RDONLY | flags::NOSUID | flags::NODEV;
    for (i, target) in plan.binds.iter().enumerate() {
        let t = root.join(target.trim_start_matches('/'));
        mount::bind(&pristine.join(format!("b{i}")), &t, true, ro)?;
    }
    // The agent's workspace, as the agent left it: each directory found without following a
    // link (an agent's link must not choose what the grader sees), bound over the pristine one.
    for w in &plan.spec.workspaces {
        let Ok(fd) = open_workspace(w) else { continue };
        let t = root.join(w.trim_start_matches('/'));
        std::fs::create_dir_all(&t)?;
        let src = PathBuf::from(format!("/proc/self/fd/{}", fd.as_raw_fd()));
        mount::bind(&src, &t, false, flags::NOSUID | flags::NODEV)?;
    }
    // The kernel's views, with the agent's masks; the device nodes; a home of its own.
    mount::bind(Path::new("/proc"), &root.join("proc"), true, 0)?;
    mount::bind(Path::new("/sys"), &root.join("sys"), true, ro)?;
    mount::bind(Path::new("/dev"), &root.join("dev"), false, 0)?;
    // The pristine sources' directory is the grader uid's, which grader commands and calls
    // run as: covered by an empty read-only tmpfs, or one could leave files there (in the
    // sandbox's /dev, which every view shares) for the next.
    let covered = root.join(PRISTINE.trim_start_matches('/'));
    if std::fs::symlink_metadata(&covered).is_ok_and(|m| m.is_dir()) {
        mount::mount_fs(
            "tmpfs",
            &covered,
            flags::RDONLY | flags::NOSUID | flags::NODEV | flags::NOEXEC,
            Some("size=4k,mode=0555"),
        )?;
    }
    let home = root.join("home/grader");
    std::fs::create_dir_all(&home)?;
    std::os::unix::fs::chown(&home, Some(plan.spec.uid), Some(plan.spec.uid))?;
    extra(&root, &g)?;
    std::env::set_current_dir(&root)?;
    mount::pivot_root_here()
}

/// Opens workspace directory `path` of the agent's tree with no link anywhere on the way.
fn open_workspace(path: &str) -> io::Result<OwnedFd> {
    let rel = Path::new(path.trim_start_matches('/'));
    let root: OwnedFd = std::fs::File::open("/")?.into();
    warren_fs::open_dir_beneath(root.as_fd(), rel)
}
