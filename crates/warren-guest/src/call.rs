//! Function calls: the call server, the process of a function-call worker that runs its
//! calls (the worker side of the FnCall backend).
//!
//! It is forked from the guest at start, while the guest has one thread and its capabilities
//! (only in a worker: the node says so in the init's configuration), and keeps the few it
//! needs (mounting, making namespaces, switching to the grader's uid). It builds its **call
//! root** once, in a mount namespace of its own: the image's pristine layers as they were at
//! start (never the worker's writable layer), the image's host paths, `/proc`, `/sys` and the
//! device nodes, read-only throughout; then it pivots into it. `/proc` hides other uids'
//! processes from all but group 0 (`hidepid=invisible,gid=0`): a call sees its own, not the
//! worker's. Each call then costs only what is its own:
//!
//! 1. **A fresh tmpfs** (the call's memory size) mounted at a directory only root may enter,
//!    with the call's writable places bound from it: `/work` (its working directory, with its
//!    files), `/tmp`, `/var/tmp`, `/home/grader` and `/dev/shm`. Nothing else in the root is
//!    writable. When the call ends they are unmounted, and everything written goes with them.
//! 2. **Each step in new PID and IPC namespaces**: the server forks a small init (a copy of
//!    itself, the first process of the new PID namespace, root and not dumpable), which forks
//!    the program as the grader's uid under the sandbox's system-call policy, Landlock rules
//!    and the step's resource limits, waits for it, and reports how it ended and what it used
//!    on a pipe the program does not have. When the init exits, or the server kills it at a
//!    limit (wall clock, output), the kernel kills everything else in the namespace.
//!
//! Nothing of one call is there for the next: no files (the tmpfs is gone), no processes (each
//! step's namespace died with its init), no SysV IPC or message queue (each step's IPC
//! namespace likewise), no environment (each program's is built afresh).
//!
//! Protocol, on a socket pair with the guest: a request is a little-endian `u64` length and a
//! JSON [`CallSpec`]; the answer likewise, a JSON [`Answer`]. One call at a time. A server that
//! dies or garbles its answer ends its worker: the node kills a worker whose call failed.

use std::io::{self, Read, Write};
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use base64::Engine;
use serde::{Deserialize, Serialize};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use warren_sys::confine::Confinement;
use warren_sys::mount::{self, flags};
use warren_types::error::ErrorCode;
use warren_types::guest::{CALL_DIR, CallResult, CallSpec, CallStep, InitConfig, StepResult};

use crate::wire::OpError;

/// Largest request the server reads (code and files are at most ~22 MiB in base64).
const MAX_REQUEST: u64 = 64 << 20;
/// Largest answer the guest reads.
const MAX_ANSWER: u64 = 512 << 20;
/// Most output (stdout and stderr of every step) a call may keep in all: in base64, with the
/// fetched files, well within [`MAX_ANSWER`].
const MAX_CALL_OUTPUT: u64 = 256 << 20;
/// Most bytes of fetched files in one call.
const MAX_FETCH: u64 = 64 << 20;
/// Most files in one call.
const MAX_FILES: usize = 1000;
/// Most steps in one call.
const MAX_STEPS: usize = 64;
/// Longest wall-clock limit of a step.
const MAX_TIMEOUT: Duration = Duration::from_secs(3600);
/// Most bytes kept of a step's stdout or stderr.
const MAX_OUTPUT: u64 = 64 << 20;
/// Longest message the server sends before it serves (why it could not start).
const MAX_MESSAGE: usize = 4096;
/// Largest report of an init.
const MAX_REPORT: usize = 4096;
/// How long a killed step's pipes may stay open before the server stops waiting.
const KILL_GRACE: Duration = Duration::from_secs(5);

/// Where the call's tmpfs is mounted: a directory of the call root only root may enter.
const SCRATCH: &str = "/.warren-call";
/// Where the server mounts the message queues of the zygote's IPC namespace, to remove what a
/// call left there: below a directory only root may enter (the mount's own root is 1777, as
/// `mq_open` needs it to be).
const MQUEUES_DIR: &str = "/.warren-mq";
const MQUEUES: &str = "/.warren-mq/q";
/// The interpreter a Python zygote runs (the image's own).
const PYTHON: &str = "/usr/bin/python3";
/// The zygote's program.
const ZYGOTE: &str = include_str!("zygote.py");
/// The `PYTHON*` variables the zygote's child does what an interpreter's start would for (any
/// other sends the step to a fresh interpreter).
const ZYGOTE_ENV: [&str; 2] = ["PYTHONDONTWRITEBYTECODE", "PYTHONUNBUFFERED"];
/// How long a zygote may take to start.
const ZYGOTE_START: Duration = Duration::from_secs(10);

/// The call's writable places: (directory in the tmpfs, where it is bound, mode, the grader's).
const PLACES: [(&str, &str, u32, bool); 5] = [
    ("work", CALL_DIR, 0o755, true),
    ("tmp", "/tmp", 0o1777, false),
    ("var-tmp", "/var/tmp", 0o1777, false),
    ("home", "/home/grader", 0o755, true),
    ("shm", "/dev/shm", 0o1777, false),
];

/// The server's answer to one call.
#[derive(Debug, Serialize, Deserialize)]
enum Answer {
    /// The call ran (its steps may have failed: that is in the result).
    Done(CallResult),
    /// The call was refused (`invalid`: bad input) or could not be set up.
    Refused { invalid: bool, message: String },
}

/// How a step's init says the step ended (one JSON document on its status pipe).
#[derive(Debug, Default, Serialize, Deserialize)]
struct Report {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    exit_code: Option<i32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    signal: Option<i32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    not_started: Option<String>,
    #[serde(default)]
    cpu_us: u64,
    #[serde(default)]
    max_rss: u64,
}

/// The guest's handle on its call server.
pub struct CallServer {
    conn: tokio::sync::Mutex<Conn>,
}

enum Conn {
    /// As forked (before the runtime existed).
    Std(std::os::unix::net::UnixStream),
    Tokio(tokio::net::UnixStream),
    /// It failed once: never trusted again (the node kills the worker).
    Gone,
}

