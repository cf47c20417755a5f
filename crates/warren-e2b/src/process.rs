//! envd's `process.Process` service onto Warren's processes: `Start` (a streamed exec) and
//! `Connect` (a process's output) stream a process's events (`start` with its pid first, then
//! its output, then `end`); `List`, `SendSignal`, `SendInput`, `CloseStdin` and `Update` (a
//! terminal's size) are unary; `StreamInput` is client-streaming, each input passed on as it
//! arrives. A process is named by its pid in the sandbox, as E2B's are; Warren's process id
//! is found from it. `stdin: true` is Warren's `stdin_open`, `pty` Warren's `pty` (whose
//! output E2B calls `pty`, not `stdout`).
//!
//! Not yet: process tags (answered `unimplemented`).

use std::collections::BTreeMap;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use futures_util::StreamExt;
use serde::Deserialize;
use serde_json::{Value, json};
use warren_sdk::{ExecEvent, ExecRequest, Sandbox};

use crate::connect::{self, Code, Error};

/// How long a process's stream may be silent before a keepalive event, at most (the client's
/// `Keepalive-Ping-Interval` when shorter).
const KEEPALIVE: Duration = Duration::from_secs(50);

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct ProcessConfig {
    cmd: String,
    #[serde(default)]
    args: Vec<String>,
    #[serde(default)]
    envs: BTreeMap<String, String>,
    cwd: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct StartRequest {
    process: ProcessConfig,
    pty: Option<Pty>,
    tag: Option<String>,
    stdin: Option<bool>,
}

#[derive(Debug, Deserialize)]
struct Pty {
    size: Option<PtySize>,
}

#[derive(Debug, Deserialize)]
struct PtySize {
    #[serde(default)]
    cols: u32,
    #[serde(default)]
    rows: u32,
}

impl Pty {
    /// Warren's terminal size (E2B's default 80 × 24 where none is given).
    fn size(&self) -> Result<warren_sdk::PtySize, Error> {
        let (cols, rows) = self.size.as_ref().map_or((80, 24), |s| (s.cols, s.rows));
        let size = warren_sdk::PtySize {
            cols: u16::try_from(cols).unwrap_or(0),
            rows: u16::try_from(rows).unwrap_or(0),
        };
        size.check()
            .map_err(|m| Error::new(Code::InvalidArgument, format!("pty.size: {m}")))?;
        Ok(size)
    }
}

/// `SendInput` and `StreamInput`'s data: stdin or terminal bytes (base64, as protobuf's JSON
/// writes bytes).
#[derive(Debug, Deserialize)]
struct Input {
    stdin: Option<String>,
    pty: Option<String>,
}

impl Input {
    fn bytes(&self) -> Result<Vec<u8>, Error> {
        match (&self.stdin, &self.pty) {
            (Some(b), None) | (None, Some(b)) => decode_bytes(b),
            (None, None) => Ok(Vec::new()),
            (Some(_), Some(_)) => Err(Error::new(
                Code::InvalidArgument,
                "input has both stdin and pty: give one",
            )),
        }
    }
}

#[derive(Debug, Deserialize)]
struct SendInputRequest {
    process: Selector,
    input: Option<Input>,
}

#[derive(Debug, Deserialize)]
struct UpdateRequest {
    process: Selector,
    pty: Option<Pty>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct StreamInputMessage {
    start: Option<Selected>,
    data: Option<StreamData>,
    keepalive: Option<Value>,
}

#[derive(Debug, Deserialize)]
struct StreamData {
    input: Option<Input>,
}

/// Bytes as protobuf's JSON writes them: base64, standard or URL-safe, padded or not.
fn decode_bytes(b64: &str) -> Result<Vec<u8>, Error> {
    use base64::Engine;
    use base64::engine::general_purpose::{STANDARD, STANDARD_NO_PAD, URL_SAFE, URL_SAFE_NO_PAD};
    [STANDARD, STANDARD_NO_PAD, URL_SAFE, URL_SAFE_NO_PAD]
        .iter()
        .find_map(|e| e.decode(b64).ok())
        .ok_or_else(|| Error::new(Code::InvalidArgument, "input is not base64"))
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Selector {
    pid: Option<u32>,
    tag: Option<String>,
}

#[derive(Debug, Deserialize)]
struct Selected {
    process: Selector,
}

#[derive(Debug, Deserialize)]
struct SignalRequest {
    process: Selector,
    signal: Value,
}

/// A Warren error as Connect's.
pub(crate) fn warren_error(e: warren_sdk::Error) -> Error {
    let code = match &e {
        warren_sdk::Error::Api { status, .. } => match *status {
            400 | 413 | 422 => Code::InvalidArgument,
            401 => Code::Unauthenticated,
            403 => Code::PermissionDenied,
            404 => Code::NotFound,
            409 => Code::FailedPrecondition,
            429 => Code::ResourceExhausted,
            503 => Code::Unavailable,
            _ => Code::Internal,
        },
        warren_sdk::Error::Invalid(_) => Code::InvalidArgument,
        warren_sdk::Error::Connect { .. } | warren_sdk::Error::Transport(_) => Code::Unavailable,
        _ => Code::Internal,
    };
    Error::new(code, e.to_string())
}

/// A unary answer: the message, or the error with its status.
pub(crate) fn unary(r: Result<Value, Error>) -> Response {
    match r {
        Ok(v) => (
            StatusCode::OK,
            [(header::CONTENT_TYPE, connect::UNARY_JSON)],
            v.to_string(),
        )
            .into_response(),
        Err(e) => (
            e.code.http_status(),
            [(header::CONTENT_TYPE, connect::UNARY_JSON)],
            e.unary_body(),
        )
            .into_response(),
    }
}

/// A streaming answer whose call failed before it began: one end-of-stream envelope.
pub(crate) fn stream_error(e: Error) -> Response {
    stream_response(futures_util::stream::once(async move {
        connect::end_stream(Some(&e))
    }))
}

fn stream_response<S>(s: S) -> Response
where
    S: futures_util::Stream<Item = Bytes> + Send + 'static,
{
    (
        StatusCode::OK,
        [(header::CONTENT_TYPE, connect::STREAM_JSON)],
        Body::from_stream(s.map(Ok::<_, std::convert::Infallible>)),
    )
        .into_response()
}

fn unimplemented(what: &str) -> Error {
    Error::new(
        Code::Unimplemented,
        format!("{what} is not supported by Warren's E2B gateway yet (see docs/e2b.md)"),
    )
}

/// `Connect-Timeout-Ms` as seconds for the process's lifetime; none: no limit.
fn lifetime(headers: &HeaderMap) -> Result<Option<f64>, Error> {
    let v = headers
        .get("connect-timeout-ms")
        .and_then(|v| v.to_str().ok());
    Ok(connect::timeout_ms(v)?.map(|ms| ms as f64 / 1000.0))
}

/// The keepalive interval the client asked for (`Keepalive-Ping-Interval`, seconds).
pub(crate) fn keepalive(headers: &HeaderMap) -> Duration {
    headers
        .get("keepalive-ping-interval")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok())
        .filter(|s| *s > 0)
        .map(|s| Duration::from_secs(s).min(KEEPALIVE))
        .unwrap_or(KEEPALIVE)
}

/// `Start`: starts the command as a Warren background process and streams it.
pub(crate) async fn start(sb: Sandbox, headers: HeaderMap, body: Bytes) -> Response {
    let req: StartRequest = match connect::stream_request(&body) {
        Ok(r) => r,
        Err(e) => return stream_error(e),
    };
    let pty = match req.pty.as_ref().map(Pty::size).transpose() {
        Ok(p) => p,
        Err(e) => return stream_error(e),
    };
    if req.tag.is_some() {
        return stream_error(unimplemented("a process tag"));
    }
    if req.process.cmd.is_empty() {
        return stream_error(Error::new(Code::InvalidArgument, "process.cmd is empty"));
    }
    let timeout = match lifetime(&headers) {
        Ok(t) => t,
        Err(e) => return stream_error(e),
    };
    let on_pty = pty.is_some();
    let mut argv = vec![req.process.cmd];
    argv.extend(req.process.args);
    let exec = ExecRequest {
        argv: Some(argv),
        env: req.process.envs,
        cwd: req.process.cwd,
        timeout: Some(timeout.unwrap_or(0.0)),
        stdin_open: req.stdin == Some(true) && pty.is_none(),
        pty,
        ..Default::default()
    };
    // One request: Warren's streamed exec starts the command and streams it; the process
    // outlives a client that leaves (it stays in the sandbox's table, found again by pid).
    let mut events = match sb
        .exec_stream(&ExecRequest {
            stream: true,
            ..exec
        })
        .await
    {
        Ok(e) => e,
        Err(e) => return stream_error(warren_error(e)),
    };
    let (process_id, pid) = match events.next().await {
        Some(Ok(ExecEvent::Start {
            process_id, pid, ..
        })) => (process_id, pid),
        Some(Ok(ExecEvent::Error(e))) => {
            return stream_error(Error::new(Code::Internal, e.message));
        }
        Some(Ok(other)) => {
            return stream_error(Error::new(
                Code::Internal,
                format!("Warren's exec began with {other:?}, not its start"),
            ));
        }
        Some(Err(e)) => return stream_error(warren_error(e)),
        None => {
            return stream_error(Error::new(
                Code::Unavailable,
                "Warren's exec ended before it started",
            ));
        }
    };
    follow(sb, process_id, pid, on_pty, events, keepalive(&headers))
}

/// `Connect`: streams a running process found by pid.
pub(crate) async fn attach(sb: Sandbox, headers: HeaderMap, body: Bytes) -> Response {
    let req: Selected = match connect::stream_request(&body) {
        Ok(r) => r,
        Err(e) => return stream_error(e),
    };
    match find(&sb, &req.process).await {
        // The output is opened before the answer begins: once attached, the process stays
        // readable even if its other stream ends and forgets it.
        Ok(p) => match sb.process_output(p.process_id).await {
            Ok(events) => follow(sb, p.process_id, p.pid, p.pty, events, keepalive(&headers)),
            Err(e) => stream_error(warren_error(e)),
        },
        Err(e) => stream_error(e),
    }
}

/// The running process `sel` names.
async fn find(sb: &Sandbox, sel: &Selector) -> Result<warren_sdk::ProcessInfo, Error> {
    if sel.tag.is_some() {
        return Err(unimplemented("a process tag"));
    }
    let Some(pid) = sel.pid else {
        return Err(Error::new(Code::InvalidArgument, "name the process by pid"));
    };
    let list = sb.processes().await.map_err(warren_error)?;
    list.into_iter()
        .find(|p| p.running && p.pid as i64 == pid as i64)
        .ok_or_else(|| Error::new(Code::NotFound, format!("process with pid {pid} not found")))
}

/// The stream of a process: `start`, its output (`events`), `end`, the end of the stream. A
/// process that ended is forgotten once its end is sent.
fn follow(
    sb: Sandbox,
    process_id: u64,
    pid: i32,
    pty: bool,
    mut events: warren_sdk::ExecEvents,
    keepalive: Duration,
) -> Response {
    // A terminal's output is one stream, which E2B names `pty`.
    let out = if pty { "pty" } else { "stdout" };
    let (tx, rx) = tokio::sync::mpsc::channel::<Bytes>(16);
    tokio::spawn(async move {
        let send = |v: Value| {
            let tx = tx.clone();
            async move { tx.send(connect::message(&v)).await.is_ok() }
        };
        if !send(json!({"event": {"start": {"pid": pid}}})).await {
            return;
        }
        let end = loop {
            // A client that left ends this at once, not at the next event or keepalive.
            let next = tokio::select! {
                n = tokio::time::timeout(keepalive, events.next()) => n,
                () = tx.closed() => return,
            };
            let next = match next {
                Err(_) => {
                    if !send(json!({"event": {"keepalive": {}}})).await {
                        return;
                    }
                    continue;
                }
                Ok(n) => n,
            };
            match next {
                Some(Ok(ExecEvent::Stdout { data })) => {
                    if !send(json!({"event": {"data": {out: data}}})).await {
                        return;
                    }
                }
                Some(Ok(ExecEvent::Stderr { data })) => {
                    if !send(json!({"event": {"data": {"stderr": data}}})).await {
                        return;
                    }
                }
                Some(Ok(ExecEvent::Exit(st))) => {
                    if st.timed_out {
                        break Some(Error::new(
                            Code::DeadlineExceeded,
                            "the command ran past its timeout and was killed",
                        ));
                    }
                    let end = match st.signal {
                        Some(sig) => json!({
                            "exitCode": -1,
                            "exited": false,
                            "status": format!("signal: {}", signal_name(sig)),
                            "error": format!("signal: {}", signal_name(sig)),
                        }),
                        None => json!({
                            "exitCode": st.exit_code,
                            "exited": true,
                            "status": format!("exit status {}", st.exit_code),
                        }),
                    };
                    if !send(json!({"event": {"end": end}})).await {
                        return;
                    }
                    break None;
                }
                Some(Ok(ExecEvent::Error(e))) => {
                    break Some(Error::new(Code::Internal, e.message));
                }
                Some(Ok(_)) => {}
                Some(Err(e)) => break Some(warren_error(e)),
                None => {
                    break Some(Error::new(
                        Code::Unavailable,
                        "the process's output ended before its exit status",
                    ));
                }
            }
        };
        let _ = tx.send(connect::end_stream(end.as_ref())).await;
        // The answer ends here (the client waits for its end), before the forgetting.
        drop(tx);
        let _ = sb.forget_process(process_id).await;
    });
    stream_body(rx)
}

/// A streaming answer fed by `rx`, ending when its sender does.
pub(crate) fn stream_body(rx: tokio::sync::mpsc::Receiver<Bytes>) -> Response {
    stream_response(futures_util::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|b| (b, rx))
    }))
}

