//! Running commands in a sandbox through its guest agent.

use std::collections::BTreeMap;
use std::sync::Arc;

use base64::Engine;
use base64::engine::general_purpose::STANDARD as B64;
use warren_types::ByteSize;
use warren_types::api::{
    Encoding, ExecEvent, ExecRequest, ExecResult, ExitStatus, ProcessInfo, PtySize, Role,
    TrajectoryEntry,
};
use warren_types::guest::{ExecSpec, FrameKind, Op, Reply, StdinMode, TermSize};
use warren_types::id::SandboxId;

use crate::error::NodeError;
use crate::guest_client::{GuestConn, GuestError, Incoming};
use crate::node::{Busy, Node, Sandbox};
use crate::trajectory::log::{Key, Outcome};
use crate::validate::check_env;

/// The events of a streaming exec or attach, in order; the HTTP layer writes them out.
pub type EventStream = tokio::sync::mpsc::Receiver<ExecEvent>;

/// Events produced ahead of a slow reader.
const EVENTS_IN_FLIGHT: usize = 64;

/// Where a streaming operation sends its events.
struct Events(tokio::sync::mpsc::Sender<ExecEvent>);

impl Events {
    /// Sends one event; `false` once the reader has gone.
    async fn send(&self, ev: ExecEvent) -> bool {
        self.0.send(ev).await.is_ok()
    }
}

/// Default per-stream output cap.
pub const DEFAULT_MAX_OUTPUT: u64 = 64 << 20;
/// Largest per-stream output cap a request may ask for.
pub const LIMIT_MAX_OUTPUT: u64 = 1 << 30;
/// Default timeout of a foreground exec, seconds.
pub const DEFAULT_EXEC_TIMEOUT: f64 = 600.0;

/// A checked exec request: what the guest runs, and its stdin.
pub struct Prepared {
    pub spec: ExecSpec,
    pub stdin: Option<Vec<u8>>,
    /// The request's own environment (for the trajectory log).
    pub env: BTreeMap<String, String>,
}

/// What identifies a command in the trajectory log, owned: the request itself moves on to the
/// guest.
pub(crate) struct Identity {
    argv: Vec<String>,
    env: BTreeMap<String, String>,
    cwd: Option<String>,
    user: String,
    stdin: Option<Vec<u8>>,
}

impl Identity {
    pub(crate) fn key(&self) -> Key<'_> {
        Key::Exec {
            argv: &self.argv,
            env: &self.env,
            cwd: self.cwd.as_deref(),
            user: &self.user,
            stdin: self.stdin.as_deref(),
        }
    }
}

impl Prepared {
    pub(crate) fn identity(&self) -> Identity {
        Identity {
            argv: self.spec.argv.clone(),
            env: self.env.clone(),
            cwd: self.spec.cwd.clone(),
            user: self.spec.user.clone(),
            stdin: self.stdin.clone(),
        }
    }
}

/// Largest command line (`cmd`, or `argv` with a NUL after each argument).
pub const MAX_ARGV_BYTES: usize = 1 << 20;
/// Most arguments.
pub const MAX_ARGS: usize = 65536;

