//! The process table: commands the guest started, their output, and how they ended.
//!
//! The guest, not the node, owns running commands. Each keeps its output (up to a cap per
//! stream) so that a client or node that reconnects can re-attach by process id and read what
//! it missed; the exit status is kept until someone collects it.
//!
//! A command's status is final when its main process has exited and its output pipes reached
//! end of file, or [`DRAIN_GRACE`] after the exit if something else (a background child) still
//! holds them: the exec returns then, whatever its children do. Those pipes are not closed (a
//! background server would then die of `SIGPIPE` at its next log line): they go on to
//! [`crate::linger`], which drains them until their last writer exits. Output written after
//! the status is final belongs to no result and is discarded.

use std::collections::{BTreeMap, HashMap};
use std::os::fd::AsFd;
use std::os::fd::OwnedFd;
use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::unix::pipe;
use tokio::sync::watch;
use warren_sys::process::Exit;
use warren_sys::pty::Master;
use warren_types::api::{ExitStatus, ProcessInfo};
use warren_types::error::ErrorCode;
use warren_types::guest::{ExecSpec, FrameKind, StdinMode};

use crate::linger::Lingering;
use crate::spawner::Spawner;
use crate::users::User;
use crate::wire::OpError;

/// After the main process exits, how long to keep reading output that its descendants still
/// write to the inherited pipes before the status is final (and the pipes are drained by
/// [`Lingering`]).
const DRAIN_GRACE: Duration = Duration::from_millis(100);
/// The most graces the status waits for output already in a pipe (5 s in all).
const MAX_DRAIN_WAITS: u32 = 50;

/// Finished processes kept for collection; the oldest are forgotten past this.
const KEEP_FINISHED: usize = 256;

const READ_CHUNK: usize = 64 * 1024;

/// One command.
pub struct Proc {
    pub id: u64,
    pub pid: i32,
    pub argv: Vec<String>,
    pub user: String,
    started: Instant,
    state: Mutex<State>,
    changed: watch::Sender<()>,
    /// Set once the status is final: the output pumps then hand their pipes over.
    ended: watch::Sender<bool>,
    /// Its terminal's multiplexer side, while it runs on one (dropped at the end: the
    /// terminal hangs up).
    pty: Mutex<Option<Arc<Master>>>,
    /// Whether it was started on a terminal.
    on_pty: bool,
    /// Where input goes while stdin is kept open ([`StdinMode::Open`] or a terminal). A
    /// writer holds the inner lock for the whole of one input, so inputs never interleave.
    input: Mutex<Option<Arc<tokio::sync::Mutex<Input>>>>,
}

/// A process's kept input.
pub enum Input {
    /// The write end of its stdin pipe.
    Pipe(pipe::Sender),
    /// Its terminal.
    Pty(Arc<Master>),
}

impl Input {
    /// Writes all of `data` (waiting while the pipe or terminal is full).
    pub async fn write_all(&mut self, data: &[u8]) -> std::io::Result<()> {
        match self {
            Input::Pipe(p) => p.write_all(data).await,
            Input::Pty(m) => m.write_all(data).await,
        }
    }
}

#[derive(Default)]
struct State {
    chunks: Vec<(FrameKind, Vec<u8>)>,
    kept: [u64; 2],
    total: [u64; 2],
    truncated: [bool; 2],
    max: u64,
    eof: [bool; 2],
    /// A duplicate of each output pipe's read end while its pump follows it: after the exit,
    /// the status waits while bytes are still in a pipe (its pump not yet run: a busy host,
    /// an idle-priority sandbox), so no output written before the exit is lost. Dropped at
    /// end of file and when the status is final (it must not keep a pipe open).
    readers: [Option<OwnedFd>; 2],
    exited: Option<Exit>,
    ended_at: Option<Instant>,
    timed_out: bool,
    status: Option<ExitStatus>,
}

fn lock(m: &Mutex<State>) -> MutexGuard<'_, State> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

fn stream_index(kind: FrameKind) -> usize {
    if kind == FrameKind::Stderr { 1 } else { 0 }
}