fn signal_name(sig: i32) -> String {
    match sig {
        9 => "killed".into(),
        15 => "terminated".into(),
        2 => "interrupt".into(),
        1 => "hangup".into(),
        6 => "aborted".into(),
        11 => "segmentation fault".into(),
        n => format!("signal {n}"),
    }
}

/// `List`: the running processes.
pub(crate) async fn list(sb: Sandbox, body: Bytes) -> Response {
    if let Err(e) = connect::json::<Value>(if body.is_empty() { b"{}" } else { &body }) {
        return unary(Err(e));
    }
    unary(
        async {
            let list = sb.processes().await.map_err(warren_error)?;
            let procs: Vec<Value> = list
                .iter()
                .filter(|p| p.running)
                .map(|p| {
                    json!({
                        "config": {
                            "cmd": p.argv.first().cloned().unwrap_or_default(),
                            "args": p.argv.iter().skip(1).collect::<Vec<_>>(),
                            "envs": {},
                        },
                        "pid": p.pid,
                    })
                })
                .collect();
            Ok(json!({ "processes": procs }))
        }
        .await,
    )
}

/// `SendSignal`: SIGKILL or SIGTERM to the process's group.
pub(crate) async fn signal(sb: Sandbox, body: Bytes) -> Response {
    unary(
        async {
            let req: SignalRequest = connect::json(&body)?;
            let sig = match &req.signal {
                Value::String(s) if s == "SIGNAL_SIGKILL" => "KILL",
                Value::String(s) if s == "SIGNAL_SIGTERM" => "TERM",
                Value::Number(n) if n.as_u64() == Some(9) => "KILL",
                Value::Number(n) if n.as_u64() == Some(15) => "TERM",
                other => {
                    return Err(Error::new(
                        Code::InvalidArgument,
                        format!("signal {other} is not SIGNAL_SIGKILL or SIGNAL_SIGTERM"),
                    ));
                }
            };
            let p = find(&sb, &req.process).await?;
            sb.signal_process(p.process_id, sig)
                .await
                .map_err(warren_error)?;
            Ok(json!({}))
        }
        .await,
    )
}