impl CallServer {
    /// Forks the call server. Call while the guest has one thread and all its capabilities,
    /// after the root is built (its pristine layers are bound under [`crate::setup::PRISTINE`]).
    pub fn start(cfg: &InitConfig, confinement: Arc<Confinement>) -> io::Result<CallServer> {
        let (mut mine, theirs) = std::os::unix::net::UnixStream::pair()?;
        let one = warren_sys::unix::OneThread::check()?;
        match warren_sys::unix::fork(&one)? {
            None => {
                drop(mine);
                let code = match serve(theirs, cfg, &confinement, &one) {
                    Ok(()) => 0,
                    Err(e) => {
                        eprintln!("warren-guest call server: {e}");
                        1
                    }
                };
                warren_sys::unix::exit_now(code)
            }
            Some(_) => {
                // It says whether its call root is built: a worker whose server cannot serve
                // does not start (the create fails with why), rather than fail every call.
                let said = read_hello(&mut mine);
                match said.as_slice() {
                    b"ready" => Ok(CallServer {
                        conn: tokio::sync::Mutex::new(Conn::Std(mine)),
                    }),
                    _ => Err(io::Error::other(format!(
                        "the call server did not start: {}",
                        String::from_utf8_lossy(&said).trim()
                    ))),
                }
            }
        }
    }

    /// Runs `spec`.
    pub async fn call(&self, spec: &CallSpec) -> Result<CallResult, OpError> {
        let gone = |e: String| {
            OpError::new(
                ErrorCode::Unavailable,
                format!("the worker's call server failed ({e}); send the call again"),
            )
        };
        let body = serde_json::to_vec(spec).map_err(|e| gone(e.to_string()))?;
        if body.len() as u64 > MAX_REQUEST {
            return Err(OpError::new(
                ErrorCode::InvalidArgument,
                format!("the call is over {MAX_REQUEST} bytes"),
            ));
        }
        let mut conn = self.conn.lock().await;
        if let Conn::Std(s) = &*conn {
            let s = s
                .try_clone()
                .and_then(|s| {
                    s.set_nonblocking(true)?;
                    tokio::net::UnixStream::from_std(s)
                })
                .map_err(|e| gone(e.to_string()));
            *conn = match s {
                Ok(s) => Conn::Tokio(s),
                Err(_) => Conn::Gone,
            };
        }
        // Taken out while the exchange runs: were this future dropped half-way, the next call
        // must not read this one's answer.
        let Conn::Tokio(mut stream) = std::mem::replace(&mut *conn, Conn::Gone) else {
            return Err(gone("it failed before".into()));
        };
        let r = async {
            stream.write_all(&(body.len() as u64).to_le_bytes()).await?;
            stream.write_all(&body).await?;
            let len = stream.read_u64_le().await?;
            if len > MAX_ANSWER {
                return Err(io::Error::other(format!("an answer of {len} bytes")));
            }
            let mut buf = vec![0u8; len as usize];
            stream.read_exact(&mut buf).await?;
            serde_json::from_slice::<Answer>(&buf).map_err(io::Error::other)
        }
        .await;
        if r.is_ok() {
            *conn = Conn::Tokio(stream);
        }
        match r {
            Ok(Answer::Done(r)) => Ok(r),
            Ok(Answer::Refused { invalid, message }) => Err(OpError::new(
                if invalid {
                    ErrorCode::InvalidArgument
                } else {
                    ErrorCode::Internal
                },
                message,
            )),
            Err(e) => Err(gone(e.to_string())),
        }
    }
}

/// Reads the server's first line (`ready`, or why not), at most [`MAX_MESSAGE`] bytes.
fn read_hello(s: &mut std::os::unix::net::UnixStream) -> Vec<u8> {
    let mut said = Vec::new();
    let mut byte = [0u8; 1];
    while said.len() < MAX_MESSAGE {
        match s.read(&mut byte) {
            Ok(1) if byte[0] != b'\n' => said.push(byte[0]),
            Ok(_) => break,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(_) => break,
        }
    }
    said
}

/// The server's life: build the call root, drop what it does not need, say `ready` (or why
/// not), serve calls until the guest hangs up.
fn serve(
    mut sock: std::os::unix::net::UnixStream,
    cfg: &InitConfig,
    c: &Arc<Confinement>,
    one: &warren_sys::unix::OneThread,
) -> io::Result<()> {
    let server = match set_up(&sock, cfg, c, one) {
        Ok(s) => s,
        Err(e) => {
            let mut m = e.to_string().replace('\n', " ");
            m.truncate(MAX_MESSAGE - 1);
            let _ = sock.write_all(format!("{m}\n").as_bytes());
            return Err(e);
        }
    };
    sock.write_all(b"ready\n")?;
    loop {
        let mut len = [0u8; 8];
        match sock.read_exact(&mut len) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(()),
            Err(e) => return Err(e),
        }
        let len = u64::from_le_bytes(len);
        if len > MAX_REQUEST {
            return Err(io::Error::other(format!("a request of {len} bytes")));
        }
        let mut body = vec![0u8; len as usize];
        sock.read_exact(&mut body)?;
        let answer = match serde_json::from_slice::<CallSpec>(&body) {
            Ok(spec) => {
                drop(body);
                server.call(spec)
            }
            Err(e) => Answer::Refused {
                invalid: true,
                message: format!("a call the server cannot read: {e}"),
            },
        };
        let out = serde_json::to_vec(&answer).map_err(io::Error::other)?;
        sock.write_all(&(out.len() as u64).to_le_bytes())?;
        sock.write_all(&out)?;
    }
}