impl Proc {
    fn new(id: u64, pid: i32, spec: &ExecSpec, user: &User) -> Arc<Proc> {
        Self::with_io(id, pid, spec, user, None, None)
    }

    fn with_io(
        id: u64,
        pid: i32,
        spec: &ExecSpec,
        user: &User,
        pty: Option<Arc<Master>>,
        input: Option<Input>,
    ) -> Arc<Proc> {
        let (changed, _) = watch::channel(());
        let (ended, _) = watch::channel(false);
        Arc::new(Proc {
            id,
            pid,
            argv: spec.argv.clone(),
            user: user.name.clone(),
            started: Instant::now(),
            state: Mutex::new(State {
                max: spec.max_output,
                ..State::default()
            }),
            changed,
            ended,
            on_pty: spec.pty.is_some(),
            pty: Mutex::new(pty),
            input: Mutex::new(input.map(|i| Arc::new(tokio::sync::Mutex::new(i)))),
        })
    }

    /// Its kept input, or why there is none.
    pub fn input(&self) -> Result<Arc<tokio::sync::Mutex<Input>>, OpError> {
        let input = self.input.lock().unwrap_or_else(|p| p.into_inner()).clone();
        input.ok_or_else(|| {
            let why = if self.status().is_some() {
                "it has ended"
            } else if self.on_pty {
                "its terminal is closed"
            } else {
                "its stdin is closed, or it was started without stdin_open"
            };
            OpError::new(
                ErrorCode::InvalidArgument,
                format!("process {} takes no input: {why}", self.id),
            )
        })
    }

    /// Whether `input` is still its kept input (not closed, nor ended, meanwhile).
    pub fn is_current_input(&self, input: &Arc<tokio::sync::Mutex<Input>>) -> bool {
        self.input
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .as_ref()
            .is_some_and(|i| Arc::ptr_eq(i, input))
    }

    /// A receiver that turns true once its status is final.
    pub fn ended(&self) -> watch::Receiver<bool> {
        self.ended.subscribe()
    }

    /// Closes its kept stdin (the process reads end of file once what was written is read).
    /// A terminal is not closed this way.
    pub fn close_input(&self) -> Result<(), OpError> {
        if self.on_pty {
            return Err(OpError::invalid(format!(
                "process {} runs on a terminal, which stays open while it runs: send the \
                 terminal's end-of-file character (Ctrl-D, byte 4) instead",
                self.id
            )));
        }
        self.input.lock().unwrap_or_else(|p| p.into_inner()).take();
        Ok(())
    }

    /// Sets its terminal's size.
    pub fn resize(&self, cols: u16, rows: u16) -> Result<(), OpError> {
        let pty = self.pty.lock().unwrap_or_else(|p| p.into_inner()).clone();
        let Some(pty) = pty else {
            let why = if self.on_pty {
                "it has ended"
            } else {
                "it was not started on one"
            };
            return Err(OpError::invalid(format!(
                "process {} has no terminal to resize: {why}",
                self.id
            )));
        };
        pty.resize(cols, rows)
            .map_err(|e| OpError::new(ErrorCode::Internal, format!("resizing the terminal: {e}")))
    }

    /// A receiver that wakes on every change (output, exit).
    pub fn subscribe(&self) -> watch::Receiver<()> {
        self.changed.subscribe()
    }

    /// Output chunks from index `from` on, and the final status if the process is done.
    pub fn read_from(&self, from: usize) -> (Vec<(FrameKind, Vec<u8>)>, Option<ExitStatus>) {
        let st = lock(&self.state);
        let chunks = st.chunks.get(from..).map(<[_]>::to_vec).unwrap_or_default();
        (chunks, st.status.clone())
    }

    pub fn status(&self) -> Option<ExitStatus> {
        lock(&self.state).status.clone()
    }

    pub fn info(&self) -> ProcessInfo {
        let status = self.status();
        ProcessInfo {
            process_id: self.id,
            pid: self.pid,
            argv: self.argv.clone(),
            user: self.user.clone(),
            running: status.is_none(),
            exit: status,
            pty: self.on_pty,
            stdin_open: !self.on_pty
                && self
                    .input
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .is_some(),
        }
    }