/// `SendInput`: bytes to a process's stdin or terminal.
pub(crate) async fn send_input(sb: Sandbox, body: Bytes) -> Response {
    unary(
        async {
            let req: SendInputRequest = connect::json(&body)?;
            let data = req.input.as_ref().map(Input::bytes).transpose()?;
            let p = find(&sb, &req.process).await?;
            sb.send_stdin(p.process_id, &data.unwrap_or_default())
                .await
                .map_err(warren_error)?;
            Ok(json!({}))
        }
        .await,
    )
}

/// `CloseStdin`: the end of a process's input.
pub(crate) async fn close_stdin(sb: Sandbox, body: Bytes) -> Response {
    unary(
        async {
            let req: Selected = connect::json(&body)?;
            let p = find(&sb, &req.process).await?;
            sb.close_stdin(p.process_id).await.map_err(warren_error)?;
            Ok(json!({}))
        }
        .await,
    )
}

/// `Update`: a new size for a process's terminal.
pub(crate) async fn update(sb: Sandbox, body: Bytes) -> Response {
    unary(
        async {
            let req: UpdateRequest = connect::json(&body)?;
            let Some(pty) = req.pty else {
                return Ok(json!({})); // nothing to change
            };
            let size = pty.size()?;
            let p = find(&sb, &req.process).await?;
            sb.resize_pty(p.process_id, size.cols, size.rows)
                .await
                .map_err(warren_error)?;
            Ok(json!({}))
        }
        .await,
    )
}

