//! Running a command in a sandbox: at once ([`Sandbox::exec`]) or as a live stream of events
//! ([`Sandbox::exec_stream`]), and helpers to build requests and decode output.

use std::pin::Pin;
use std::task::{Context, Poll};

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as B64;
use bytes::Bytes;
use futures_util::{Stream, StreamExt};
use reqwest::Method;
use warren_types::api::{Encoding, ExecEvent, ExecRequest, ExecResult};

use crate::error::{Error, Result};
use crate::{Sandbox, ndjson};

/// A request that runs `cmd` with `/bin/sh -c`.
pub fn shell(cmd: impl Into<String>) -> ExecRequest {
    ExecRequest {
        cmd: Some(cmd.into()),
        ..Default::default()
    }
}

/// A request that runs a program with these arguments, without a shell (found on `PATH`).
pub fn argv<I, S>(args: I) -> ExecRequest
where
    I: IntoIterator<Item = S>,
    S: Into<String>,
{
    ExecRequest {
        argv: Some(args.into_iter().map(Into::into).collect()),
        ..Default::default()
    }
}

/// Sets a request's standard input: as text when `data` is UTF-8, else as base64.
pub fn set_stdin(req: &mut ExecRequest, data: Vec<u8>) {
    match String::from_utf8(data) {
        Ok(text) => {
            req.stdin = Some(text);
            req.stdin_b64 = None;
        }
        Err(e) => {
            req.stdin = None;
            req.stdin_b64 = Some(B64.encode(e.as_bytes()));
        }
    }
}

/// Decodes the base64 `data` of an [`ExecEvent::Stdout`] or [`ExecEvent::Stderr`].
pub fn decode_data(data: &str) -> Result<Vec<u8>> {
    B64.decode(data).map_err(|e| {
        Error::Decode(format!(
            "could not understand Warren's reply: output data is not base64 ({e})"
        ))
    })
}

/// The output of an [`ExecResult`] as bytes, whichever way it was carried.
pub trait ExecResultExt {
    /// Standard output as bytes (decoding it when `stdout_encoding` is `base64`).
    fn stdout_data(&self) -> Result<Vec<u8>>;
    /// Standard error as bytes (decoding it when `stderr_encoding` is `base64`).
    fn stderr_data(&self) -> Result<Vec<u8>>;
    /// `Some(Fault::Agent)` when the command failed (a non-zero exit, a signal, its timeout):
    /// the agent's own doing, to be scored; `None` when it succeeded. Failures of the platform
    /// are errors ([`crate::Error::fault`]), never results.
    fn fault(&self) -> Option<warren_types::Fault>;
}

impl ExecResultExt for ExecResult {
    fn stdout_data(&self) -> Result<Vec<u8>> {
        decode_output(&self.stdout, self.stdout_encoding)
    }

    fn stderr_data(&self) -> Result<Vec<u8>> {
        decode_output(&self.stderr, self.stderr_encoding)
    }

    fn fault(&self) -> Option<warren_types::Fault> {
        let s = &self.status;
        (s.exit_code != 0 || s.signal.is_some() || s.timed_out)
            .then_some(warren_types::Fault::Agent)
    }
}

fn decode_output(text: &str, encoding: Encoding) -> Result<Vec<u8>> {
    match encoding {
        Encoding::Utf8 => Ok(text.as_bytes().to_vec()),
        Encoding::Base64 => decode_data(text),
    }
}

/// The events of a streaming exec or of a process's output, as they happen.
///
/// Yields the server's [`ExecEvent`]s in order and ends after the last one:
/// [`ExecEvent::Exit`], or [`ExecEvent::Error`] when the exec failed on the server's side.
/// An `Err` item means the events could not be read (the connection was cut, a line was not
/// an event); nothing follows it.
pub struct ExecEvents {
    inner: Pin<Box<dyn Stream<Item = Result<ExecEvent>> + Send>>,
}

impl std::fmt::Debug for ExecEvents {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ExecEvents")
    }
}

impl Stream for ExecEvents {
    type Item = Result<ExecEvent>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.inner.as_mut().poll_next(cx)
    }
}