/// Builds the call root and drops what the server does not need.
fn set_up<'a>(
    sock: &std::os::unix::net::UnixStream,
    cfg: &InitConfig,
    c: &Arc<Confinement>,
    one: &'a warren_sys::unix::OneThread,
) -> io::Result<Server<'a>> {
    {
        let mut keep = vec![0, 1, 2, sock.as_raw_fd()];
        keep.extend(c.notify.as_ref().map(|(_, s)| s.as_raw_fd()));
        keep.extend(c.landlock.as_ref().map(|f| f.as_raw_fd()));
        warren_sys::unix::close_all_except(&keep)?;
    }
    rustix::thread::set_name(c"warren-calls")?;
    mount::unshare_mount_namespace()?;
    let plan = crate::grader::Plan {
        lowers: cfg.rootfs.lowers.len(),
        binds: cfg.rootfs.binds.iter().map(|b| b.target.clone()).collect(),
        spec: warren_types::guest::GraderSpec {
            uid: cfg.grader.uid,
            workspaces: Vec::new(),
            tmp_size: 1 << 20,
        },
    };
    crate::grader::build_view_with(&plan, |root, _| {
        // The mount points of the call's places, then the whole root read-only.
        for (_, at, _, _) in PLACES {
            let p = root.join(at.trim_start_matches('/'));
            match std::fs::symlink_metadata(&p) {
                Ok(m) if m.is_dir() => {}
                Ok(_) => {
                    return Err(io::Error::other(format!(
                        "the image has {at} and it is not a directory"
                    )));
                }
                Err(e) if e.kind() == io::ErrorKind::NotFound => {
                    std::fs::DirBuilder::new().recursive(true).create(&p)?
                }
                Err(e) => return Err(e),
            }
        }
        for (d, mode) in [(SCRATCH, 0o700), (MQUEUES_DIR, 0o700), (MQUEUES, 0o755)] {
            let d = root.join(d.trim_start_matches('/'));
            std::fs::create_dir(&d)?;
            std::fs::set_permissions(&d, std::os::unix::fs::PermissionsExt::from_mode(mode))?;
        }
        // The worker's own processes (guest, call server, zygote, killer) are another uid's:
        // hidden from a call, which sees its own processes only. The worker's /proc is this
        // one's (one file system): group 0 (the guest's, which names the processes behind
        // its incident records, and this server's; the kernel's default, said here) still
        // sees all; the grader's processes have no group 0 (their supplementary groups are
        // dropped).
        mount::reconfigure(
            &root.join("proc"),
            flags::NOSUID | flags::NODEV | flags::NOEXEC,
            "hidepid=invisible,gid=0",
        )?;
        mount::remount_flags(root, flags::RDONLY | flags::NOSUID | flags::NODEV)
    })?;
    // Every place must be a directory reached without a link (the image's own links could
    // aim a mount elsewhere).
    let root: OwnedFd = std::fs::File::open("/")?.into();
    for (_, at, _, _) in PLACES {
        warren_fs::open_dir_beneath(root.as_fd(), Path::new(at.trim_start_matches('/')))
            .map_err(|e| io::Error::new(e.kind(), format!("{at} in the image: {e}")))?;
    }
    drop(root);
    let own_ipc = warren_sys::ns::own(warren_sys::ns::Kind::Ipc)?;
    // The zygote, while this process still holds what it must hand on: a worker without one
    // (no python3, or it failed to start) runs Python like any program.
    let zygote = match Zygote::start(cfg.grader.uid, c, one, &own_ipc) {
        Ok(z) => z,
        Err(e) => {
            eprintln!("warren-guest call server: no Python zygote: {e}");
            None
        }
    };
    let killer = match zygote {
        Some(_) => Some(warren_sys::unix::Killer::start(
            one,
            warren_types::guest::KILLER_UID,
            cfg.grader.uid,
        )?),
        None => None,
    };
    warren_sys::creds::lock_out_exec_capabilities()?;
    warren_sys::creds::keep_only_grader_capabilities()?;
    warren_sys::creds::set_not_dumpable()?;
    warren_sys::creds::set_no_new_privs()?;
    Ok(Server {
        uid: cfg.grader.uid,
        confinement: c.clone(),
        own_pid: warren_sys::ns::own(warren_sys::ns::Kind::Pid)?,
        own_ipc,
        had_zygote: zygote.is_some(),
        zygote: std::cell::RefCell::new(zygote),
        killer,
        one,
    })
}

/// A Python zygote (see `zygote.py`): the image's python3, started once, which forks a child
/// per Python step. It runs as root with only `CAP_SETUID` and `CAP_SETGID` (what it needs to
/// make its child the grader, whose switch drops them) under the agent's Landlock ruleset and
/// system-call filter, in an IPC namespace of its own, not dumpable. Its children are not in a
/// PID namespace of their own: after each step every process of the grader's uid is killed
/// (`kill(-1)` as that uid), and every System V object and message queue of the zygote's IPC
/// namespace is removed.
struct Zygote {
    sock: OwnedFd,
    pid: i32,
    /// Its IPC namespace.
    ipc: OwnedFd,
}

impl Zygote {
    fn start(
        uid: u32,
        c: &Confinement,
        one: &warren_sys::unix::OneThread,
        own_ipc: &OwnedFd,
    ) -> io::Result<Option<Zygote>> {
        use warren_sys::ns::{Kind, enter, own, unshare};
        if !std::fs::metadata(PYTHON).is_ok_and(|m| m.is_file()) {
            return Ok(None);
        }
        let (mine, theirs) = rustix::net::socketpair(
            rustix::net::AddressFamily::UNIX,
            rustix::net::SocketType::SEQPACKET,
            rustix::net::SocketFlags::CLOEXEC,
            None,
        )?;
        rustix::net::sockopt::set_socket_timeout(
            &mine,
            rustix::net::sockopt::Timeout::Recv,
            Some(ZYGOTE_START),
        )?;
        unshare(Kind::Ipc)?;
        let made = (|| {
            let ipc = own(Kind::Ipc)?;
            mount::mount_fs(
                "mqueue",
                Path::new(MQUEUES),
                flags::NOSUID | flags::NODEV | flags::NOEXEC,
                None,
            )?;
            io::Result::Ok(ipc)
        })();
        let pid = match &made {
            Ok(_) => match warren_sys::unix::fork(one) {
                Ok(None) => zygote_exec(theirs, c, uid),
                Ok(Some(pid)) => Ok(pid),
                Err(e) => Err(e),
            },
            Err(_) => Err(io::Error::other("no IPC namespace for it")),
        };
        enter(own_ipc.as_fd(), Kind::Ipc)?;
        let ipc = made?;
        let pid = match pid {
            Ok(p) => p,
            Err(e) => {
                let _ = mount::unmount_detach(Path::new(MQUEUES));
                return Err(e);
            }
        };
        drop(theirs);
        let mut buf = [0u8; 16];
        let ready = matches!(rustix::net::recv(&mine, &mut buf, rustix::net::RecvFlags::empty()),
            Ok((5, _)) if &buf[..5] == b"ready");
        if !ready {
            let _ = warren_sys::process::kill(pid, 9);
            let _ = warren_sys::unix::wait_child(pid);
            let _ = mount::unmount_detach(Path::new(MQUEUES));
            return Err(io::Error::other("it did not say ready (see the log above)"));
        }
        rustix::net::sockopt::set_socket_timeout(&mine, rustix::net::sockopt::Timeout::Recv, None)?;
        Ok(Some(Zygote {
            sock: mine,
            pid,
            ipc,
        }))
    }

    /// Stops it (it failed a step, or cannot be trusted with the next), and lets its IPC
    /// namespace go.
    fn end(self) {
        let _ = warren_sys::process::kill(self.pid, 9);
        let _ = warren_sys::unix::wait_child(self.pid);
        let _ = mount::unmount_detach(Path::new(MQUEUES));
    }
}

