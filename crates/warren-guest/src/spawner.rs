//! The spawner: a small process, forked from the guest before it starts any thread, that
//! starts every agent command.
//!
//! It is confined once, for good: the system-call policy, the resource limits and the Landlock
//! ruleset are applied to it at start, so every command it starts inherits them with nothing
//! to install per command (installing the policy in each command's child cost ~1.6 ms here,
//! more than the rest of an exec). It runs as a uid of its own (61001) with only `CAP_SETUID`
//! and `CAP_SETGID`, so no agent process, root included, can signal, trace or limit it, nor
//! read or write its `/proc` entries (they are its uid's; no agent command may run as that
//! uid). Each command is started with `CLONE_PARENT`: its parent is the guest, which
//! reaps it and collects its status as for any child.
//!
//! Protocol (one `SOCK_SEQPACKET` message each way): the guest sends a JSON [`Request`] with
//! the command's stdin (or none: /dev/null), stdout and stderr as descriptors; the spawner
//! answers with a JSON [`Answer`].

use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use serde::{Deserialize, Serialize};
use warren_sys::confine::Confinement;

/// The spawner's own uid and gid.
pub use warren_types::guest::SPAWNER_UID;

/// Largest request: the node bounds the command line to 1 MiB and the environment to 64 KiB,
/// and JSON may escape a byte in six; a larger one is answered as `execve` would (E2BIG).
const MAX_REQUEST: usize = 8 << 20;

/// A command to start.
#[derive(Debug, Serialize, Deserialize)]
pub struct Request {
    pub argv: Vec<String>,
    pub env: Vec<(String, String)>,
    pub cwd: String,
    pub uid: u32,
    pub gid: u32,
    /// Whether the first descriptor sent is stdin (else /dev/null).
    pub stdin: bool,
}

/// What happened.
#[derive(Debug, Serialize, Deserialize)]
pub enum Answer {
    /// It runs.
    Started { pid: i32 },
    /// It could not start: `exec` when the program itself could not be run.
    Failed {
        exec: bool,
        errno: i32,
        message: String,
    },
}

/// The guest's handle on its spawner.
pub struct Spawner {
    sock: Mutex<OwnedFd>,
    pid: i32,
    /// Cleared when it is gone (killed: the guest then starts commands itself, confining each).
    alive: AtomicBool,
}

impl Spawner {
    /// Forks the spawner. Call while the guest has one thread and all its capabilities.
    pub fn start(confinement: Arc<Confinement>) -> io::Result<Spawner> {
        let (mine, theirs) = rustix::net::socketpair(
            rustix::net::AddressFamily::UNIX,
            rustix::net::SocketType::SEQPACKET,
            rustix::net::SocketFlags::CLOEXEC,
            None,
        )?;
        // Room for the largest request in one message (forced past `wmem_max`: the guest is
        // still privileged here).
        rustix::net::sockopt::set_socket_send_buffer_size_force(&mine, 2 * MAX_REQUEST)?;
        rustix::net::sockopt::set_socket_recv_buffer_size_force(&theirs, 2 * MAX_REQUEST)?;
        match warren_sys::unix::fork_single_threaded()? {
            None => {
                drop(mine);
                let code = match serve(theirs, &confinement) {
                    Ok(()) => 0,
                    Err(e) => {
                        eprintln!("warren-guest spawner: {e}");
                        1
                    }
                };
                std::process::exit(code)
            }
            Some(pid) => {
                drop(theirs);
                Ok(Spawner {
                    sock: Mutex::new(mine),
                    pid,
                    alive: AtomicBool::new(true),
                })
            }
        }
    }

    /// Its pid (in the sandbox's PID namespace).
    pub fn pid(&self) -> i32 {
        self.pid
    }

    /// Whether it still answers.
    pub fn alive(&self) -> bool {
        self.alive.load(Ordering::Relaxed)
    }

    /// Marks it gone (its exit was reaped, or it stopped answering).
    pub fn gone(&self) {
        self.alive.store(false, Ordering::Relaxed);
    }

    /// Starts a command; returns its pid (a child of the guest). An error means the spawner is
    /// gone (it is then marked so).
    pub fn spawn(
        &self,
        req: &Request,
        stdin: Option<BorrowedFd<'_>>,
        stdout: BorrowedFd<'_>,
        stderr: BorrowedFd<'_>,
    ) -> io::Result<Answer> {
        let body = serde_json::to_vec(req).map_err(io::Error::other)?;
        if body.len() > MAX_REQUEST {
            return Ok(Answer::Failed {
                exec: true,
                errno: 7, // E2BIG, as execve would answer
                message: "the command and its environment are too large".into(),
            });
        }
        let mut fds: Vec<BorrowedFd<'_>> = Vec::with_capacity(3);
        fds.extend(stdin);
        fds.push(stdout);
        fds.push(stderr);
        let sock = self.sock.lock().unwrap_or_else(|p| p.into_inner());
        let answer = (|| {
            warren_sys::unix::send_with_fds(sock.as_fd(), &body, &fds)?;
            let mut buf = vec![0u8; 64 << 10];
            let (n, _) = warren_sys::unix::recv_with_fds(sock.as_fd(), &mut buf)?;
            if n == 0 {
                return Err(io::Error::other("the spawner is gone"));
            }
            serde_json::from_slice(&buf[..n]).map_err(io::Error::other)
        })();
        // Gone, not merely refusing one request: no other error is expected of a socket pair
        // whose buffers fit every request.
        if answer.is_err() {
            self.gone();
        }
        answer
    }
}