/// `StreamInput`: a `start` naming the process, then `data` messages (and keepalives), each
/// input written as it arrives; the answer, once the client ends its stream, is one empty
/// message. The body is read as it comes, never whole: each envelope is bounded.
pub(crate) async fn stream_input(sb: Sandbox, body: axum::body::Body) -> Response {
    let r = async {
        let mut frames = connect::EnvelopeReader::new(body.into_data_stream());
        let mut process = None;
        while let Some(payload) = frames.next().await? {
            let msg: StreamInputMessage = connect::json(&payload)?;
            if let Some(start) = msg.start {
                if process.is_some() {
                    return Err(Error::new(
                        Code::InvalidArgument,
                        "a second start in one input stream",
                    ));
                }
                process = Some(find(&sb, &start.process).await?.process_id);
            } else if let Some(data) = msg.data {
                let Some(id) = process else {
                    return Err(Error::new(
                        Code::InvalidArgument,
                        "input before the stream's start (which names the process)",
                    ));
                };
                let bytes = data.input.as_ref().map(Input::bytes).transpose()?;
                let bytes = bytes.unwrap_or_default();
                if !bytes.is_empty() {
                    sb.send_stdin(id, &bytes).await.map_err(warren_error)?;
                }
            } else if msg.keepalive.is_none() {
                return Err(Error::new(
                    Code::InvalidArgument,
                    "an input stream message is start, data or keepalive",
                ));
            }
        }
        if process.is_none() {
            return Err(Error::new(
                Code::InvalidArgument,
                "the input stream ended without its start",
            ));
        }
        Ok(())
    }
    .await;
    match r {
        Ok(()) => stream_response(futures_util::stream::iter([
            connect::message(&json!({})),
            connect::end_stream(None),
        ])),
        Err(e) => stream_error(e),
    }
}