    fn append(&self, kind: FrameKind, data: &[u8]) {
        let mut st = lock(&self.state);
        if st.status.is_some() {
            return;
        }
        let i = stream_index(kind);
        st.total[i] += data.len() as u64;
        let room = st.max.saturating_sub(st.kept[i]) as usize;
        if data.len() > room {
            st.truncated[i] = true;
        }
        let keep = &data[..data.len().min(room)];
        if !keep.is_empty() {
            st.kept[i] += keep.len() as u64;
            st.chunks.push((kind, keep.to_vec()));
        }
        drop(st);
        self.changed.send_replace(());
    }

    /// Whether an output pipe still holds bytes its pump has not read.
    fn output_pending(&self) -> bool {
        let st = lock(&self.state);
        st.status.is_none()
            && st
                .readers
                .iter()
                .flatten()
                .any(|fd| rustix::io::ioctl_fionread(fd).is_ok_and(|n| n > 0))
    }

    fn stream_ended(&self, kind: FrameKind) {
        let mut st = lock(&self.state);
        st.eof[stream_index(kind)] = true;
        st.readers[stream_index(kind)] = None;
        let done = st.exited.is_some() && st.eof[0] && st.eof[1];
        drop(st);
        if done {
            self.finish();
        }
    }

    fn exited(self: &Arc<Self>, how: Exit) {
        let mut st = lock(&self.state);
        st.exited = Some(how);
        st.ended_at = Some(Instant::now());
        let done = st.eof[0] && st.eof[1];
        drop(st);
        if done {
            self.finish();
        } else {
            let me = self.clone();
            tokio::spawn(async move {
                // Longer while output written before the exit is still in a pipe, up to
                // MAX_DRAIN_WAITS graces (a background child that never stops writing).
                for _ in 0..MAX_DRAIN_WAITS {
                    tokio::time::sleep(DRAIN_GRACE).await;
                    if !me.output_pending() {
                        break;
                    }
                }
                me.finish();
            });
        }
    }

    /// Makes the status final; output still coming is no longer kept.
    fn finish(&self) {
        let mut st = lock(&self.state);
        if st.status.is_some() {
            return;
        }
        let Some(how) = st.exited else { return };
        let (exit_code, signal) = match how {
            Exit::Code(c) => (c, None),
            Exit::Signal(s) => (128 + s, Some(s)),
        };
        let ended = st.ended_at.unwrap_or_else(Instant::now);
        st.readers = [None, None];
        st.status = Some(ExitStatus {
            exit_code,
            signal,
            timed_out: st.timed_out,
            stdout_bytes: st.total[0],
            stderr_bytes: st.total[1],
            stdout_truncated: st.truncated[0],
            stderr_truncated: st.truncated[1],
            duration_ms: ended.duration_since(self.started).as_millis() as u64,
        });
        drop(st);
        // Nothing more to read or write: the stdin pipe closes, the terminal hangs up (once
        // the pump and any writer in progress let go of it).
        self.input.lock().unwrap_or_else(|p| p.into_inner()).take();
        self.pty.lock().unwrap_or_else(|p| p.into_inner()).take();
        self.ended.send_replace(true);
        self.changed.send_replace(());
    }
}

/// All processes of this sandbox.
pub struct Table {
    inner: Mutex<Inner>,
    /// Output pipes of finished commands that something still holds open.
    lingering: Arc<Lingering>,
    /// The sandbox's devpts (`O_PATH`), where terminals are opened.
    pts: OwnedFd,
}

#[derive(Default)]
struct Inner {
    next_id: u64,
    procs: BTreeMap<u64, Arc<Proc>>,
    by_pid: HashMap<i32, u64>,
}

impl Table {
    /// An empty table whose terminals are opened on the devpts instance `pts`.
    pub fn new(pts: OwnedFd) -> Table {
        Table {
            inner: Mutex::default(),
            lingering: Arc::default(),
            pts,
        }
    }