/// Checks an exec request; `default_timeout` applies when it names none.
pub fn prepare(req: &ExecRequest, default_timeout: Option<f64>) -> Result<Prepared, NodeError> {
    let bad = |m: &str| Err(NodeError::Invalid(m.to_string()));
    let argv = match (&req.cmd, &req.argv) {
        (Some(_), Some(_)) => {
            return bad(
                "give either cmd (a shell command line) or argv (a program and its arguments), not both",
            );
        }
        (None, None) => {
            return bad(
                "nothing to run: give cmd (a shell command line) or argv (a program and its arguments)",
            );
        }
        (Some(cmd), None) => vec!["/bin/sh".to_string(), "-c".to_string(), cmd.clone()],
        (None, Some(argv)) if argv.is_empty() || argv[0].is_empty() => {
            return bad("argv is empty: give at least the program to run");
        }
        (None, Some(argv)) => argv.clone(),
    };
    if argv.iter().any(|a| a.contains('\0')) {
        return bad("the command contains a NUL byte");
    }
    let argv_bytes: usize = argv.iter().map(|a| a.len() + 1).sum();
    if argv_bytes > MAX_ARGV_BYTES || argv.len() > MAX_ARGS {
        return Err(NodeError::Invalid(format!(
            "the command is {} arguments, {argv_bytes} bytes; at most {MAX_ARGS} arguments and {} \
             (execve itself allows about 2 MiB with the environment): pass large inputs as stdin \
             or as a file",
            argv.len(),
            ByteSize(MAX_ARGV_BYTES as u64)
        )));
    }
    check_env(&req.env)?;
    if let Some(cwd) = &req.cwd {
        warren_types::path::check_user_path(cwd)
            .map_err(|m| NodeError::Invalid(format!("cwd: {m}")))?;
    }
    let role = req.role.unwrap_or_default();
    let user = match role {
        Role::Grader if req.user.is_some() => {
            return bad(
                "a grader command runs as the grader, a user of its own: leave user out (or run as the agent without role)",
            );
        }
        Role::Grader => "grader".to_string(),
        Role::Agent => req.user.clone().unwrap_or_else(|| "user".to_string()),
    };
    if user.is_empty() || user.len() > 64 || user.contains(['\0', ':', '/']) {
        return bad("user must be a user name or a numeric uid");
    }
    let timeout = req.timeout.or(default_timeout);
    let timeout_ms = match timeout {
        Some(t) if !t.is_finite() || t < 0.0 => {
            return bad("timeout must be zero (no limit) or a positive number of seconds");
        }
        Some(t) if t > 30.0 * 24.0 * 3600.0 => return bad("timeout may be at most 30 days"),
        Some(0.0) => None,
        Some(t) => Some((t * 1000.0).ceil() as u64),
        None => None,
    };
    let max_output = req
        .max_output
        .map(ByteSize::bytes)
        .unwrap_or(DEFAULT_MAX_OUTPUT);
    if max_output > LIMIT_MAX_OUTPUT {
        return Err(NodeError::Invalid(format!(
            "max_output {} is more than the {} allowed",
            ByteSize(max_output),
            ByteSize(LIMIT_MAX_OUTPUT)
        )));
    }
    let stdin = text_or_base64(req.stdin.as_deref(), req.stdin_b64.as_deref(), "stdin")?;
    let pty = match req.pty {
        Some(size) => {
            size.check()
                .map_err(|m| NodeError::Invalid(format!("pty: {m}")))?;
            Some(TermSize {
                cols: size.cols,
                rows: size.rows,
            })
        }
        None => None,
    };
    let stdin_mode = if req.stdin_open || pty.is_some() {
        StdinMode::Open
    } else if stdin.is_some() {
        StdinMode::Frames
    } else {
        StdinMode::Null
    };
    Ok(Prepared {
        spec: ExecSpec {
            argv,
            env: req
                .env
                .iter()
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect(),
            cwd: req.cwd.clone(),
            user,
            timeout_ms,
            max_output,
            stdin: stdin_mode,
            role,
            pty,
        },
        stdin,
        env: req.env.clone(),
    })
}

/// Input given as text (field `name`) or as base64 (`<name>_b64`), at most one of them.
pub fn text_or_base64(
    text: Option<&str>,
    b64: Option<&str>,
    name: &str,
) -> Result<Option<Vec<u8>>, NodeError> {
    match (text, b64) {
        (Some(_), Some(_)) => Err(NodeError::Invalid(format!(
            "give either {name} or {name}_b64, not both"
        ))),
        (Some(t), None) => Ok(Some(t.as_bytes().to_vec())),
        (None, Some(b)) => B64
            .decode(b)
            .map(Some)
            .map_err(|e| NodeError::Invalid(format!("{name}_b64 is not base64: {e}"))),
        (None, None) => Ok(None),
    }
}

/// Maps a failure to talk to the guest onto what the caller sees.
pub(crate) fn guest_failure(sb: &Sandbox, e: GuestError) -> NodeError {
    // Being killed (kill, timeout, task stop: the phase says so before the signal is sent), or
    // its init already dead: the sandbox is gone, which is not the host's failure.
    if sb.phase() == crate::node::Phase::Stopping || sb.instance.has_exited() {
        return NodeError::Gone(sb.record.id.clone());
    }
    NodeError::host(
        format!("talking to the guest agent of {}", sb.record.id),
        std::io::Error::other(e.to_string()),
    )
}