/// In the zygote's fork: keeps only `CAP_SETUID` and `CAP_SETGID` for what it execs, confines
/// itself as any command (rlimits, Landlock, the agent filter, whose listener goes to the
/// guest), keeps only the socket, and execs the image's python3, isolated, with `zygote.py`.
/// Never returns.
fn zygote_exec(sock: OwnedFd, c: &Confinement, uid: u32) -> ! {
    let r = (|| -> io::Result<io::Error> {
        let ids = rustix::thread::CapabilitySet::SETUID | rustix::thread::CapabilitySet::SETGID;
        warren_sys::creds::set_inheritable(ids)?;
        warren_sys::creds::lock_out_exec_capabilities_but_ambient(true)?;
        warren_sys::creds::keep_only_uid_switch_for_exec()?;
        warren_sys::creds::set_no_new_privs()?;
        // The image's python3 is the image's code, and so is every module it imports: it runs
        // under the agent's Landlock ruleset and system-call filter from its first
        // instruction, as every command does. The guest answers the filter's notifications
        // and records what it denies, for the zygote and for each step's child, which
        // inherits both (a second listener in one process's filters is refused by the kernel,
        // and a second filter would add nothing).
        c.apply_to_self()?;
        rustix::io::fcntl_setfd(&sock, rustix::io::FdFlags::empty())?;
        warren_sys::unix::close_all_except(&[0, 1, 2, sock.as_raw_fd()])?;
        // Isolated (`-I`: no `PYTHON*` variable, no user site, no working directory on the
        // path) and without `site` (`-S`): no `.pth` file or `sitecustomize` of the image
        // runs in the zygote, where it would outlive its call; a step's child runs `site`
        // after its uid switch and limits, as a fresh interpreter would.
        Ok(Command::new(PYTHON)
            .args(["-I", "-S"])
            .arg("-c")
            .arg(ZYGOTE)
            .arg(sock.as_raw_fd().to_string())
            .arg(uid.to_string())
            .env_clear()
            .env("PATH", "/usr/local/bin:/usr/bin:/bin")
            .env("LANG", "C.UTF-8")
            .current_dir("/")
            .stdin(Stdio::null())
            .exec())
    })();
    match r {
        Ok(e) | Err(e) => eprintln!("warren-guest call server: starting the zygote: {e}"),
    }
    warren_sys::unix::exit_now(1)
}

/// What the server keeps between calls.
struct Server<'a> {
    uid: u32,
    confinement: Arc<Confinement>,
    /// Its own PID namespace, to step back into before making each step's.
    own_pid: OwnedFd,
    /// Its own IPC namespace, to come back to once a step's init is forked (a step's IPC
    /// namespace, with whatever it made there, goes when the step's processes do).
    own_ipc: OwnedFd,
    /// The Python zygote, while it serves.
    zygote: std::cell::RefCell<Option<Zygote>>,
    /// Whether it started with one: a worker that lost its zygote asks to be replaced.
    had_zygote: bool,
    /// Ends what a zygote's step left running (with the zygote).
    killer: Option<warren_sys::unix::Killer>,
    one: &'a warren_sys::unix::OneThread,
}

/// A file to write, decoded.
struct File {
    path: PathBuf,
    data: Vec<u8>,
    executable: bool,
}

fn invalid(m: impl Into<String>) -> Answer {
    Answer::Refused {
        invalid: true,
        message: m.into(),
    }
}

/// Checks a call and decodes its files.
fn check(spec: &CallSpec) -> Result<Vec<File>, Answer> {
    let b64 = base64::engine::general_purpose::STANDARD;
    if spec.files.len() > MAX_FILES {
        return Err(invalid(format!(
            "{} files; a call takes at most {MAX_FILES}",
            spec.files.len()
        )));
    }
    if spec.steps.is_empty() || spec.steps.len() > MAX_STEPS {
        return Err(invalid(format!(
            "{} steps; a call has 1 to {MAX_STEPS}",
            spec.steps.len()
        )));
    }
    let mut output = 0u64;
    for s in &spec.steps {
        if s.argv.is_empty() || s.argv.iter().any(|a| a.contains('\0')) {
            return Err(invalid("a step's argv is empty or holds a NUL byte"));
        }
        if Duration::from_millis(s.timeout_ms) > MAX_TIMEOUT || s.timeout_ms == 0 {
            return Err(invalid("a step's timeout is 1 ms to 1 hour"));
        }
        if s.max_output > MAX_OUTPUT {
            return Err(invalid(format!("max_output is at most {MAX_OUTPUT} bytes")));
        }
        output = output.saturating_add(2 * s.max_output);
    }
    if spec.max_fetch > MAX_FETCH {
        return Err(invalid(format!("max_fetch is at most {MAX_FETCH} bytes")));
    }
    if output > MAX_CALL_OUTPUT {
        return Err(invalid(format!(
            "the steps' max_output allows {output} bytes of output in all; a call keeps at \
             most {MAX_CALL_OUTPUT}"
        )));
    }
    if spec
        .env
        .iter()
        .any(|(k, v)| k.is_empty() || k.contains(['=', '\0']) || v.contains('\0'))
    {
        return Err(invalid(
            "an environment variable's name is empty or holds '=' or NUL, or its value NUL",
        ));
    }
    let mut out = Vec::with_capacity(spec.files.len());
    let mut seen = std::collections::HashSet::new();
    for f in &spec.files {
        if f.path.is_empty() || f.path.len() > 255 || f.path.contains('\0') {
            return Err(invalid(format!(
                "file path {:?} is empty, too long or holds NUL",
                f.path
            )));
        }
        let rel =
            warren_fs::check_relative(Path::new(&f.path)).map_err(|e| invalid(e.to_string()))?;
        if rel.as_os_str().is_empty() || !seen.insert(rel.clone()) {
            return Err(invalid(format!(
                "file path {:?} names no file, or twice",
                f.path
            )));
        }
        let data = b64
            .decode(&f.data)
            .map_err(|e| invalid(format!("file {:?} is not base64: {e}", f.path)))?;
        out.push(File {
            path: rel,
            data,
            executable: f.executable,
        });
    }
    for s in &spec.steps {
        b64.decode(&s.stdin)
            .map_err(|e| invalid(format!("a step's stdin is not base64: {e}")))?;
    }
    Ok(out)
}

