//! Function calls: the worker side of the FnCall backend.
//!
//! A call's files are written into a fresh view of the image's pristine layers (made by the
//! grader thread: a tmpfs of its own for everything written, its own `/dev/shm` and IPC
//! namespace, nothing of the agent's), and each step runs there as the grader's uid, under the
//! sandbox's system-call policy and the step's own limits (wall clock, CPU, processes, file
//! size, output). Each step starts as the first process of a PID namespace of its own: this
//! binary again (`warren-guest call-init`), a small init that starts the step's program,
//! waits for it, and reports how it ended and what it used on descriptor 3. When the init
//! exits (or is killed at a limit) the kernel kills everything else in the namespace, so no
//! process outlives its step; when the call ends its view goes, with every file written in
//! it. Nothing of one call is there for the next: no files, no processes, no environment.
//!
//! The init also keeps the reaping out of the guest's hands: the program that may fail to
//! start is started by the init, so the guest only ever starts a binary it knows is there.

use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use base64::Engine;
use serde::{Deserialize, Serialize};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::unix::pipe;
use warren_types::error::ErrorCode;
use warren_types::guest::{CALL_DIR, CallResult, CallSpec, CallStep, StepResult};

use crate::server::Guest;
use crate::wire::OpError;

/// A file to write, decoded.
pub struct File {
    /// Relative path.
    pub path: String,
    /// Content.
    pub data: Vec<u8>,
    /// Executable.
    pub executable: bool,
}

/// Most files in one call.
const MAX_FILES: usize = 1000;
/// Most steps in one call.
const MAX_STEPS: usize = 64;
/// Longest wall-clock limit of a step.
const MAX_TIMEOUT: Duration = Duration::from_secs(3600);
/// Most bytes kept of a step's stdout or stderr.
const MAX_OUTPUT: u64 = 64 << 20;
/// Largest report of the init.
const MAX_REPORT: u64 = 4096;

/// How a step's init says the step ended (one JSON document on descriptor 3).
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

fn invalid(m: impl Into<String>) -> OpError {
    OpError::new(ErrorCode::InvalidArgument, m)
}

/// Checks a call and decodes its files.
fn check(spec: &CallSpec) -> Result<Vec<File>, OpError> {
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
        let rel = warren_fs::check_relative(std::path::Path::new(&f.path))
            .map_err(|e| invalid(e.to_string()))?;
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
            path: rel.display().to_string(),
            data,
            executable: f.executable,
        });
    }
    Ok(out)
}

/// Runs a call: [`Op::Call`](warren_types::guest::Op::Call).
pub async fn run(g: &Guest, spec: CallSpec) -> Result<CallResult, OpError> {
    let Some(grader) = g.grader.as_ref() else {
        return Err(OpError::new(
            ErrorCode::Unavailable,
            "function calls need the grader role, which this guest (serve mode) has not",
        ));
    };
    let files = check(&spec)?;
    let view = grader
        .call_view(files, spec.tmp_size)
        .await
        .map_err(|e| OpError::new(ErrorCode::Internal, format!("making the call's view: {e}")))?;
    let mut out = CallResult::default();
    let mut go_on = true;
    for step in &spec.steps {
        if !go_on {
            out.steps.push(StepResult::default());
            continue;
        }
        let r = match run_step(g, grader, view, step, &spec).await {
            Ok(r) => r,
            Err(e) => {
                grader.call_drop(view);
                return Err(OpError::new(
                    ErrorCode::Internal,
                    format!("starting a step: {e}"),
                ));
            }
        };
        go_on = !step.required || r.exit_code == Some(0);
        out.steps.push(r);
    }
    if !spec.fetch.is_empty() {
        out.files = grader
            .call_fetch(view, spec.fetch.clone(), spec.max_fetch)
            .await;
    }
    grader.call_drop(view);
    Ok(out)
}