/// Turns an unexpected reply into an error.
pub(crate) fn unexpected(reply: Reply) -> NodeError {
    match reply {
        Reply::Error { code, message } => NodeError::Guest { code, message },
        other => NodeError::host(
            "guest protocol",
            std::io::Error::other(format!("unexpected reply {other:?}")),
        ),
    }
}

impl Node {
    /// Opens a guest operation on a running sandbox (resuming it if paused).
    pub(crate) async fn open(
        &self,
        id: &SandboxId,
        op: Op,
    ) -> Result<(Arc<Sandbox>, GuestConn), NodeError> {
        let sb = self.get(id)?;
        // Busy first: a sandbox resumed for this operation must not look idle meanwhile.
        let busy = Busy::new(&sb);
        self.ensure_running(&sb).await?;
        let conn = GuestConn::open(sb.socket(), op)
            .await
            .map_err(|e| guest_failure(&sb, e))?;
        Ok((sb, conn.hold(busy)))
    }

    /// Starts a command; returns the connection positioned after `Started`.
    async fn start_command(
        &self,
        id: &SandboxId,
        p: Prepared,
        background: bool,
    ) -> Result<(Arc<Sandbox>, GuestConn, u64, i32), NodeError> {
        let open_input = p.spec.stdin == StdinMode::Open;
        let op = if background {
            Op::Spawn(p.spec)
        } else {
            Op::Exec(p.spec)
        };
        let (sb, mut conn) = self.open(id, op).await?;
        // Input frames, ended by an empty one (which an open stdin always gets: it ends the
        // first input, not the stdin).
        if p.stdin.is_some() || open_input {
            let input = p.stdin.as_deref().unwrap_or_default();
            if !input.is_empty() {
                conn.send(FrameKind::Stdin, input)
                    .await
                    .map_err(|e| guest_failure(&sb, e))?;
            }
            conn.send(FrameKind::Stdin, &[])
                .await
                .map_err(|e| guest_failure(&sb, e))?;
        }
        match conn.reply().await.map_err(|e| guest_failure(&sb, e))? {
            Reply::Started { process, pid } => Ok((sb, conn, process, pid)),
            other => Err(unexpected(other)),
        }
    }

    /// Runs a command to completion and returns its output.
    pub async fn exec(&self, id: &SandboxId, p: Prepared) -> Result<ExecResult, NodeError> {
        let sb = self.get(id)?;
        let id_of = p.identity();
        let key = id_of.key();
        let replay_ended = match recorded(&sb, &key) {
            Ok(result) => {
                sb.trajectory.record_exec(&key, &result);
                return Ok(ExecResult {
                    replayed: true,
                    ..result
                });
            }
            Err(ended) => ended,
        };
        let mut r = self.exec_live(id, p).await?;
        sb.trajectory.record_exec(&key, &r);
        r.replay_ended = replay_ended;
        Ok(r)
    }

    /// Runs a command to completion, with no trajectory bookkeeping.
    pub(crate) async fn exec_live(
        &self,
        id: &SandboxId,
        p: Prepared,
    ) -> Result<ExecResult, NodeError> {
        let (sb, mut conn, _, _) = self.start_command(id, p, false).await?;
        let (mut out, mut err) = (Vec::new(), Vec::new());
        loop {
            match conn.next().await.map_err(|e| guest_failure(&sb, e))? {
                Some(Incoming::Data(FrameKind::Stdout, d)) => out.extend_from_slice(&d),
                Some(Incoming::Data(FrameKind::Stderr, d)) => err.extend_from_slice(&d),
                Some(Incoming::Data(..)) => {}
                Some(Incoming::Reply(Reply::Exit(status))) => {
                    self.note_truncation(&sb, &status);
                    return Ok(result(status, out, err));
                }
                Some(Incoming::Reply(other)) => return Err(unexpected(other)),
                None => return Err(guest_failure(&sb, GuestError::Closed)),
            }
        }
    }

    /// Runs a command; its events come on the stream returned (dropping it abandons them; the
    /// process runs on and can be re-attached).
    pub fn exec_stream(self: &Arc<Self>, id: &SandboxId, p: Prepared) -> EventStream {
        let (tx, rx) = tokio::sync::mpsc::channel(EVENTS_IN_FLIGHT);
        let (node, id) = (self.clone(), id.clone());
        tokio::spawn(async move { node.exec_into(&id, p, Events(tx)).await });
        rx
    }