/// The call's tmpfs and its binds, mounted; unmounted when dropped.
struct Places {
    mounted: Vec<&'static str>,
}

impl Places {
    fn mount(tmp_size: u64, uid: u32) -> io::Result<Places> {
        use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
        let scratch = Path::new(SCRATCH);
        mount::mount_fs(
            "tmpfs",
            scratch,
            flags::NOSUID | flags::NODEV,
            Some(&format!("size={tmp_size},mode=0700")),
        )?;
        let mut p = Places {
            mounted: vec![SCRATCH],
        };
        for (dir, at, mode, grader) in PLACES {
            let d = scratch.join(dir);
            std::fs::DirBuilder::new().mode(mode).create(&d)?;
            // The umask cut the sticky and group bits: set exactly.
            std::fs::set_permissions(&d, std::fs::Permissions::from_mode(mode))?;
            if grader {
                std::os::unix::fs::chown(&d, Some(uid), Some(uid))?;
            }
            mount::bind(&d, Path::new(at), false, flags::NOSUID | flags::NODEV)?;
            p.mounted.push(at);
        }
        Ok(p)
    }
}

impl Drop for Places {
    fn drop(&mut self) {
        for at in self.mounted.iter().rev() {
            if let Err(e) = mount::unmount_detach(Path::new(at)) {
                // A place left mounted would carry this call's files into the next: the
                // server stops (its worker with it) rather than serve on.
                eprintln!("warren-guest call server: {e}; stopping");
                std::process::exit(1);
            }
        }
    }
}