    fn inner(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn get(&self, id: u64) -> Result<Arc<Proc>, OpError> {
        self.inner().procs.get(&id).cloned().ok_or_else(|| {
            OpError::new(
                ErrorCode::ProcessNotFound,
                format!("process {id} not found: it never existed or was already collected; list processes to see the ones kept"),
            )
        })
    }

    pub fn list(&self) -> Vec<ProcessInfo> {
        self.inner().procs.values().map(|p| p.info()).collect()
    }

    pub fn len(&self) -> usize {
        self.inner().procs.len()
    }

    /// Forgets a process (its output and status). A running process keeps running.
    pub fn forget(&self, id: u64) {
        let mut inner = self.inner();
        if let Some(p) = inner.procs.remove(&id) {
            inner.by_pid.remove(&p.pid);
        }
    }

    /// Called by the reaper for every child that exited.
    pub fn on_exit(&self, pid: i32, how: Exit) {
        let mut inner = self.inner();
        let Some(id) = inner.by_pid.remove(&pid) else {
            return; // an orphan that was reparented to us, or a process already forgotten
        };
        let p = inner.procs.get(&id).cloned();
        drop(inner);
        if let Some(p) = p {
            p.exited(how);
        }
    }

    fn evict_finished(inner: &mut Inner) {
        let finished: Vec<u64> = inner
            .procs
            .iter()
            .filter(|(_, p)| p.status().is_some())
            .map(|(id, _)| *id)
            .collect();
        if finished.len() > KEEP_FINISHED {
            for id in &finished[..finished.len() - KEEP_FINISHED] {
                if let Some(p) = inner.procs.remove(id) {
                    inner.by_pid.remove(&p.pid);
                }
            }
        }
    }

    /// Starts a command. Returns the process and, for [`StdinMode::Frames`], its stdin pipe
    /// (for [`StdinMode::Open`] and a terminal, the process keeps its input).
    ///
    /// A program that cannot be found or executed still yields a finished process (exit code
    /// 127 or 126 with the reason on stderr), as a shell would report it.
    pub fn start(
        &self,
        spec: &ExecSpec,
        user: &User,
        base_env: &[(String, String)],
        confinement: &Arc<warren_sys::confine::Confinement>,
        grader: Option<&crate::grader::Grader>,
        spawner: Option<&Spawner>,
    ) -> Result<(Arc<Proc>, Option<pipe::Sender>), OpError> {
        let Some(program) = spec.argv.first() else {
            return Err(OpError::invalid(
                "empty command: give argv with at least a program, or cmd",
            ));
        };
        let cwd = match &spec.cwd {
            Some(c) => warren_types::path::resolve(&user.home, c),
            None => user.home.clone(),
        };
        // A grader's working directory is in its own view, checked there.
        if grader.is_none() {
            let cwd_ok = {
                let _as = warren_sys::creds::ActAs::new(user.uid, user.gid);
                std::fs::metadata(&cwd).map(|m| m.is_dir())
            };
            match cwd_ok {
                Ok(true) => {}
                Ok(false) => {
                    return Err(OpError::invalid(format!(
                        "working directory {cwd} is not a directory"
                    )));
                }
                Err(e) => return Err(OpError::io(&e, "working directory", &cwd)),
            }
        }

        // The environment: the defaults, the sandbox's, the command's (later wins).
        let mut env: Vec<(String, String)> = vec![
            (
                "PATH".into(),
                "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin".into(),
            ),
            ("HOME".into(), user.home.clone()),
            ("USER".into(), user.name.clone()),
            ("LOGNAME".into(), user.name.clone()),
            ("SHELL".into(), user.shell.clone()),
            ("LANG".into(), "C.UTF-8".into()),
        ];
        if spec.pty.is_some() {
            env.push(("TERM".into(), "xterm-256color".into()));
        }
        for (k, v) in base_env.iter().chain(spec.env.iter()) {
            match env.iter_mut().find(|(ek, _)| ek == k) {
                Some(e) => e.1 = v.clone(),
                None => env.push((k.clone(), v.clone())),
            }
        }
        // The terminal, made before anything starts (its failure is the caller's answer).
        let terminal = match spec.pty {
            Some(size) => Some(open_terminal(self.pts.as_fd(), size, user)?),
            None => None,
        };
        let launch = match (grader, spawner) {
            (Some(g), _) => Launch::Grader(g),
            (None, Some(s)) if s.alive() => Launch::Spawner(s),
            // A builder's root commands get their capabilities from the spawner alone: started
            // here they would run without them, and a build could go on to a different result.
            (None, Some(s)) if s.builder => Launch::Refused,
            (None, _) => Launch::Direct,
        };
        let mut inner = self.inner();
        inner.next_id += 1;
        let id = inner.next_id;
        let started = match launch {
            Launch::Spawner(sp) => match spawn_via(sp, spec, user, &env, &cwd, terminal.as_ref()) {
                Ok(started) => started,
                // The spawner never had it (it is gone: an agent cannot kill it, but the
                // kernel's OOM killer can): start it here, confined in the child.
                Err(SpawnVia::Lost(crate::spawner::Lost::NotSent(_))) if sp.builder => {
                    Err(builder_lost())
                }
                Err(SpawnVia::Lost(crate::spawner::Lost::NotSent(e))) => {
                    eprintln!(
                        "warren-guest: the spawner is gone ({e}); starting commands directly"
                    );
                    command(spec, user, &env, Some(&cwd), confinement, terminal.as_ref())
                        .and_then(|mut c| c.spawn())
                        .map(|c| Started::new(c, terminal.as_ref()))
                        .map_err(Failed::from)
                }
                // It had it and did not answer: the command may be running, so it is not
                // started a second time; later ones start here.
                Err(SpawnVia::Lost(e @ crate::spawner::Lost::NoAnswer(_))) => {
                    eprintln!("warren-guest: the spawner failed ({e}); starting commands directly");
                    Err(Failed {
                        code: 126,
                        why: format!("the spawner failed ({e}); run the command again"),
                    })
                }
                Err(SpawnVia::Pipes(e)) => Err(Failed {
                    code: 126,
                    why: format!("making its pipes: {e}"),
                }),
            },
            Launch::Grader(g) => {
                let cwd = spec.cwd.as_ref().map(|_| cwd.clone());
                command(spec, user, &env, None, confinement, terminal.as_ref())
                    .and_then(|cmd| g.spawn(cmd, cwd))
                    .map(|c| Started::new(c, terminal.as_ref()))
                    .map_err(Failed::from)
            }
            Launch::Direct => command(spec, user, &env, Some(&cwd), confinement, terminal.as_ref())
                .and_then(|mut c| c.spawn())
                .map(|c| Started::new(c, terminal.as_ref()))
                .map_err(Failed::from),
            Launch::Refused => Err(builder_lost()),
        };
        match started {
            Ok(st) => {
                let pid = st.pid;
                // Our end of the terminal (the program's end closes with `terminal` here).
                let master = match terminal.map(|t| Master::new(t.master)).transpose() {
                    Ok(m) => m.map(Arc::new),
                    Err(e) => {
                        drop(inner);
                        let _ = warren_sys::process::kill(pid, libc_sigkill());
                        return Err(OpError::io(&e, "terminal of", program));
                    }
                };
                let stdin = st
                    .stdin
                    .map(pipe::Sender::from_owned_fd)
                    .transpose()
                    .map_err(|e| OpError::io(&e, "stdin pipe of", program));
                let stdin = match stdin {
                    Ok(s) => s,
                    Err(e) => {
                        drop(inner);
                        let _ = warren_sys::process::kill(pid, libc_sigkill());
                        return Err(e);
                    }
                };
                let (kept, stdin) = match (&master, spec.stdin) {
                    (Some(m), _) => (Some(Input::Pty(m.clone())), None),
                    (None, StdinMode::Open) => (stdin.map(Input::Pipe), None),
                    (None, _) => (None, stdin),
                };
                let proc = Proc::with_io(id, pid, spec, user, master.clone(), kept);
                inner.procs.insert(id, proc.clone());
                inner.by_pid.insert(pid, id);
                Self::evict_finished(&mut inner);
                drop(inner);
                match master {
                    Some(m) => {
                        tokio::spawn(pump_terminal(proc.clone(), m));
                        proc.stream_ended(FrameKind::Stderr);
                    }
                    None => {
                        for (fd, kind) in [
                            (st.stdout, FrameKind::Stdout),
                            (st.stderr, FrameKind::Stderr),
                        ] {
                            let dup = fd.as_ref().and_then(|f| f.try_clone().ok());
                            match fd.map(pipe::Receiver::from_owned_fd) {
                                Some(Ok(rx)) => {
                                    lock(&proc.state).readers[stream_index(kind)] = dup;
                                    tokio::spawn(pump(
                                        proc.clone(),
                                        rx,
                                        kind,
                                        self.lingering.clone(),
                                    ));
                                }
                                _ => proc.stream_ended(kind),
                            }
                        }
                    }
                }
                if let Some(ms) = spec.timeout_ms {
                    tokio::spawn(enforce_timeout(proc.clone(), Duration::from_millis(ms)));
                }
                Ok((proc, stdin))
            }
            Err(Failed { code, why }) => {
                let proc = Proc::new(id, 0, spec, user);
                inner.procs.insert(id, proc.clone());
                Self::evict_finished(&mut inner);
                drop(inner);
                proc.append(
                    FrameKind::Stderr,
                    format!("warren: {}: {why}\n", shortened(program)).as_bytes(),
                );
                proc.stream_ended(FrameKind::Stdout);
                proc.stream_ended(FrameKind::Stderr);
                proc.exited(Exit::Code(code));
                Ok((proc, None))
            }
        }
    }
}

/// `name`, cut to 256 bytes for a message (a program name may be 128 KiB long).
fn shortened(name: &str) -> std::borrow::Cow<'_, str> {
    const MAX: usize = 256;
    if name.len() <= MAX {
        return name.into();
    }
    let mut cut = MAX;
    while !name.is_char_boundary(cut) {
        cut -= 1;
    }
    format!("{}...", &name[..cut]).into()
}