    /// Runs a command and sends its events into `tx`.
    async fn exec_into(&self, id: &SandboxId, p: Prepared, tx: Events) {
        let sb = match self.get(id) {
            Ok(sb) => sb,
            Err(e) => {
                tx.send(ExecEvent::Error(e.to_api())).await;
                return;
            }
        };
        let id_of = p.identity();
        let key = id_of.key();
        let replay_ended = match recorded(&sb, &key) {
            Ok(result) => {
                sb.trajectory.record_exec(&key, &result);
                replay_events(&result, &tx).await;
                return;
            }
            Err(ended) => ended,
        };
        let (sb, conn, process, pid) = match self.start_command(id, p, false).await {
            Ok(v) => v,
            Err(e) => {
                tx.send(ExecEvent::Error(e.to_api())).await;
                return;
            }
        };
        let start = ExecEvent::Start {
            process_id: process,
            pid,
            replayed: false,
            replay_ended,
        };
        if !tx.send(start).await {
            return;
        }
        let keep = sb.record.trajectory;
        if let Some((status, out, err)) = forward(&sb, conn, tx, keep).await {
            self.note_truncation(&sb, &status);
            sb.trajectory.record_exec(&key, &result(status, out, err));
        }
    }

    /// Output cut at `max_output` is an incident (a `yes` flood looks like this).
    fn note_truncation(&self, sb: &Sandbox, status: &ExitStatus) {
        for (cut, stream) in [
            (status.stdout_truncated, "stdout"),
            (status.stderr_truncated, "stderr"),
        ] {
            if cut {
                self.events.occur(
                    &sb.record.id,
                    crate::events::Owner::of(&sb.record),
                    warren_types::events::EventKind::OutputTruncated,
                    format!("{stream} cut at max_output"),
                    1,
                );
            }
        }
    }

    /// Starts a background command.
    pub async fn spawn_process(
        &self,
        id: &SandboxId,
        p: Prepared,
    ) -> Result<ProcessInfo, NodeError> {
        let argv = p.spec.argv.clone();
        let user = p.spec.user.clone();
        let pty = p.spec.pty.is_some();
        let stdin_open = !pty && p.spec.stdin == StdinMode::Open;
        let (_, _, process, pid) = self.start_command(id, p, true).await?;
        Ok(ProcessInfo {
            process_id: process,
            pid,
            argv,
            user,
            running: true,
            exit: None,
            pty,
            stdin_open,
        })
    }

    /// Writes input to a process started with an open stdin or a terminal, then closes its
    /// stdin if `close`.
    pub async fn send_input(
        &self,
        id: &SandboxId,
        process: u64,
        data: &[u8],
        close: bool,
    ) -> Result<(), NodeError> {
        let (sb, mut conn) = self.open(id, Op::Input { process, close }).await?;
        let mut sent = Ok(());
        if !data.is_empty() {
            sent = conn.send(FrameKind::Stdin, data).await;
        }
        if sent.is_ok() {
            sent = conn.send(FrameKind::Stdin, &[]).await;
        }
        // A guest that refuses the input (no such process, stdin closed) answers at once and
        // hangs up without reading it: its answer, not the failed write, says why.
        match (conn.reply().await, sent) {
            (Ok(Reply::Done), Ok(())) => Ok(()),
            (Ok(Reply::Done), Err(e)) => Err(guest_failure(&sb, e)),
            (Ok(other), _) => Err(unexpected(other)),
            (Err(e), _) => Err(guest_failure(&sb, e)),
        }
    }

    /// Changes the size of a process's terminal.
    pub async fn resize_terminal(
        &self,
        id: &SandboxId,
        process: u64,
        size: PtySize,
    ) -> Result<(), NodeError> {
        size.check().map_err(NodeError::Invalid)?;
        let size = TermSize {
            cols: size.cols,
            rows: size.rows,
        };
        self.simple(id, Op::Resize { process, size }).await
    }

    /// Lists the sandbox's processes.
    pub async fn processes(&self, id: &SandboxId) -> Result<Vec<ProcessInfo>, NodeError> {
        let (sb, mut conn) = self.open(id, Op::Processes).await?;
        match conn.reply().await.map_err(|e| guest_failure(&sb, e))? {
            Reply::Processes { processes } => Ok(processes),
            other => Err(unexpected(other)),
        }
    }