impl Server<'_> {
    fn call(&self, mut spec: CallSpec) -> Answer {
        let files = match check(&spec) {
            Ok(f) => f,
            Err(a) => return a,
        };
        let places = match Places::mount(spec.tmp_size.max(1 << 20), self.uid) {
            Ok(p) => p,
            Err(e) => {
                return Answer::Refused {
                    invalid: false,
                    message: format!("making the call's directories: {e}"),
                };
            }
        };
        if let Err(e) = write_files(&files, self.uid) {
            drop(places);
            return Answer::Refused {
                invalid: e.kind() == io::ErrorKind::InvalidInput,
                message: format!("writing the call's files: {e}"),
            };
        }
        // Written: gone from memory before the steps fork (a fork starts with this process's
        // resident memory, which the program's reported peak would include).
        drop(files);
        spec.files = Vec::new();
        let spec = &spec;
        let mut out = CallResult::default();
        let mut go_on = true;
        for step in &spec.steps {
            if !go_on {
                out.steps.push(StepResult::default());
                continue;
            }
            match self.step(step, spec) {
                Ok(r) => {
                    go_on = !step.required || r.exit_code == Some(0);
                    out.steps.push(r);
                }
                Err(e) => {
                    drop(places);
                    return Answer::Refused {
                        invalid: false,
                        message: format!("starting a step: {e}"),
                    };
                }
            }
        }
        if !spec.fetch.is_empty() {
            out.files = fetch(&spec.fetch, spec.max_fetch);
        }
        drop(places);
        // Its zygote failed (this call or before): the worker would serve Python at a third of
        // the speed for the rest of its life; the node replaces it instead.
        out.retire = self.had_zygote && self.zygote.borrow().is_none();
        Answer::Done(out)
    }

    /// Runs one step: a Python program on the zygote where there is one and nothing asks the
    /// interpreter's start for what the zygote cannot do (a `PYTHON*` variable beyond
    /// [`ZYGOTE_ENV`]), anything else under an init of its own.
    fn step(&self, step: &CallStep, spec: &CallSpec) -> io::Result<StepResult> {
        let python = step.argv.len() >= 2
            && step.argv[0] == "python3"
            && !step.argv[1].starts_with('-')
            && spec
                .env
                .iter()
                .all(|(k, _)| !k.starts_with("PYTHON") || ZYGOTE_ENV.contains(&k.as_str()));
        if python && self.zygote.borrow().is_some() {
            return self.zygote_step(step, spec);
        }
        self.init_step(step, spec)
    }

    /// The environment of every program: a fixed base, then the call's.
    fn env(spec: &CallSpec) -> Vec<(String, String)> {
        let mut env: Vec<(String, String)> = [
            (
                "PATH",
                "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
            ),
            ("HOME", "/home/grader"),
            ("USER", "grader"),
            ("LANG", "C.UTF-8"),
            ("TMPDIR", "/tmp"),
        ]
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        for (k, v) in &spec.env {
            env.retain(|(e, _)| e != k);
            env.push((k.clone(), v.clone()));
        }
        env
    }

    /// Kills every process of the grader's uid: what a zygote's step left running.
    fn kill_grader_processes(&self) {
        let Some(k) = &self.killer else { return };
        if let Err(e) = k.kill_all(Duration::from_secs(2)) {
            // Processes of this call could outlive it: the server stops (its worker with it).
            eprintln!("warren-guest call server: killing a step's processes: {e}; stopping");
            warren_sys::unix::exit_now(1);
        }
    }

    /// Runs a Python step on the zygote: its child, confined as any program, runs the file; then
    /// every process of the grader's uid is killed and the zygote's IPC namespace emptied.
    fn zygote_step(&self, step: &CallStep, spec: &CallSpec) -> io::Result<StepResult> {
        let StepPipes {
            out: (out_r, out_w),
            err: (err_r, err_w),
            status: (status_r, status_w),
            stdin,
            input,
        } = StepPipes::new(step)?;
        let (stdin_r, stdin_w) = match input {
            None => (OwnedFd::from(std::fs::File::open("/dev/null")?), None),
            Some((r, w)) => (r, Some(w)),
        };
        let mut rlimits: Vec<(u32, u64, u64)> = self.confinement.rlimits.clone();
        let cpu = step.timeout_ms.div_ceil(1000) + 1;
        rlimits.push((0, cpu, cpu)); // RLIMIT_CPU
        rlimits.push((1, spec.file_size, spec.file_size)); // RLIMIT_FSIZE
        let env: serde_json::Map<String, serde_json::Value> = Self::env(spec)
            .into_iter()
            .map(|(k, v)| (k, serde_json::Value::String(v)))
            .collect();
        let req = serde_json::json!({
            "argv": step.argv,
            "env": env,
            "rlimits": rlimits,
        });
        // The request goes in a memfd that only the zygote's child reads: the zygote never
        // holds a call's data, so none is left in the memory its next child starts with.
        let request = {
            let fd = rustix::fs::memfd_create(c"warren-step", rustix::fs::MemfdFlags::CLOEXEC)?;
            let mut f = std::fs::File::from(fd);
            serde_json::to_writer(&mut f, &req).map_err(io::Error::other)?;
            use std::io::Seek;
            f.rewind()?;
            OwnedFd::from(f)
        };
        // Nothing the previous step may have left in the zygote's IPC namespace (a step of
        // another kind cannot reach it: its mqueue root is root's).
        self.empty_zygote_ipc();
        let started = Instant::now();
        let sent = {
            let z = self.zygote.borrow();
            let Some(z) = z.as_ref() else {
                return self.init_step(step, spec);
            };
            warren_sys::unix::send_with_fds(
                z.sock.as_fd(),
                b"s",
                &[
                    request.as_fd(),
                    stdin_r.as_fd(),
                    out_w.as_fd(),
                    err_w.as_fd(),
                    status_w.as_fd(),
                ],
            )
        };
        drop((request, stdin_r, out_w, err_w, status_w));
        if sent.is_err() {
            if let Some(z) = self.zygote.borrow_mut().take() {
                z.end();
            }
            return self.init_step(step, spec);
        }
        let kill = || self.kill_grader_processes();
        let collected = collect(
            Streams {
                out: out_r,
                err: err_r,
                status: status_r,
                stdin: stdin_w.map(|w| (w, stdin)),
            },
            step.max_output,
            Duration::from_millis(step.timeout_ms),
            kill,
            // The program is done: whatever it started goes now (its pipes close with it).
            kill,
        );
        self.kill_grader_processes();
        let wall = started.elapsed();
        let report: Report = serde_json::from_slice(&collected.report).unwrap_or_default();
        // No report: the zygote itself failed (or was held up): it serves no more steps.
        if report.exit_code.is_none()
            && report.signal.is_none()
            && let Some(z) = self.zygote.borrow_mut().take()
        {
            z.end();
        }
        self.empty_zygote_ipc();
        Ok(outcome(collected, report, wall))
    }

    /// Removes every System V object and message queue a zygote's step left in its IPC
    /// namespace; a zygote whose namespace cannot be emptied serves no more.
    fn empty_zygote_ipc(&self) {
        use warren_sys::ns::{Kind, enter};
        let z = self.zygote.borrow();
        let Some(zy) = z.as_ref() else { return };
        let emptied = (|| -> io::Result<()> {
            enter(zy.ipc.as_fd(), Kind::Ipc)?;
            warren_sys::ns::remove_all_sysv_ipc()?;
            for e in std::fs::read_dir(MQUEUES)? {
                std::fs::remove_file(e?.path())?;
            }
            Ok(())
        })();
        drop(z);
        if let Err(e) = enter(self.own_ipc.as_fd(), Kind::Ipc) {
            eprintln!("warren-guest call server: back to its IPC namespace: {e}; stopping");
            warren_sys::unix::exit_now(1);
        }
        if let Err(e) = emptied {
            eprintln!("warren-guest call server: emptying the zygote's IPC namespace: {e}");
            if let Some(z) = self.zygote.borrow_mut().take() {
                z.end();
            }
        }
    }

    /// Runs one step under an init of its own in new PID and IPC namespaces.
    fn init_step(&self, step: &CallStep, spec: &CallSpec) -> io::Result<StepResult> {
        use warren_sys::ns::{Kind, enter, unshare};
        let StepPipes {
            out: (out_r, out_w),
            err: (err_r, err_w),
            status: (status_r, status_w),
            stdin,
            input,
        } = StepPipes::new(step)?;
        // The next child is the first process of a new PID namespace; the server itself moves
        // to a new IPC namespace, which the child inherits (the server uses none).
        enter(self.own_pid.as_fd(), Kind::Pid)?;
        unshare(Kind::Pid)?;
        unshare(Kind::Ipc)?;
        let started = Instant::now();
        let init = match warren_sys::unix::fork(self.one) {
            Ok(None) => {
                drop((out_r, err_r, status_r));
                let stdin_r = input.map(|(r, _)| r);
                // A copy of the server: whatever happens here ends here (a panic would unwind
                // into the server's call and unmount its places).
                let run = std::panic::AssertUnwindSafe(|| {
                    init(self, step, spec, stdin_r, out_w, err_w, status_w)
                });
                let _ = std::panic::catch_unwind(run);
                warren_sys::unix::exit_now(125)
            }
            Ok(Some(pid)) => Ok(pid),
            Err(e) => Err(e),
        };
        // Back in its own IPC namespace (the step's goes with its processes), and its next
        // children in its own PID namespace, whether the fork worked or not.
        let back = enter(self.own_ipc.as_fd(), Kind::Ipc)
            .and_then(|()| enter(self.own_pid.as_fd(), Kind::Pid));
        let init = init?;
        if let Err(e) = back {
            let _ = warren_sys::process::kill(init, 9);
            let _ = warren_sys::unix::wait_child(init);
            return Err(e);
        }
        drop((out_w, err_w, status_w));
        let stdin_w = input.map(|(r, w)| {
            drop(r);
            w
        });
        let kill = || {
            let _ = warren_sys::process::kill(init, 9);
        };
        let collected = collect(
            Streams {
                out: out_r,
                err: err_r,
                status: status_r,
                stdin: stdin_w.map(|w| (w, stdin)),
            },
            step.max_output,
            Duration::from_millis(step.timeout_ms),
            kill,
            || {},
        );
        kill(); // a no-op for an init that has exited; otherwise its namespace goes now
        let _ = warren_sys::unix::wait_child(init);
        let wall = started.elapsed();
        let report: Report = serde_json::from_slice(&collected.report).unwrap_or_default();
        Ok(outcome(collected, report, wall))
    }
}

/// A step's init: the first process of its PID namespace, a copy of the server (root, not
/// dumpable). Starts the program, waits for it, reports on `status`. Never returns.
fn init(
    s: &Server<'_>,
    step: &CallStep,
    spec: &CallSpec,
    stdin: Option<OwnedFd>,
    out: OwnedFd,
    err: OwnedFd,
    status: OwnedFd,
) -> ! {
    // Ends with the server: an init whose server died (killed, out of memory) kills its step.
    // (Its parent is outside its PID namespace, so getppid cannot tell whether the server
    // died before this: the node kills a worker whose server failed in any case.)
    if rustix::process::set_parent_process_death_signal(Some(rustix::process::Signal::KILL))
        .is_err()
    {
        warren_sys::unix::exit_now(125);
    }
    let mut status = std::fs::File::from(status);
    let mut report = |r: &Report| {
        let _ = status.write_all(&serde_json::to_vec(r).unwrap_or_default());
    };
    let r = match start_program(s, step, spec, stdin, out, err) {
        Err(e) => Report {
            not_started: Some(e),
            ..Report::default()
        },
        Ok(pid) => {
            let (exit_code, signal) = warren_sys::unix::wait_child(pid).unwrap_or((None, None));
            let (cpu_us, max_rss) = warren_sys::process::children_usage();
            Report {
                exit_code,
                signal,
                not_started: None,
                cpu_us,
                max_rss,
            }
        }
    };
    report(&r);
    warren_sys::unix::exit_now(0)
}

