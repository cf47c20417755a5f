//! Background processes: start a command without waiting, then look at it, wait for it,
//! signal it, or read its output (again) later.

use std::time::Duration;

use reqwest::Method;
use warren_types::api::{
    ExecRequest, ProcessInfo, ProcessList, PtySize, SignalRequest, StdinRequest,
};

use crate::error::{Error, Result};
use crate::{ExecEvents, Sandbox};

impl Sandbox {
    /// Starts a command in the background (`POST /v1/sandboxes/{id}/processes`) and returns
    /// at once. It has no timeout unless the request sets one.
    pub async fn start_process(&self, req: &ExecRequest) -> Result<ProcessInfo> {
        let body = self.exec_body(req, false);
        let rb = self
            .client()
            .request(Method::POST, self.endpoint("/processes", &[])?)
            .json(&body);
        self.client().json(rb).await
    }

    /// Running processes, and finished ones not yet forgotten, oldest first.
    pub async fn processes(&self) -> Result<Vec<ProcessInfo>> {
        let rb = self
            .client()
            .request(Method::GET, self.endpoint("/processes", &[])?);
        let list: ProcessList = self.client().json(rb).await?;
        Ok(list.processes)
    }

    /// One process, by the id [`start_process`](Self::start_process) returned.
    pub async fn process(&self, process_id: u64) -> Result<ProcessInfo> {
        let rb = self
            .client()
            .request(Method::GET, self.process_endpoint(process_id, "", &[])?);
        self.client().json(rb).await
    }

    /// Waits for a process to end, or at most `timeout`; look at `running` to tell which.
    pub async fn wait_process(
        &self,
        process_id: u64,
        timeout: Option<Duration>,
    ) -> Result<ProcessInfo> {
        let secs = timeout.map(|t| t.as_secs_f64().to_string());
        let query: Vec<(&str, &str)> = secs.iter().map(|s| ("timeout", s.as_str())).collect();
        let url = self.process_endpoint(process_id, "/wait", &query)?;
        let rb = self.client().request(Method::POST, url);
        self.client().json(rb).await
    }

    /// Sends a signal to a process's whole process group: a name (`TERM`, `SIGKILL`, `INT`,
    /// ...) or a number.
    pub async fn signal_process(&self, process_id: u64, signal: &str) -> Result<()> {
        if signal.trim().is_empty() {
            return Err(Error::Invalid(
                "no signal given: name one, e.g. TERM or KILL, or give its number".into(),
            ));
        }
        let body = SignalRequest {
            signal: signal.trim().to_string(),
        };
        let url = self.process_endpoint(process_id, "/signal", &[])?;
        let rb = self.client().request(Method::POST, url).json(&body);
        self.client().empty(rb).await
    }

    /// Forgets a finished process (its exit status and buffered output).
    pub async fn forget_process(&self, process_id: u64) -> Result<()> {
        let url = self.process_endpoint(process_id, "", &[])?;
        let rb = self.client().request(Method::DELETE, url);
        self.client().empty(rb).await
    }

    /// A process's output from the start of what the sandbox kept, then live until it exits:
    /// the same events as [`exec_stream`](Self::exec_stream) (without `start`).
    pub async fn process_output(&self, process_id: u64) -> Result<ExecEvents> {
        let url = self.process_endpoint(process_id, "/output", &[])?;
        let resp = self
            .client()
            .send(self.client().request(Method::GET, url))
            .await?;
        Ok(ExecEvents::from_body(resp.bytes_stream()))
    }

    /// Writes `data` to the stdin (or terminal) of a process started with `stdin_open` (or
    /// `pty`); answers once it is written.
    pub async fn send_stdin(&self, process_id: u64, data: &[u8]) -> Result<()> {
        self.stdin_request(process_id, data, false).await
    }

    /// Closes the stdin of a process started with `stdin_open`: it reads end of file.
    pub async fn close_stdin(&self, process_id: u64) -> Result<()> {
        self.stdin_request(process_id, &[], true).await
    }

    async fn stdin_request(&self, process_id: u64, data: &[u8], close: bool) -> Result<()> {
        use base64::Engine;
        let body = StdinRequest {
            data: None,
            data_b64: (!data.is_empty())
                .then(|| base64::engine::general_purpose::STANDARD.encode(data)),
            close,
        };
        let url = self.process_endpoint(process_id, "/stdin", &[])?;
        let rb = self.client().request(Method::POST, url).json(&body);
        self.client().empty(rb).await
    }

    /// Changes the size of a process's terminal (one started with `pty`).
    pub async fn resize_pty(&self, process_id: u64, cols: u16, rows: u16) -> Result<()> {
        let url = self.process_endpoint(process_id, "/resize", &[])?;
        let rb = self
            .client()
            .request(Method::POST, url)
            .json(&PtySize { cols, rows });
        self.client().empty(rb).await
    }

    fn process_endpoint(
        &self,
        process_id: u64,
        rest: &str,
        query: &[(&str, &str)],
    ) -> Result<reqwest::Url> {
        self.endpoint(&format!("/processes/{process_id}{rest}"), query)
    }
}
