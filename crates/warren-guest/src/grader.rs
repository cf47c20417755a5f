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
use warren_types::guest::{CALL_DIR, GraderSpec, InitConfig};

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
    /// A function call's view: made, its files written; answers its id.
    View {
        files: Vec<crate::call::File>,
        tmp_size: u64,
        reply: tokio::sync::oneshot::Sender<io::Result<u64>>,
    },
    /// A step of a function call, in its view and a new PID namespace.
    SpawnIn {
        view: u64,
        cmd: Box<Command>,
        reply: tokio::sync::oneshot::Sender<io::Result<Child>>,
    },
    /// Files of a call's working directory, read back.
    Fetch {
        view: u64,
        paths: Vec<String>,
        max: u64,
        reply: tokio::sync::oneshot::Sender<Vec<warren_types::guest::FetchedFile>>,
    },
    /// A call's view is no longer needed.
    Drop { view: u64 },
}

/// The handle on the grader thread.
pub struct Grader {
    jobs: mpsc::Sender<Work>,
    spec: GraderSpec,
}

/// What the grader's view is made of.
struct Plan {
    lowers: usize,
    binds: Vec<String>,
    spec: GraderSpec,
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
                let mut views = Views::default();
                for work in rx {
                    match work {
                        Work::Spawn(job) => {
                            let r = spawn_in_view(&plan, &base.mnt, job.cmd, job.cwd);
                            let _ = job.reply.send(r);
                        }
                        Work::View {
                            files,
                            tmp_size,
                            reply,
                        } => {
                            let r = call_view(&plan, &base, &files, tmp_size);
                            let _ = reply.send(r.map(|v| views.add(v)));
                        }
                        Work::SpawnIn { view, cmd, reply } => {
                            let r = match views.get(view) {
                                Some(v) => spawn_in_call(&base, v, *cmd),
                                None => Err(io::Error::other("no such call view")),
                            };
                            let _ = reply.send(r);
                        }
                        Work::Fetch {
                            view,
                            paths,
                            max,
                            reply,
                        } => {
                            let r = match views.get(view) {
                                Some(v) => fetch_in(&base, v, &paths, max),
                                None => Vec::new(),
                            };
                            let _ = reply.send(r);
                        }
                        Work::Drop { view } => views.remove(view),
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

    /// Makes a function call's view with `files` in its working directory; its id.
    pub async fn call_view(&self, files: Vec<crate::call::File>, tmp_size: u64) -> io::Result<u64> {
        let (reply, rx) = tokio::sync::oneshot::channel();
        self.jobs
            .send(Work::View {
                files,
                tmp_size,
                reply,
            })
            .map_err(|_| gone())?;
        rx.await.map_err(|_| gone())?
    }

    /// Starts a step of a call in view `view`.
    pub async fn call_spawn(&self, view: u64, cmd: Command) -> io::Result<Child> {
        let (reply, rx) = tokio::sync::oneshot::channel();
        self.jobs
            .send(Work::SpawnIn {
                view,
                cmd: Box::new(cmd),
                reply,
            })
            .map_err(|_| gone())?;
        rx.await.map_err(|_| gone())?
    }

    /// Reads back files of a call's working directory.
    pub async fn call_fetch(
        &self,
        view: u64,
        paths: Vec<String>,
        max: u64,
    ) -> Vec<warren_types::guest::FetchedFile> {
        let (reply, rx) = tokio::sync::oneshot::channel();
        if self
            .jobs
            .send(Work::Fetch {
                view,
                paths,
                max,
                reply,
            })
            .is_err()
        {
            return Vec::new();
        }
        rx.await.unwrap_or_default()
    }

    /// Lets a call's view go (with everything written in it).
    pub fn call_drop(&self, view: u64) {
        let _ = self.jobs.send(Work::Drop { view });
    }
}

fn gone() -> io::Error {
    io::Error::other("the grader thread is gone")
}

/// The grader thread's own namespaces, to come back to.
struct Base {
    mnt: OwnedFd,
    pid: OwnedFd,
    ipc: OwnedFd,
}

/// A call's view: its mount and IPC namespaces, alive while these are open.
struct View {
    mnt: OwnedFd,
    ipc: OwnedFd,
}

#[derive(Default)]
struct Views {
    next: u64,
    open: std::collections::HashMap<u64, View>,
}

impl Views {
    fn add(&mut self, v: View) -> u64 {
        self.next += 1;
        self.open.insert(self.next, v);
        self.next
    }

    fn get(&self, id: u64) -> Option<&View> {
        self.open.get(&id)
    }

    fn remove(&mut self, id: u64) {
        self.open.remove(&id);
    }
}

/// The thread's own set-up: a file-system context of its own, its capabilities cut to what it
/// needs, no_new_privs (so nothing it starts gains privilege, set-user-id files included).
/// Returns the agent's namespaces, to come back to after each command.
fn prepare_thread() -> io::Result<Base> {
    use warren_sys::ns::{Kind, own};
    mount::unshare_fs_for_thread()?;
    let base = Base {
        mnt: mount::own_mount_namespace()?,
        pid: own(Kind::Pid)?,
        ipc: own(Kind::Ipc)?,
    };
    warren_sys::creds::lock_out_exec_capabilities()?;
    warren_sys::creds::keep_only_grader_capabilities()?;
    warren_sys::creds::set_no_new_privs()?;
    Ok(base)
}

/// A function call's view: a fresh mount namespace like a grader command's (the pristine
/// image over a tmpfs of `tmp_size`, no workspace of the agent's), with its own `/dev/shm` and
/// IPC namespace and the call's files in [`CALL_DIR`]; the thread comes back to its own.
fn call_view(
    plan: &Plan,
    base: &Base,
    files: &[crate::call::File],
    tmp_size: u64,
) -> io::Result<View> {
    use warren_sys::ns::{Kind, enter, own, unshare};
    mount::enter_mount_namespace(base.mnt.as_fd())?;
    enter(base.ipc.as_fd(), Kind::Ipc)?;
    let r = (|| {
        mount::unshare_mount_namespace()?;
        unshare(Kind::Ipc)?;
        let call_plan = Plan {
            lowers: plan.lowers,
            binds: plan.binds.clone(),
            spec: GraderSpec {
                uid: plan.spec.uid,
                workspaces: Vec::new(),
                tmp_size,
            },
        };
        build_view_with(&call_plan, |root, g| {
            call_files(root, g, files, plan.spec.uid)
        })?;
        Ok(View {
            mnt: mount::own_mount_namespace()?,
            ipc: own(Kind::Ipc)?,
        })
    })();
    restore(base);
    r
}

/// Puts the grader thread back in its own mount, IPC and PID (for children) namespaces. A
/// thread that cannot come back would start the next grader command or call step in a call's
/// namespaces: the guest stops instead (its sandbox ends).
fn restore(base: &Base) {
    use warren_sys::ns::{Kind, enter};
    let back = mount::enter_mount_namespace(base.mnt.as_fd())
        .and_then(|()| enter(base.ipc.as_fd(), Kind::Ipc))
        .and_then(|()| enter(base.pid.as_fd(), Kind::Pid));
    if let Err(e) = back {
        eprintln!(
            "warren-guest: the grader thread cannot return to its namespaces ({e}); stopping"
        );
        std::process::abort();
    }
}

/// Writes a call's files into a directory of the call's own tmpfs (`g/w`: nothing but this
/// code has written there, so no link can be in the way) and binds it at [`CALL_DIR`] of the
/// view, which must be a real directory there or missing (then it is made).
fn call_files(root: &Path, g: &Path, files: &[crate::call::File], uid: u32) -> io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
    let w = g.join("w");
    std::fs::DirBuilder::new().mode(0o755).create(&w)?;
    std::os::unix::fs::chown(&w, Some(uid), Some(uid))?;
    for f in files {
        let rel = warren_fs::check_relative(Path::new(&f.path))?;
        let mut dir = w.clone();
        if let Some(parent) = rel.parent() {
            for c in parent.components() {
                dir.push(c);
                match std::fs::DirBuilder::new().mode(0o755).create(&dir) {
                    Ok(()) => std::os::unix::fs::chown(&dir, Some(uid), Some(uid))?,
                    Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
                    Err(e) => return Err(e),
                }
            }
        }
        let path = w.join(&rel);
        let mut out = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(if f.executable { 0o755 } else { 0o644 })
            .custom_flags(rustix::fs::OFlags::NOFOLLOW.bits() as i32)
            .open(&path)
            .map_err(|e| io::Error::new(e.kind(), format!("writing {}: {e}", f.path)))?;
        out.write_all(&f.data)?;
        std::os::unix::fs::fchown(&out, Some(uid), Some(uid))?;
    }
    let target = root.join(CALL_DIR.trim_start_matches('/'));
    match std::fs::symlink_metadata(&target) {
        Ok(m) if m.is_dir() => {}
        Ok(_) => {
            return Err(io::Error::other(format!(
                "the image has {CALL_DIR} and it is not a directory"
            )));
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => std::fs::create_dir(&target)?,
        Err(e) => return Err(e),
    }
    mount::bind(&w, &target, false, flags::NOSUID | flags::NODEV)?;
    // Shared memory of its own: nothing a call leaves in /dev/shm reaches the next.
    let shm = root.join("dev/shm");
    if std::fs::symlink_metadata(&shm).is_ok_and(|m| m.is_dir()) {
        mount::mount_fs(
            "tmpfs",
            &shm,
            flags::NOSUID | flags::NODEV,
            Some("size=64m,mode=1777"),
        )?;
    }
    Ok(())
}

/// Starts a call's step: in its view's mount and IPC namespaces, as the first process of a new
/// PID namespace. The thread comes back to its own namespaces (its next children in its own
/// PID namespace again).
fn spawn_in_call(base: &Base, view: &View, mut cmd: Command) -> io::Result<Child> {
    use warren_sys::ns::{Kind, enter, unshare};
    let r = (|| {
        mount::enter_mount_namespace(view.mnt.as_fd())?;
        enter(view.ipc.as_fd(), Kind::Ipc)?;
        enter(base.pid.as_fd(), Kind::Pid)?;
        unshare(Kind::Pid)?;
        cmd.spawn()
    })();
    restore(base);
    r
}

/// Reads back `paths` of a call's working directory: regular files only, no link on the
/// way, `max` bytes in all.
fn fetch_in(
    base: &Base,
    view: &View,
    paths: &[String],
    max: u64,
) -> Vec<warren_types::guest::FetchedFile> {
    use base64::Engine;
    use std::io::Read;
    let b64 = base64::engine::general_purpose::STANDARD;
    let mut out = Vec::new();
    let r = (|| -> io::Result<()> {
        mount::enter_mount_namespace(view.mnt.as_fd())?;
        let dir: OwnedFd = std::fs::File::open(CALL_DIR)?.into();
        let mut left = max;
        for p in paths {
            let read = warren_fs::open_file(dir.as_fd(), Path::new(p), warren_fs::Links::Refuse)
                .and_then(|f| {
                    let mut buf = Vec::new();
                    f.take(left + 1).read_to_end(&mut buf)?;
                    if buf.len() as u64 > left {
                        return Err(io::Error::other(format!(
                            "larger than what is left of the {max} bytes fetched files may \
                             hold together"
                        )));
                    }
                    Ok(buf)
                });
            out.push(match read {
                Ok(buf) => {
                    left -= buf.len() as u64;
                    warren_types::guest::FetchedFile {
                        path: p.clone(),
                        data: Some(b64.encode(&buf)),
                        error: None,
                    }
                }
                Err(e) => warren_types::guest::FetchedFile {
                    path: p.clone(),
                    data: None,
                    error: Some(e.to_string()),
                },
            });
        }
        Ok(())
    })();
    restore(base);
    if let Err(e) = r {
        for p in paths.iter().skip(out.len()) {
            out.push(warren_types::guest::FetchedFile {
                path: p.clone(),
                data: None,
                error: Some(e.to_string()),
            });
        }
    }
    out
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
fn build_view_with(
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