/// The spawner's life: lock itself down, confine itself, then start commands until the guest
/// hangs up.
fn serve(sock: OwnedFd, c: &Confinement) -> io::Result<()> {
    // Nothing of the guest's but what this needs (not its control socket, not its end of the
    // listener channel).
    {
        use std::os::fd::AsRawFd;
        let mut keep = vec![0, 1, 2, sock.as_raw_fd()];
        keep.extend(c.notify.as_ref().map(|(_, s)| s.as_raw_fd()));
        keep.extend(c.landlock.as_ref().map(|f| f.as_raw_fd()));
        warren_sys::unix::close_all_except(&keep)?;
    }
    rustix::thread::set_name(c"warren-spawner")?;
    warren_sys::creds::lock_out_exec_capabilities()?;
    warren_sys::creds::become_spawner(SPAWNER_UID, SPAWNER_UID)?;
    // Dumpable, so that its /proc entries are its uid's, not root's (an agent's root would own
    // them otherwise); no agent process has its uid (the guest refuses it), and none has
    // CAP_SYS_PTRACE. No core is ever written (RLIMIT_CORE is 0).
    warren_sys::creds::set_dumpable()?;
    warren_sys::creds::set_no_new_privs()?;
    c.apply_to_self()?;
    let null: OwnedFd = std::fs::File::open("/dev/null")?.into();
    let mut buf = vec![0u8; MAX_REQUEST];
    loop {
        let (n, fds) = warren_sys::unix::recv_with_fds(sock.as_fd(), &mut buf)?;
        if n == 0 {
            return Ok(());
        }
        let answer = match serde_json::from_slice::<Request>(&buf[..n]) {
            Ok(req) => {
                let a = start(&req, &fds, null.as_fd());
                // The child shared this address space until its exec, and its change of uid
                // made the shared mm not dumpable: dumpable again (see above).
                warren_sys::creds::set_dumpable()?;
                a
            }
            Err(e) => Answer::Failed {
                exec: false,
                errno: 22,
                message: format!("bad request: {e}"),
            },
        };
        drop(fds);
        let body = serde_json::to_vec(&answer).map_err(io::Error::other)?;
        warren_sys::unix::send_with_fds(sock.as_fd(), &body, &[])?;
    }
}

/// The programs `argv[0]` may name: itself when it has a slash, else each `PATH` entry.
fn candidates(program: &str, env: &[(String, String)]) -> Vec<PathBuf> {
    if program.contains('/') {
        return vec![PathBuf::from(program)];
    }
    let path = env
        .iter()
        .rev()
        .find(|(k, _)| k == "PATH")
        .map(|(_, v)| v.as_str())
        .unwrap_or("/usr/local/bin:/usr/bin:/bin");
    path.split(':')
        .map(|d| if d.is_empty() { "." } else { d })
        .map(|d| Path::new(d).join(program))
        .collect()
}

fn start(req: &Request, fds: &[OwnedFd], null: BorrowedFd<'_>) -> Answer {
    let fail = |exec: bool, errno: i32, message: String| Answer::Failed {
        exec,
        errno,
        message,
    };
    let want = if req.stdin { 3 } else { 2 };
    if fds.len() != want || req.argv.is_empty() {
        return fail(false, 22, "a request needs argv and its descriptors".into());
    }
    let (stdin, out, err) = if req.stdin {
        (fds[0].as_fd(), fds[1].as_fd(), fds[2].as_fd())
    } else {
        (null, fds[0].as_fd(), fds[1].as_fd())
    };
    let progs = candidates(&req.argv[0], &req.env);
    let args: Vec<&str> = req.argv.iter().map(String::as_str).collect();
    let env: Vec<(&str, &str)> = req
        .env
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    let search: Vec<&Path> = progs[1..].iter().map(PathBuf::as_path).collect();
    let moves = [(stdin, 0), (out, 1), (err, 2)];
    let spec = warren_sys::spawn::SpawnSpec {
        fds: &moves,
        search: &search,
        sibling: true,
        credentials: Some((req.uid, req.gid)),
        cwd: Some(Path::new(&req.cwd)),
        ..warren_sys::spawn::SpawnSpec::new(&progs[0], &args, &env)
    };
    match warren_sys::spawn::spawn(&spec) {
        // The child is the guest's: this pidfd only closes.
        Ok(s) => Answer::Started { pid: s.pid },
        Err(e) => {
            let detail = e
                .get_ref()
                .and_then(|i| i.downcast_ref::<warren_sys::spawn::SpawnError>());
            let (exec, errno) = detail.map_or((false, e.raw_os_error().unwrap_or(5)), |d| {
                (d.stage == warren_sys::spawn::STAGE_EXEC, d.errno)
            });
            fail(exec, errno, e.to_string())
        }
    }
}