/// Who starts a command.
enum Launch<'a> {
    /// The spawner (agent commands): confined already, nothing to install.
    Spawner(&'a Spawner),
    /// The grader thread, in a fresh view, confined in the child.
    Grader(&'a crate::grader::Grader),
    /// This process, confined in the child (development `serve` mode, or the spawner gone).
    Direct,
    /// Not at all: a builder sandbox's spawner is gone.
    Refused,
}

/// A started command's pid and our ends of its pipes (none on a terminal: the terminal's
/// multiplexer is the caller's).
struct Started {
    pid: i32,
    stdin: Option<OwnedFd>,
    stdout: Option<OwnedFd>,
    stderr: Option<OwnedFd>,
}

impl Started {
    fn new(mut c: std::process::Child, terminal: Option<&Terminal>) -> Started {
        let s = Started {
            pid: c.id() as i32,
            stdin: c.stdin.take().map(OwnedFd::from),
            stdout: c.stdout.take().map(OwnedFd::from),
            stderr: c.stderr.take().map(OwnedFd::from),
        };
        debug_assert!(terminal.is_none() || s.stdout.is_none());
        // The reaper collects the child; dropping the std handle neither waits nor kills.
        drop(c);
        s
    }
}

/// A new terminal for one command.
struct Terminal {
    master: OwnedFd,
    slave: OwnedFd,
}

/// Opens a terminal of `size` on `pts`, its program's end given to `user` (as a login gives
/// a user their terminal; best effort: the program has the descriptor either way).
fn open_terminal(
    pts: std::os::fd::BorrowedFd<'_>,
    size: warren_types::guest::TermSize,
    user: &User,
) -> Result<Terminal, OpError> {
    // Past the sandbox's 256 terminals (its devpts `max=`) the kernel answers ENOSPC.
    let pair = warren_sys::pty::open(pts, size.cols, size.rows).map_err(|e| {
        let code = if e.raw_os_error() == Some(28) {
            ErrorCode::Capacity
        } else {
            ErrorCode::Internal
        };
        OpError::new(
            code,
            format!("opening a terminal: {e}; a sandbox holds at most 256 at once"),
        )
    })?;
    let _ = rustix::fs::fchown(
        &pair.slave,
        Some(rustix::fs::Uid::from_raw(user.uid)),
        Some(rustix::fs::Gid::from_raw(TTY_GID)),
    );
    Ok(Terminal {
        master: pair.master,
        slave: pair.slave,
    })
}

/// The `tty` group, which owns terminals (devpts is mounted with `gid=5`).
const TTY_GID: u32 = 5;

/// A builder sandbox whose spawner is gone (a build step killed it): its commands are refused.
fn builder_lost() -> Failed {
    Failed {
        code: 126,
        why: "this builder sandbox's spawner is gone (a step killed it), so commands could no \
              longer run with the build capabilities; start the build again"
            .into(),
    }
}

/// Why a command did not start, as a shell reports it: 127 not found, 126 not runnable.
struct Failed {
    code: i32,
    why: String,
}

impl From<std::io::Error> for Failed {
    fn from(e: std::io::Error) -> Failed {
        match e.kind() {
            std::io::ErrorKind::NotFound => Failed {
                code: 127,
                why: "command not found".into(),
            },
            std::io::ErrorKind::PermissionDenied => Failed {
                code: 126,
                why: "permission denied".into(),
            },
            _ => Failed {
                code: 126,
                why: e.to_string(),
            },
        }
    }
}

/// A `Command` for the grader thread or direct spawning, confined in its child. On a
/// terminal, the child starts a session whose controlling terminal it is.
fn command(
    spec: &ExecSpec,
    user: &User,
    env: &[(String, String)],
    cwd: Option<&str>,
    confinement: &Arc<warren_sys::confine::Confinement>,
    terminal: Option<&Terminal>,
) -> std::io::Result<Command> {
    let mut cmd = Command::new(&spec.argv[0]);
    cmd.args(&spec.argv[1..])
        .env_clear()
        .envs(env.iter().cloned());
    if let Some(cwd) = cwd {
        cmd.current_dir(cwd);
    }
    cmd.uid(user.uid).gid(user.gid);
    match terminal {
        Some(t) => {
            let io = || t.slave.try_clone().map(Stdio::from);
            cmd.stdin(io()?).stdout(io()?).stderr(io()?);
            warren_sys::pty::controlling_terminal_on_exec(&mut cmd);
        }
        None => {
            cmd.process_group(0)
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .stdin(match spec.stdin {
                    StdinMode::Null => Stdio::null(),
                    StdinMode::Frames | StdinMode::Open => Stdio::piped(),
                });
        }
    }
    confinement.apply_on_exec(&mut cmd);
    Ok(cmd)
}

/// Why [`spawn_via`] has no answer from the spawner.
enum SpawnVia {
    /// The pipes could not be made (the spawner was not asked).
    Pipes(std::io::Error),
    Lost(crate::spawner::Lost),
}

/// Starts an agent command through the spawner, with pipes made here. The outer error: the
/// spawner (or a pipe) failed, not the command.
fn spawn_via(
    sp: &Spawner,
    spec: &ExecSpec,
    user: &User,
    env: &[(String, String)],
    cwd: &str,
    terminal: Option<&Terminal>,
) -> Result<Result<Started, Failed>, SpawnVia> {
    let mut req = crate::spawner::Request {
        argv: spec.argv.clone(),
        env: env.to_vec(),
        cwd: cwd.to_string(),
        uid: user.uid,
        gid: user.gid,
        stdin: true,
        tty: true,
    };
    if let Some(t) = terminal {
        let tty = t.slave.as_fd();
        let answer = sp
            .spawn(&req, Some(tty), tty, tty)
            .map_err(SpawnVia::Lost)?;
        return Ok(started_or_failed(answer, None, None, None));
    }
    req.tty = false;
    let pipe = || rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC);
    let (out_r, out_w) = pipe().map_err(|e| SpawnVia::Pipes(e.into()))?;
    let (err_r, err_w) = pipe().map_err(|e| SpawnVia::Pipes(e.into()))?;
    let stdin = match spec.stdin {
        StdinMode::Frames | StdinMode::Open => Some(pipe().map_err(|e| SpawnVia::Pipes(e.into()))?),
        StdinMode::Null => None,
    };
    req.stdin = stdin.is_some();
    let answer = sp
        .spawn(
            &req,
            stdin.as_ref().map(|(r, _)| r.as_fd()),
            out_w.as_fd(),
            err_w.as_fd(),
        )
        .map_err(SpawnVia::Lost)?;
    Ok(started_or_failed(
        answer,
        stdin.map(|(_, w)| w),
        Some(out_r),
        Some(err_r),
    ))
}