impl ExecEvents {
    /// The events of an NDJSON body.
    pub(crate) fn from_body<S>(body: S) -> ExecEvents
    where
        S: Stream<Item = reqwest::Result<Bytes>> + Send + 'static,
    {
        let events = Box::pin(ndjson::values::<ExecEvent, _>(Box::pin(body)));
        let stream =
            futures_util::stream::unfold((events, false), |(mut events, ended)| async move {
                if ended {
                    return None;
                }
                let item = match events.next().await {
                    Some(Ok(ev)) => {
                        let last = matches!(ev, ExecEvent::Exit(_) | ExecEvent::Error(_));
                        return Some((Ok(ev), (events, last)));
                    }
                    Some(Err(e)) => Err(e),
                    None => Err(Error::Decode(
                        "the event stream ended before the command's exit status arrived: the \
                     connection was cut; the command may still run (see its process id in the \
                     start event)"
                            .into(),
                    )),
                };
                Some((item, (events, true)))
            });
        ExecEvents {
            inner: Box::pin(stream),
        }
    }
}

impl Sandbox {
    /// Runs a command and waits for it to end (`POST /v1/sandboxes/{id}/exec`).
    ///
    /// A command that fails is not an error: look at `status.exit_code`. Output beyond
    /// `max_output` (64 MiB a stream by default) is counted but not kept.
    pub async fn exec(&self, req: &ExecRequest) -> Result<ExecResult> {
        let body = self.exec_body(req, false);
        let rb = self
            .client()
            .request(Method::POST, self.endpoint("/exec", &[])?)
            .json(&body);
        self.client().json(rb).await
    }

    /// Runs a command and streams its output as it comes (`"stream": true`).
    ///
    /// ```no_run
    /// # async fn demo(sb: warren_sdk::Sandbox) -> warren_sdk::Result<()> {
    /// use futures_util::StreamExt;
    /// use warren_sdk::ExecEvent;
    ///
    /// let mut events = sb.exec_stream(&warren_sdk::argv(["make", "test"])).await?;
    /// while let Some(ev) = events.next().await {
    ///     match ev? {
    ///         ExecEvent::Stdout { data } => print!("{}", String::from_utf8_lossy(&warren_sdk::decode_data(&data)?)),
    ///         ExecEvent::Exit(status) => println!("exit {}", status.exit_code),
    ///         _ => {}
    ///     }
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn exec_stream(&self, req: &ExecRequest) -> Result<ExecEvents> {
        let body = self.exec_body(req, true);
        let rb = self
            .client()
            .request(Method::POST, self.endpoint("/exec", &[])?)
            .json(&body);
        let resp = self.client().send(rb).await?;
        Ok(ExecEvents::from_body(resp.bytes_stream()))
    }

    /// The request as sent: the handle's user when the request names none.
    pub(crate) fn exec_body(&self, req: &ExecRequest, stream: bool) -> ExecRequest {
        let mut body = req.clone();
        body.stream = stream;
        if body.user.is_none() {
            body.user = self.user().map(str::to_string);
        }
        body
    }
}

#[cfg(test)]
mod tests {
    use warren_types::api::ExitStatus;
    use warren_types::error::ErrorCode;

    use super::*;