/// Forks the program of `step` from the init; its pid, or why it did not start.
fn start_program(
    s: &Server<'_>,
    step: &CallStep,
    spec: &CallSpec,
    stdin: Option<OwnedFd>,
    out: OwnedFd,
    err: OwnedFd,
) -> Result<i32, String> {
    // Named in messages, cut short (the report that carries them is bounded).
    let mut program = step.argv[0].clone();
    if program.len() > 256 {
        let mut cut = 256;
        while !program.is_char_boundary(cut) {
            cut -= 1;
        }
        program.truncate(cut);
        program.push_str("...");
    }
    // Told the exec's error, if it fails; closed by a successful exec.
    let (fail_r, fail_w) = rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC)
        .map_err(|e| format!("a pipe: {e}"))?;
    match warren_sys::unix::fork(s.one) {
        Err(e) => Err(format!("fork: {e}")),
        Ok(None) => {
            drop(fail_r);
            let run = std::panic::AssertUnwindSafe(|| program_exec(s, step, spec, stdin, out, err));
            let code = match std::panic::catch_unwind(run) {
                Ok(e) => e.raw_os_error().unwrap_or(0),
                Err(_) => 0,
            };
            let mut w = std::fs::File::from(fail_w);
            let _ = w.write_all(&code.to_le_bytes());
            warren_sys::unix::exit_now(127)
        }
        Ok(Some(pid)) => {
            drop((fail_w, stdin, out, err));
            let mut buf = Vec::new();
            let _ = std::fs::File::from(fail_r).take(4).read_to_end(&mut buf);
            if buf.len() == 4 {
                let _ = warren_sys::unix::wait_child(pid);
                let errno = i32::from_le_bytes([buf[0], buf[1], buf[2], buf[3]]);
                let e = io::Error::from_raw_os_error(errno);
                return Err(match e.kind() {
                    io::ErrorKind::NotFound => format!("{program}: command not found"),
                    io::ErrorKind::PermissionDenied => format!("{program}: permission denied"),
                    _ => format!("{program}: {e}"),
                });
            }
            Ok(pid)
        }
    }
}

/// In the program's child: becomes the grader, confined and limited, and execs the program.
/// Returns only on failure.
fn program_exec(
    s: &Server<'_>,
    step: &CallStep,
    spec: &CallSpec,
    stdin: Option<OwnedFd>,
    out: OwnedFd,
    err: OwnedFd,
) -> io::Error {
    let mut cmd = Command::new(&step.argv[0]);
    cmd.args(&step.argv[1..])
        .env_clear()
        .envs(Server::env(spec))
        .current_dir(CALL_DIR)
        .uid(s.uid)
        .gid(s.uid)
        .stdin(stdin.map_or(Stdio::null(), Stdio::from))
        .stdout(Stdio::from(out))
        .stderr(Stdio::from(err));
    warren_sys::process::on_exec_limits(
        &mut cmd,
        warren_sys::process::StepLimits {
            cpu_seconds: step.timeout_ms.div_ceil(1000) + 1,
            file_size: spec.file_size,
        },
    );
    s.confinement.apply_on_exec(&mut cmd);
    cmd.exec()
}

/// A step's pipes (read end, write end), made before its process starts, and its input.
struct StepPipes {
    out: (OwnedFd, OwnedFd),
    err: (OwnedFd, OwnedFd),
    status: (OwnedFd, OwnedFd),
    /// Its stdin, decoded, and a pipe for it (none when it is empty).
    stdin: Vec<u8>,
    input: Option<(OwnedFd, OwnedFd)>,
}

impl StepPipes {
    fn new(step: &CallStep) -> io::Result<StepPipes> {
        let stdin = base64::engine::general_purpose::STANDARD
            .decode(&step.stdin)
            .map_err(|e| io::Error::other(format!("stdin is not base64: {e}")))?;
        let pipe = || rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC);
        Ok(StepPipes {
            out: pipe()?,
            err: pipe()?,
            status: pipe()?,
            input: if stdin.is_empty() {
                None
            } else {
                Some(pipe()?)
            },
            stdin,
        })
    }
}

/// What a step did, from what it left on its pipes and its report.
fn outcome(collected: Collected, report: Report, wall: Duration) -> StepResult {
    let b64 = base64::engine::general_purpose::STANDARD;
    // A step that ended without a report was killed: by its limits here, or by the kernel (the
    // memory limit).
    let killed =
        report.exit_code.is_none() && report.signal.is_none() && report.not_started.is_none();
    StepResult {
        ran: true,
        exit_code: report.exit_code,
        signal: report.signal.or(if killed { Some(9) } else { None }),
        timed_out: collected.timed_out,
        output_limit: collected.over && !collected.timed_out,
        not_started: report.not_started,
        stdout: b64.encode(&collected.stdout),
        stderr: b64.encode(&collected.stderr),
        wall_us: wall.as_micros() as u64,
        cpu_us: report.cpu_us,
        max_rss: report.max_rss,
    }
}

/// A step's pipes, as the server holds them.
struct Streams {
    out: OwnedFd,
    err: OwnedFd,
    status: OwnedFd,
    stdin: Option<(OwnedFd, Vec<u8>)>,
}

/// What a step left on its pipes.
struct Collected {
    stdout: Vec<u8>,
    stderr: Vec<u8>,
    report: Vec<u8>,
    timed_out: bool,
    over: bool,
}