/// The spawner's answer, with our ends of the command's pipes.
fn started_or_failed(
    answer: crate::spawner::Answer,
    stdin: Option<OwnedFd>,
    stdout: Option<OwnedFd>,
    stderr: Option<OwnedFd>,
) -> Result<Started, Failed> {
    match answer {
        crate::spawner::Answer::Started { pid } => Ok(Started {
            pid,
            stdin,
            stdout,
            stderr,
        }),
        crate::spawner::Answer::Failed {
            exec,
            errno,
            message,
        } => {
            let e = std::io::Error::from_raw_os_error(errno);
            if exec {
                Err(Failed::from(e))
            } else {
                Err(Failed {
                    code: 126,
                    why: message,
                })
            }
        }
    }
}

/// Keeps a terminal's output (one stream: stdout) until it hangs up (every holder of the
/// program's end closed it: reads then fail with EIO), or until the status is final: then the
/// terminal is left to close, which hangs it up for whatever still holds it.
async fn pump_terminal(proc: Arc<Proc>, master: Arc<Master>) {
    let mut buf = vec![0u8; READ_CHUNK];
    let mut ended = proc.ended.subscribe();
    loop {
        tokio::select! {
            biased;
            _ = ended.wait_for(|e| *e) => return,
            read = master.read(&mut buf) => match read {
                Ok(0) | Err(_) => break,
                Ok(n) => proc.append(FrameKind::Stdout, &buf[..n]),
            },
        }
    }
    proc.stream_ended(FrameKind::Stdout);
}

