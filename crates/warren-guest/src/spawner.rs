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
//! The child is cloned fork-style (its own copy of the spawner's small address space) and the
//! spawner waits at most [`EXEC_WAIT`] for its exec: once the child has switched to the
//! agent's uid, the agent may `SIGSTOP` it, and neither the spawner nor the guest waiting on
//! the spawner may then be held up (nor may the child's change of uid touch the spawner's own
//! memory and `/proc` entries).
//!
//! Protocol (one `SOCK_SEQPACKET` message each way): the guest sends a one-byte message
//! carrying a memfd with the JSON [`Request`] (a command line may be megabytes; a datagram
//! that large needs a contiguous kernel allocation that can fail), then the command's stdin
//! (or none: /dev/null), stdout and stderr; the spawner answers with a JSON [`Answer`] of at
//! most a few KiB. The guest waits at most [`ANSWER_WAIT`]; a spawner that does not answer
//! in time, or answers something else, is killed and commands start from the guest.

use std::io::{self, Read, Seek, Write};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use warren_sys::confine::Confinement;

/// The spawner's own uid and gid.
pub use warren_types::guest::SPAWNER_UID;

/// Largest request: the node bounds the command line to 1 MiB and the environment to 64 KiB,
/// and JSON may escape a byte in six; a larger one is answered as `execve` would (E2BIG).
const MAX_REQUEST: usize = 8 << 20;

/// How long the spawner waits for a child's exec before it answers `Started` anyway.
pub const EXEC_WAIT: Duration = Duration::from_secs(1);

/// How long the guest waits for an answer (the spawner's own work is a fork: anything near
/// this is a spawner that stopped answering).
pub const ANSWER_WAIT: Duration = Duration::from_secs(5);

/// Longest error message in an answer.
const MAX_MESSAGE: usize = 1024;

/// Largest answer the guest reads.
const MAX_ANSWER: usize = 16 << 10;

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
    /// Whether stdin is a terminal to make the command's controlling terminal (in the
    /// session it starts).
    #[serde(default)]
    pub tty: bool,
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

/// Why a command could not be given to the spawner or its answer was lost. Either way the
/// spawner is killed (and commands start from the guest from then on).
#[derive(Debug)]
pub enum Lost {
    /// The request never reached it: the command did not start, and may be started otherwise.
    NotSent(io::Error),
    /// It had the request but gave no answer: the command may have started.
    NoAnswer(io::Error),
}

impl std::fmt::Display for Lost {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Lost::NotSent(e) => write!(f, "the request could not be sent: {e}"),
            Lost::NoAnswer(e) => write!(f, "no answer: {e}"),
        }
    }
}

/// The guest's handle on its spawner.
pub struct Spawner {
    sock: Mutex<OwnedFd>,
    pid: i32,
    /// Cleared when it is gone (killed: the guest then starts commands itself, confining each).
    alive: AtomicBool,
    /// A builder sandbox's: without it commands cannot get the build capabilities, so none
    /// starts once it is gone.
    pub builder: bool,
}