async fn run_step(
    g: &Guest,
    grader: &crate::grader::Grader,
    view: u64,
    step: &CallStep,
    spec: &CallSpec,
) -> io::Result<StepResult> {
    let b64 = base64::engine::general_purpose::STANDARD;
    let stdin = b64
        .decode(&step.stdin)
        .map_err(|e| io::Error::other(format!("stdin is not base64: {e}")))?;
    let (status_r, status_w) = rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC)?;
    let user = grader.user();
    let mut cmd = Command::new("/proc/self/exe");
    cmd.arg0("warren-call")
        .arg("call-init")
        .args(&step.argv)
        .env_clear()
        .env(
            "PATH",
            "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        )
        .env("HOME", &user.home)
        .env("USER", &user.name)
        .env("LANG", "C.UTF-8")
        .env("TMPDIR", "/tmp")
        .envs(spec.env.iter().map(|(k, v)| (k, v)))
        .current_dir(CALL_DIR)
        .uid(user.uid)
        .gid(user.gid)
        .stdin(if stdin.is_empty() {
            Stdio::null()
        } else {
            Stdio::piped()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    warren_sys::process::on_exec_status_and_limits(
        &mut cmd,
        status_w.as_fd(),
        warren_sys::process::StepLimits {
            cpu_seconds: step.timeout_ms.div_ceil(1000) + 1,
            file_size: spec.file_size,
        },
    );
    g.confinement.apply_on_exec(&mut cmd);
    let started = Instant::now();
    let mut child = grader.call_spawn(view, cmd).await?;
    drop(status_w);
    let pid = child.id() as i32;
    let receiver = |fd: Option<OwnedFd>| fd.map(pipe::Receiver::from_owned_fd).transpose();
    let out_rx = receiver(child.stdout.take().map(OwnedFd::from))?;
    let err_rx = receiver(child.stderr.take().map(OwnedFd::from))?;
    let status_rx = pipe::Receiver::from_owned_fd(status_r)?;
    if let Some(sin) = child.stdin.take() {
        let mut tx = pipe::Sender::from_owned_fd(OwnedFd::from(sin))?;
        // Written while the step runs; a program that does not read ends it with EPIPE.
        tokio::spawn(async move {
            let _ = tx.write_all(&stdin).await;
        });
    }
    drop(child); // the guest's reaper collects it
    let kill = || {
        let _ = warren_sys::process::kill(pid, 9);
    };
    let max = step.max_output;
    let over = AtomicBool::new(false);
    let collect = async {
        let read_out = capped(out_rx, max, || {
            over.store(true, Ordering::Relaxed);
            kill();
        });
        let read_err = capped(err_rx, max, || {
            over.store(true, Ordering::Relaxed);
            kill();
        });
        let read_status = async {
            let mut buf = Vec::new();
            let _ = status_rx.take(MAX_REPORT).read_to_end(&mut buf).await;
            buf
        };
        tokio::join!(read_out, read_err, read_status)
    };
    tokio::pin!(collect);
    let timeout = Duration::from_millis(step.timeout_ms);
    let mut timed_out = false;
    let (stdout, stderr, report) = tokio::select! {
        r = &mut collect => r,
        () = tokio::time::sleep(timeout) => {
            timed_out = true;
            kill();
            // Killed: its namespace goes with it and the pipes close.
            tokio::time::timeout(Duration::from_secs(5), &mut collect)
                .await
                .unwrap_or_default()
        }
    };
    let wall = started.elapsed();
    let report: Report = serde_json::from_slice(&report).unwrap_or_default();
    // A step that ended without a report was killed: by its limits here, or by the kernel
    // (the memory limit).
    let killed =
        report.exit_code.is_none() && report.signal.is_none() && report.not_started.is_none();
    Ok(StepResult {
        ran: true,
        exit_code: report.exit_code,
        signal: report.signal.or(if killed { Some(9) } else { None }),
        timed_out,
        output_limit: over.load(Ordering::Relaxed) && !timed_out,
        not_started: report.not_started,
        stdout: b64.encode(&stdout),
        stderr: b64.encode(&stderr),
        wall_us: wall.as_micros() as u64,
        cpu_us: report.cpu_us,
        max_rss: report.max_rss,
    })
}

/// Reads a pipe to its end, keeping at most `max` bytes; past that calls `over` once and
/// keeps reading (discarding) until the writers are gone.
async fn capped(rx: Option<pipe::Receiver>, max: u64, over: impl Fn()) -> Vec<u8> {
    let Some(mut rx) = rx else {
        return Vec::new();
    };
    let mut kept = Vec::new();
    let mut buf = vec![0u8; 64 << 10];
    let mut told = false;
    loop {
        match rx.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                let room = (max as usize).saturating_sub(kept.len());
                kept.extend_from_slice(&buf[..n.min(room)]);
                if n > room && !told {
                    told = true;
                    over();
                }
            }
        }
    }
    kept
}

/// `warren-guest call-init PROGRAM ARGS...`: the first process of a step's PID namespace.
/// Starts the program (found on `PATH`), waits for it, and writes a [`Report`] on descriptor
/// 3; the program does not inherit descriptor 3. Never returns.
pub fn init(argv: &[String]) -> ! {
    use std::io::Write;
    // Not dumpable: the program runs as this process's uid, and must not trace it, read or
    // write its memory, or take its descriptors (the status pipe, the output pipes) through
    // /proc. (The program's own exec makes it dumpable again; this process does not exec.)
    if warren_sys::creds::set_not_dumpable().is_err() {
        std::process::exit(125);
    }
    let Ok(mut status) = warren_sys::process::take_status_fd() else {
        std::process::exit(125);
    };
    let mut report = |r: &Report| {
        let _ = status.write_all(&serde_json::to_vec(r).unwrap_or_default());
    };
    let Some(program) = argv.first() else {
        report(&Report {
            not_started: Some("no program".into()),
            ..Report::default()
        });
        std::process::exit(0);
    };
    let mut cmd = Command::new(program);
    cmd.args(&argv[1..]);
    let r = match cmd.spawn() {
        Err(e) => Report {
            not_started: Some(match e.kind() {
                io::ErrorKind::NotFound => format!("{program}: command not found"),
                io::ErrorKind::PermissionDenied => format!("{program}: permission denied"),
                _ => format!("{program}: {e}"),
            }),
            ..Report::default()
        },
        Ok(mut child) => {
            use std::os::unix::process::ExitStatusExt;
            let st = child.wait();
            let (cpu_us, max_rss) = warren_sys::process::children_usage();
            let (exit_code, signal) = match st {
                Ok(s) => (s.code(), s.signal()),
                Err(_) => (None, None),
            };
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
    std::process::exit(0);
}