    fn events_of(chunks: &[&'static [u8]]) -> ExecEvents {
        let chunks: Vec<reqwest::Result<Bytes>> =
            chunks.iter().map(|c| Ok(Bytes::from_static(c))).collect();
        ExecEvents::from_body(futures_util::stream::iter(chunks))
    }

    #[tokio::test]
    async fn a_stream_yields_events_up_to_the_exit() {
        let evs: Vec<_> = events_of(&[
            b"{\"type\":\"start\",\"process_id\":1,\"pid\":7}\n{\"type\":\"stdout\",\"data\":\"aGk=\"}\n",
            b"{\"type\":\"stderr\",\"data\":\"/w==\"}\n{\"type\":\"exit\",\"exit_code\":3,",
            b"\"stdout_bytes\":2,\"stderr_bytes\":1,\"duration_ms\":5}\n",
            b"{\"type\":\"stdout\",\"data\":\"aWdub3JlZA==\"}\n",
        ])
        .collect()
        .await;
        let evs: Vec<ExecEvent> = evs.into_iter().map(|e| e.unwrap()).collect();
        assert_eq!(evs.len(), 4, "{evs:?}");
        assert_eq!(
            evs[0],
            ExecEvent::Start {
                process_id: 1,
                pid: 7,
                replayed: false,
                replay_ended: false,
            }
        );
        match &evs[1] {
            ExecEvent::Stdout { data } => assert_eq!(decode_data(data).unwrap(), b"hi"),
            other => panic!("{other:?}"),
        }
        match &evs[2] {
            ExecEvent::Stderr { data } => assert_eq!(decode_data(data).unwrap(), [0xff]),
            other => panic!("{other:?}"),
        }
        match &evs[3] {
            ExecEvent::Exit(ExitStatus { exit_code, .. }) => assert_eq!(*exit_code, 3),
            other => panic!("{other:?}"),
        }
    }

    #[tokio::test]
    async fn a_server_side_failure_is_the_last_event() {
        let evs: Vec<_> = events_of(&[
            b"{\"type\":\"error\",\"code\":\"sandbox_gone\",\"message\":\"it stopped\"}\n",
        ])
        .collect()
        .await;
        assert_eq!(evs.len(), 1);
        match evs[0].as_ref().unwrap() {
            ExecEvent::Error(e) => {
                assert_eq!(
                    (e.code, e.message.as_str()),
                    (ErrorCode::SandboxGone, "it stopped")
                );
                // A server that sent no fault: the code's.
                assert_eq!(e.fault(), warren_types::Fault::Request);
            }
            other => panic!("{other:?}"),
        }
    }

    #[tokio::test]
    async fn a_cut_stream_ends_with_an_error() {
        let evs: Vec<_> = events_of(&[b"{\"type\":\"start\",\"process_id\":1,\"pid\":7}\n"])
            .collect()
            .await;
        assert_eq!(evs.len(), 2);
        assert!(evs[0].is_ok());
        let err = evs[1].as_ref().unwrap_err();
        assert!(matches!(err, Error::Decode(_)));
        assert!(err.to_string().contains("connection was cut"), "{err}");
    }

    #[test]
    fn output_is_decoded_by_its_encoding() {
        let res = ExecResult {
            stdout: "héllo".into(),
            stderr: "AP8=".into(),
            stderr_encoding: Encoding::Base64,
            ..Default::default()
        };
        assert_eq!(res.stdout_data().unwrap(), "héllo".as_bytes());
        assert_eq!(res.stderr_data().unwrap(), vec![0x00, 0xff]);
        let bad = ExecResult {
            stdout: "!!".into(),
            stdout_encoding: Encoding::Base64,
            ..Default::default()
        };
        assert!(matches!(bad.stdout_data(), Err(Error::Decode(_))));
    }

    #[test]
    fn stdin_is_text_when_it_can_be() {
        let mut req = argv(["cat"]);
        set_stdin(&mut req, b"hello".to_vec());
        assert_eq!(req.stdin.as_deref(), Some("hello"));
        set_stdin(&mut req, vec![0xff, 0x00]);
        assert_eq!(req.stdin, None);
        assert_eq!(req.stdin_b64.as_deref(), Some("/wA="));
    }

    #[test]
    fn request_helpers_fill_one_of_cmd_and_argv() {
        assert_eq!(shell("echo hi").cmd.as_deref(), Some("echo hi"));
        assert_eq!(shell("echo hi").argv, None);
        assert_eq!(
            argv(["ls", "-l"]).argv,
            Some(vec!["ls".into(), "-l".into()])
        );
    }

    #[test]
    fn the_handles_user_fills_in_a_missing_one() {
        let client = crate::Client::new("http://127.0.0.1:1", None).unwrap();
        let sb = client
            .sandbox("abcdef0123456789wxyz")
            .unwrap()
            .as_user("root");
        let body = sb.exec_body(&shell("id"), true);
        assert!(body.stream);
        assert_eq!(body.user.as_deref(), Some("root"));
        let mut own = shell("id");
        own.user = Some("1001".into());
        assert_eq!(sb.exec_body(&own, false).user.as_deref(), Some("1001"));
    }
}