impl Spawner {
    /// Forks the spawner. Call while the guest has one thread and all its capabilities.
    /// In a `builder` sandbox it starts the commands it runs as root with
    /// [`warren_sys::creds::build_capabilities`] in their ambient set; in any other, no
    /// command it starts holds a capability.
    pub fn start(confinement: Arc<Confinement>, builder: bool) -> io::Result<Spawner> {
        let (mine, theirs) = rustix::net::socketpair(
            rustix::net::AddressFamily::UNIX,
            rustix::net::SocketType::SEQPACKET,
            rustix::net::SocketFlags::CLOEXEC,
            None,
        )?;
        rustix::net::sockopt::set_socket_timeout(
            &mine,
            rustix::net::sockopt::Timeout::Recv,
            Some(ANSWER_WAIT),
        )?;
        rustix::net::sockopt::set_socket_timeout(
            &mine,
            rustix::net::sockopt::Timeout::Send,
            Some(ANSWER_WAIT),
        )?;
        match warren_sys::unix::fork_single_threaded()? {
            None => {
                drop(mine);
                let code = match serve(theirs, &confinement, builder) {
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
                    builder,
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

    /// Starts a command; returns its pid (a child of the guest). Blocks for the spawner's
    /// answer: a receive waits at most [`ANSWER_WAIT`], and one a signal interrupts is tried
    /// again only within that time (so at most twice it in all). On [`Lost`] the spawner has
    /// been killed (its exit is reaped, and recorded, as any) and marked gone.
    pub fn spawn(
        &self,
        req: &Request,
        stdin: Option<BorrowedFd<'_>>,
        stdout: BorrowedFd<'_>,
        stderr: BorrowedFd<'_>,
    ) -> Result<Answer, Lost> {
        let failed = |e: io::Error, what: &str| Answer::Failed {
            exec: false,
            errno: e.raw_os_error().unwrap_or(5),
            message: format!("{what}: {e}"),
        };
        let body = match serde_json::to_vec(req) {
            Ok(b) => b,
            Err(e) => return Ok(failed(io::Error::other(e), "encoding the command")),
        };
        if body.len() > MAX_REQUEST {
            return Ok(Answer::Failed {
                exec: true,
                errno: 7, // E2BIG, as execve would answer
                message: "the command and its environment are too large".into(),
            });
        }
        let memfd = match request_file(&body) {
            Ok(f) => f,
            Err(e) => return Ok(failed(e, "preparing the command")),
        };
        let mut fds: Vec<BorrowedFd<'_>> = Vec::with_capacity(4);
        fds.push(memfd.as_fd());
        fds.extend(stdin);
        fds.push(stdout);
        fds.push(stderr);
        let sock = self.sock.lock().unwrap_or_else(|p| p.into_inner());
        // A signal to the guest (SIGCHLD above all) interrupts a socket call with a timeout
        // (such calls are never restarted): again, until the deadline.
        let deadline = std::time::Instant::now() + ANSWER_WAIT;
        let again = |e: &io::Error| {
            e.kind() == io::ErrorKind::Interrupted && std::time::Instant::now() < deadline
        };
        let sent = loop {
            match warren_sys::unix::send_with_fds(sock.as_fd(), b"r", &fds) {
                Err(e) if again(&e) => continue,
                r => break r,
            }
        };
        let answer = match sent {
            Err(e) => Err(Lost::NotSent(e)),
            Ok(()) => {
                let mut buf = vec![0u8; MAX_ANSWER];
                let received = loop {
                    match warren_sys::unix::recv_with_fds(sock.as_fd(), &mut buf) {
                        Err(e) if again(&e) => continue,
                        r => break r,
                    }
                };
                match received {
                    Ok((0, _)) => Err(Lost::NoAnswer(io::Error::other("the spawner is gone"))),
                    Ok((n, _)) => serde_json::from_slice(&buf[..n])
                        .map_err(|e| Lost::NoAnswer(io::Error::other(e))),
                    // EAGAIN: ANSWER_WAIT passed.
                    Err(e) => Err(Lost::NoAnswer(e)),
                }
            }
        };
        drop(sock);
        if answer.is_err() {
            // Whatever holds it up or garbles its answers, it is not to be trusted with the
            // next command: killed (the guest holds CAP_KILL), reaped and recorded by the
            // reaper, and commands start from the guest.
            let _ = warren_sys::process::kill(self.pid, 9);
            self.gone();
        }
        answer
    }
}

/// A memfd holding `body`, read from its start.
fn request_file(body: &[u8]) -> io::Result<OwnedFd> {
    let fd = rustix::fs::memfd_create(c"warren-spawn", rustix::fs::MemfdFlags::CLOEXEC)?;
    let mut f = std::fs::File::from(fd);
    f.write_all(body)?;
    f.rewind()?;
    Ok(f.into())
}

/// The spawner's life: lock itself down, confine itself, then start commands until the guest
/// hangs up.
fn serve(sock: OwnedFd, c: &Confinement, builder: bool) -> io::Result<()> {
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
    // A builder's spawner keeps the build set inheritable (set while the bounding set still
    // has it) and permitted, to raise into the ambient set of its root commands; the bounding
    // set is emptied either way, so no file capability and no set-user-id program adds any.
    let extra = if builder {
        warren_sys::creds::build_capabilities()
    } else {
        rustix::thread::CapabilitySet::empty()
    };
    if builder {
        warren_sys::creds::set_inheritable(extra)?;
    }
    warren_sys::creds::lock_out_exec_capabilities_but_ambient(builder)?;
    warren_sys::creds::become_spawner(SPAWNER_UID, SPAWNER_UID, extra)?;
    // Dumpable, so that its /proc entries are its uid's, not root's (an agent's root would own
    // them otherwise); no agent process has its uid (the guest refuses it), and none has
    // CAP_SYS_PTRACE. No core is ever written (RLIMIT_CORE is 0). Not in a builder: there root
    // holds CAP_SETUID (it could take the spawner's uid with setfsuid) and CAP_DAC_OVERRIDE
    // (its /proc files are open to it anyway), and a process that is not dumpable is open
    // to CAP_SYS_PTRACE alone (its /proc/<pid>/fd: the host's log file), which no one has.
    if builder {
        warren_sys::creds::set_not_dumpable()?;
    } else {
        warren_sys::creds::set_dumpable()?;
    }
    warren_sys::creds::set_no_new_privs()?;
    c.apply_to_self()?;
    // Confined: the ruleset and the listener channel have done their work. (Closed behind the
    // `Confinement`'s back: this process never drops it, it leaves by `exit`.)
    {
        use std::os::fd::AsRawFd;
        warren_sys::unix::close_all_except(&[0, 1, 2, sock.as_raw_fd()])?;
    }
    let null: OwnedFd = std::fs::File::open("/dev/null")?.into();
    let mut buf = [0u8; 16];
    loop {
        let (n, mut fds) = warren_sys::unix::recv_with_fds(sock.as_fd(), &mut buf)?;
        if n == 0 {
            return Ok(());
        }
        let answer = match read_request(&mut fds) {
            Ok(req) => start(&req, &fds, null.as_fd(), extra.bits()),
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

/// The request in the first descriptor (removed from `fds`), at most [`MAX_REQUEST`] bytes.
fn read_request(fds: &mut Vec<OwnedFd>) -> io::Result<Request> {
    if fds.is_empty() {
        return Err(io::Error::other("no request file"));
    }
    let mut f = std::fs::File::from(fds.remove(0));
    let mut body = Vec::new();
    (&mut f)
        .take(MAX_REQUEST as u64 + 1)
        .read_to_end(&mut body)?;
    if body.len() > MAX_REQUEST {
        return Err(io::Error::other("the request is too large"));
    }
    serde_json::from_slice(&body).map_err(io::Error::other)
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

/// Starts one command; one run as root gets `root_ambient` (capability bits) in its ambient
/// set, so it holds them after its exec.
fn start(req: &Request, fds: &[OwnedFd], null: BorrowedFd<'_>, root_ambient: u64) -> Answer {
    let fail = |exec: bool, errno: i32, message: String| Answer::Failed {
        exec,
        errno,
        message,
    };
    let want = if req.stdin { 3 } else { 2 };
    if fds.len() != want || req.argv.is_empty() {
        return fail(false, 22, "a request needs argv and its descriptors".into());
    }
    // The guest refuses these ids before asking; refused here too, in case it did not.
    if req.uid == SPAWNER_UID || req.gid == SPAWNER_UID {
        return fail(
            false,
            1,
            "the spawner's own uid and gid are reserved".into(),
        );
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
        ambient: if req.uid == 0 { root_ambient } else { 0 },
        cwd: Some(Path::new(&req.cwd)),
        fork_exec_wait: Some(EXEC_WAIT),
        controlling_tty: req.tty && req.stdin,
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
            let mut message = e.to_string();
            if message.len() > MAX_MESSAGE {
                let mut cut = MAX_MESSAGE;
                while !message.is_char_boundary(cut) {
                    cut -= 1;
                }
                message.truncate(cut);
                message.push_str("...");
            }
            fail(exec, errno, message)
        }
    }
}