/// Reads the step's output (at most `max` bytes of each stream kept; past it `kill`, once)
/// and its init's report, and writes its stdin, until every pipe is closed; at `timeout`
/// kills, then waits at most [`KILL_GRACE`] more.
fn collect(
    s: Streams,
    max: u64,
    timeout: Duration,
    kill: impl Fn(),
    on_report: impl Fn(),
) -> Collected {
    use rustix::event::{PollFd, PollFlags};
    let nonblock = |fd: &OwnedFd| {
        let _ = rustix::io::ioctl_fionbio(fd, true);
    };
    nonblock(&s.out);
    nonblock(&s.err);
    nonblock(&s.status);
    let (mut stdin, input) = match s.stdin {
        Some((w, data)) => {
            nonblock(&w);
            (Some(w), data)
        }
        None => (None, Vec::new()),
    };
    let mut written = 0usize;
    // Readers: fd, bytes kept, cap.
    let mut readers: [(Option<OwnedFd>, Vec<u8>, usize); 3] = [
        (Some(s.out), Vec::new(), max as usize),
        (Some(s.err), Vec::new(), max as usize),
        (Some(s.status), Vec::new(), MAX_REPORT),
    ];
    let mut c = Collected {
        stdout: Vec::new(),
        stderr: Vec::new(),
        report: Vec::new(),
        timed_out: false,
        over: false,
    };
    let started = Instant::now();
    let mut deadline = started + timeout;
    let mut buf = vec![0u8; 64 << 10];
    while readers.iter().any(|r| r.0.is_some()) {
        let now = Instant::now();
        if now >= deadline {
            if c.timed_out {
                break; // the grace passed: something holds a pipe open still
            }
            c.timed_out = true;
            deadline = now + KILL_GRACE;
        }
        if c.timed_out {
            // Again at each turn of the grace: a kill may have come before the step's
            // processes were the grader's (a zygote's child switches uid as it starts).
            kill();
        }
        let mut fds: Vec<PollFd<'_>> = Vec::with_capacity(4);
        let mut which: Vec<usize> = Vec::with_capacity(4);
        for (i, r) in readers.iter().enumerate() {
            if let Some(fd) = &r.0 {
                fds.push(PollFd::new(fd, PollFlags::IN));
                which.push(i);
            }
        }
        if let Some(w) = &stdin {
            fds.push(PollFd::new(w, PollFlags::OUT));
            which.push(3);
        }
        let mut left = deadline.saturating_duration_since(now);
        if c.timed_out {
            left = left.min(Duration::from_millis(50));
        }
        let ts = rustix::time::Timespec {
            tv_sec: left.as_secs() as i64,
            tv_nsec: left.subsec_nanos() as _,
        };
        match rustix::event::poll(&mut fds, Some(&ts)) {
            Ok(_) => {}
            Err(rustix::io::Errno::INTR) => continue,
            Err(_) => break,
        }
        let ready: Vec<(usize, PollFlags)> = fds
            .iter()
            .zip(&which)
            .map(|(f, &i)| (i, f.revents()))
            .filter(|(_, ev)| !ev.is_empty())
            .collect();
        drop(fds);
        for (i, ev) in ready {
            if i == 3 {
                let Some(w) = &stdin else { continue };
                if ev.intersects(PollFlags::ERR | PollFlags::HUP) {
                    stdin = None;
                    continue;
                }
                match rustix::io::write(w, &input[written..]) {
                    Ok(n) => {
                        written += n;
                        if written >= input.len() {
                            stdin = None; // closed: the program sees the end of its input
                        }
                    }
                    Err(rustix::io::Errno::AGAIN | rustix::io::Errno::INTR) => {}
                    Err(_) => stdin = None, // EPIPE: it stopped reading
                }
                continue;
            }
            let r = &mut readers[i];
            let Some(fd) = &r.0 else { continue };
            // Drain what is there; a read of 0 is the end.
            loop {
                match rustix::io::read(fd, &mut buf) {
                    Ok(0) => {
                        r.0 = None;
                        if i == 2 {
                            on_report();
                        }
                        break;
                    }
                    Ok(n) => {
                        let room = r.2.saturating_sub(r.1.len());
                        r.1.extend_from_slice(&buf[..n.min(room)]);
                        if n > room && i < 2 && !c.over {
                            c.over = true;
                            kill();
                        }
                    }
                    Err(rustix::io::Errno::INTR) => {}
                    Err(rustix::io::Errno::AGAIN) => break,
                    Err(_) => {
                        r.0 = None;
                        break;
                    }
                }
            }
        }
    }
    let [o, e, st] = readers;
    c.stdout = o.1;
    c.stderr = e.1;
    c.report = st.1;
    c
}

/// Writes the call's files into its working directory in the fresh tmpfs (nothing but this
/// code has written there, so no link can be in the way; each file is made new, not followed).
fn write_files(files: &[File], uid: u32) -> io::Result<()> {
    use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
    let w = Path::new(SCRATCH).join("work");
    for f in files {
        let mut dir = w.clone();
        if let Some(parent) = f.path.parent() {
            for c in parent.components() {
                dir.push(c);
                match std::fs::DirBuilder::new().mode(0o755).create(&dir) {
                    Ok(()) => std::os::unix::fs::chown(&dir, Some(uid), Some(uid))?,
                    Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
                    Err(e) => return Err(e),
                }
            }
        }
        let mut out = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(if f.executable { 0o755 } else { 0o644 })
            .custom_flags(rustix::fs::OFlags::NOFOLLOW.bits() as i32)
            .open(w.join(&f.path))
            .map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", f.path.display())))?;
        out.write_all(&f.data)?;
        std::os::unix::fs::fchown(&out, Some(uid), Some(uid))?;
    }
    Ok(())
}

/// Reads back `paths` of the call's working directory: regular files only, no link on the
/// way, `max` bytes in all.
fn fetch(paths: &[String], max: u64) -> Vec<warren_types::guest::FetchedFile> {
    let b64 = base64::engine::general_purpose::STANDARD;
    let dir: io::Result<OwnedFd> =
        std::fs::File::open(Path::new(SCRATCH).join("work")).map(Into::into);
    let mut left = max;
    paths
        .iter()
        .map(|p| {
            let read = dir
                .as_ref()
                .map_err(|e| io::Error::new(e.kind(), e.to_string()))
                .and_then(|d| {
                    warren_fs::open_file(d.as_fd(), Path::new(p), warren_fs::Links::Refuse)
                })
                .and_then(|f| {
                    let mut buf = Vec::new();
                    f.take(left.saturating_add(1)).read_to_end(&mut buf)?;
                    if buf.len() as u64 > left {
                        return Err(io::Error::other(format!(
                            "larger than what is left of the {max} bytes fetched files may hold \
                         together"
                        )));
                    }
                    Ok(buf)
                });
            match read {
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
            }
        })
        .collect()
}