/// Keeps one output stream of `proc` until end of file, or until its status is final while
/// something still holds the pipe: then the pipe is drained by `lingering` (without the
/// process, whose kept output is freed once it is collected).
async fn pump(proc: Arc<Proc>, mut rx: pipe::Receiver, kind: FrameKind, lingering: Arc<Lingering>) {
    if follow(&proc, &mut rx, kind).await {
        proc.stream_ended(kind);
        return;
    }
    drop(proc);
    lingering.drain(rx).await;
}

/// Reads `rx` into `proc`; true at end of file, false once the status is final first.
async fn follow(proc: &Proc, rx: &mut pipe::Receiver, kind: FrameKind) -> bool {
    let mut buf = vec![0u8; READ_CHUNK];
    let mut ended = proc.ended.subscribe();
    loop {
        tokio::select! {
            // The end first: a writer that never pauses must not keep the pump here.
            biased;
            _ = ended.wait_for(|e| *e) => return false,
            read = rx.read(&mut buf) => match read {
                Ok(0) | Err(_) => return true,
                Ok(n) => proc.append(kind, &buf[..n]),
            },
        }
    }
}

async fn enforce_timeout(proc: Arc<Proc>, after: Duration) {
    tokio::time::sleep(after).await;
    let mut st = lock(&proc.state);
    if st.exited.is_some() {
        return;
    }
    st.timed_out = true;
    drop(st);
    let _ = warren_sys::process::kill_group(proc.pid, libc_sigkill());
    let _ = warren_sys::process::kill(proc.pid, libc_sigkill());
}

const fn libc_sigkill() -> i32 {
    9
}