    /// Waits up to `timeout_ms` for a process; returns its state either way.
    pub async fn wait_process(
        &self,
        id: &SandboxId,
        process: u64,
        timeout_ms: Option<u64>,
    ) -> Result<ProcessInfo, NodeError> {
        let (sb, mut conn) = self
            .open(
                id,
                Op::Wait {
                    process,
                    timeout_ms,
                },
            )
            .await?;
        match conn.reply().await.map_err(|e| guest_failure(&sb, e))? {
            Reply::Process(info) => Ok(info),
            other => Err(unexpected(other)),
        }
    }

    /// Sends a signal to a process's group.
    pub async fn signal_process(
        &self,
        id: &SandboxId,
        process: u64,
        signal: &str,
    ) -> Result<(), NodeError> {
        let signal = warren_sys::process::parse_signal(signal).ok_or_else(|| {
            NodeError::Invalid(format!(
                "{signal:?} is not a signal: use a name such as TERM, KILL, INT, or a number 1-64"
            ))
        })?;
        self.simple(id, Op::Signal { process, signal }).await
    }

    /// Forgets a process and its kept output.
    pub async fn forget_process(&self, id: &SandboxId, process: u64) -> Result<(), NodeError> {
        self.simple(id, Op::Forget { process }).await
    }

    /// A process's output from the start (what is kept), then as it comes, on the stream
    /// returned.
    pub fn attach(self: &Arc<Self>, id: &SandboxId, process: u64) -> EventStream {
        let (tx, rx) = tokio::sync::mpsc::channel(EVENTS_IN_FLIGHT);
        let (node, id) = (self.clone(), id.clone());
        tokio::spawn(async move {
            let tx = Events(tx);
            match node.open(&id, Op::Attach { process }).await {
                Ok((sb, conn)) => {
                    forward(&sb, conn, tx, false).await;
                }
                Err(e) => {
                    tx.send(ExecEvent::Error(e.to_api())).await;
                }
            }
        });
        rx
    }

    /// An operation whose only answer is `Done`.
    pub(crate) async fn simple(&self, id: &SandboxId, op: Op) -> Result<(), NodeError> {
        let (sb, mut conn) = self.open(id, op).await?;
        match conn.reply().await.map_err(|e| guest_failure(&sb, e))? {
            Reply::Done => Ok(()),
            other => Err(unexpected(other)),
        }
    }
}

/// Forwards output frames and the exit as events, until the end or the client leaves.
async fn forward(
    sb: &Sandbox,
    mut conn: GuestConn,
    tx: Events,
    keep: bool,
) -> Option<(ExitStatus, Vec<u8>, Vec<u8>)> {
    let (mut out, mut err) = (Vec::new(), Vec::new());
    loop {
        let ev = match conn.next().await {
            Ok(Some(Incoming::Data(FrameKind::Stdout, d))) => {
                if keep {
                    out.extend_from_slice(&d);
                }
                ExecEvent::Stdout {
                    data: B64.encode(d),
                }
            }
            Ok(Some(Incoming::Data(FrameKind::Stderr, d))) => {
                if keep {
                    err.extend_from_slice(&d);
                }
                ExecEvent::Stderr {
                    data: B64.encode(d),
                }
            }
            Ok(Some(Incoming::Data(..))) => continue,
            Ok(Some(Incoming::Reply(Reply::Exit(status)))) => {
                tx.send(ExecEvent::Exit(status.clone())).await;
                return Some((status, out, err));
            }
            Ok(Some(Incoming::Reply(other))) => ExecEvent::Error(unexpected(other).to_api()),
            Ok(None) => ExecEvent::Error(guest_failure(sb, GuestError::Closed).to_api()),
            Err(e) => ExecEvent::Error(guest_failure(sb, e).to_api()),
        };
        let last = matches!(ev, ExecEvent::Error(_));
        if !tx.send(ev).await || last {
            return None;
        }
    }
}

/// The recorded result of a command being replayed; otherwise whether replay ended just now.
fn recorded(sb: &Sandbox, key: &Key<'_>) -> Result<ExecResult, bool> {
    match sb.trajectory.replay_step(key) {
        Some(Outcome::Hit(e)) => match *e {
            TrajectoryEntry::Exec { result, .. } => Ok(result),
            TrajectoryEntry::WriteFile { .. } => Err(true),
        },
        Some(Outcome::Ended) => Err(true),
        None => Err(false),
    }
}

/// Sends a recorded result as the events a live run would have given.
async fn replay_events(r: &ExecResult, tx: &Events) {
    let start = ExecEvent::Start {
        process_id: 0,
        pid: 0,
        replayed: true,
        replay_ended: false,
    };
    let bytes = |text: &str, enc: Encoding| match enc {
        Encoding::Utf8 => text.as_bytes().to_vec(),
        Encoding::Base64 => B64.decode(text).unwrap_or_default(),
    };
    let out = bytes(&r.stdout, r.stdout_encoding);
    let err = bytes(&r.stderr, r.stderr_encoding);
    let mut events = vec![start];
    if !out.is_empty() {
        events.push(ExecEvent::Stdout {
            data: B64.encode(out),
        });
    }
    if !err.is_empty() {
        events.push(ExecEvent::Stderr {
            data: B64.encode(err),
        });
    }
    events.push(ExecEvent::Exit(r.status.clone()));
    for ev in events {
        if !tx.send(ev).await {
            return;
        }
    }
}

fn text(bytes: Vec<u8>) -> (String, Encoding) {
    match String::from_utf8(bytes) {
        Ok(s) => (s, Encoding::Utf8),
        Err(e) => (B64.encode(e.into_bytes()), Encoding::Base64),
    }
}

fn result(status: ExitStatus, out: Vec<u8>, err: Vec<u8>) -> ExecResult {
    let (stdout, stdout_encoding) = text(out);
    let (stderr, stderr_encoding) = text(err);
    ExecResult {
        status,
        stdout,
        stderr,
        stdout_encoding,
        stderr_encoding,
        replayed: false,
        replay_ended: false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req() -> ExecRequest {
        ExecRequest {
            cmd: Some("true".into()),
            ..ExecRequest::default()
        }
    }

    #[test]
    fn shell_and_argv_are_exclusive_and_required() {
        assert!(prepare(&ExecRequest::default(), None).is_err());
        let both = ExecRequest {
            argv: Some(vec!["ls".into()]),
            ..req()
        };
        assert!(prepare(&both, None).is_err());
        let p = prepare(&req(), None).unwrap();
        assert_eq!(p.spec.argv, ["/bin/sh", "-c", "true"]);
        assert_eq!(p.spec.user, "user");
        let empty = ExecRequest {
            argv: Some(vec![]),
            ..ExecRequest::default()
        };
        assert!(prepare(&empty, None).is_err());
    }

    #[test]
    fn timeouts_and_caps_are_checked() {
        let neg = ExecRequest {
            timeout: Some(-1.0),
            ..req()
        };
        assert!(prepare(&neg, None).is_err());
        let nan = ExecRequest {
            timeout: Some(f64::NAN),
            ..req()
        };
        assert!(prepare(&nan, None).is_err());
        let zero = ExecRequest {
            timeout: Some(0.0),
            ..req()
        };
        assert_eq!(prepare(&zero, Some(600.0)).unwrap().spec.timeout_ms, None);
        assert_eq!(
            prepare(&req(), Some(1.5)).unwrap().spec.timeout_ms,
            Some(1500)
        );
        let huge = ExecRequest {
            max_output: Some(ByteSize(2 << 30)),
            ..req()
        };
        assert!(prepare(&huge, None).is_err());
        let bad_b64 = ExecRequest {
            stdin_b64: Some("***".into()),
            ..req()
        };
        assert!(prepare(&bad_b64, None).is_err());
        let cwd = ExecRequest {
            cwd: Some("/tmp/../etc".into()),
            ..req()
        };
        assert!(prepare(&cwd, None).is_err());
    }

    #[test]
    fn non_utf8_output_is_base64() {
        let r = result(ExitStatus::default(), vec![0xff, 0xfe], b"ok".to_vec());
        assert_eq!(r.stdout_encoding, Encoding::Base64);
        assert_eq!(r.stdout, "//4=");
        assert_eq!(r.stderr, "ok");
    }
}
