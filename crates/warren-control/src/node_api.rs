//! The control plane's own calls to a node: one typed method per node operation.
//!
//! Forwarding a client's request to the node that owns a sandbox is `api/forward.rs` (it
//! streams the answer back as it comes). `NodeApi` is for the answers the control plane reads
//! itself: it decodes them, bounds how much a node may send, and bounds how long it may take.
//! Asking every node at once goes through [`crate::fanout`].

use std::time::Duration;

use warren_types::api::{
    ImageStats, Layer, NodeInfo, Sandbox, SandboxChanges, SandboxList, SandboxState, TaskAction,
    TaskList, TaskResult,
};
use warren_types::error::{ApiError, ErrorBody};
use warren_types::events::EventList;
use warren_types::id::SandboxId;

use crate::nodes::NodeClient;

/// Most bytes of a node's answer the control plane reads (a list of 10 000 sandboxes is ~10 MiB).
pub const MAX_ANSWER: usize = 64 << 20;
/// Most bytes of a node's error body the control plane reads.
const MAX_ERROR_BODY: usize = 64 << 10;
/// How long a node has to say who it is.
const INFO_TIMEOUT: Duration = Duration::from_secs(5);

/// Why a call to a node gave no answer.
#[derive(Debug, Clone, thiserror::Error)]
pub enum CallError {
    /// The node did not answer: not reachable, too slow, or its answer was cut or not JSON.
    #[error("{0}")]
    Unreachable(String),
    /// The node answered with an error of its own.
    #[error("{0}")]
    Refused(ApiError),
}

/// How long the control plane waits for a node's answer to its own calls.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timeouts {
    /// Lists, counts, statistics, a sandbox's record, a commit.
    pub read: Duration,
    /// Task-level pause, resume and stop (a node acts on all of the task's sandboxes).
    pub task: Duration,
}

impl Default for Timeouts {
    fn default() -> Self {
        Timeouts {
            read: Duration::from_secs(30),
            task: Duration::from_secs(600),
        }
    }
}

/// `GET /v1/sandboxes` filters, as the node takes them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SandboxFilter {
    /// Only sandboxes of projects in these subtrees (comma-separated; the caller's scope).
    pub scope: Option<String>,
    /// Only this task's sandboxes.
    pub task: Option<String>,
    /// Only sandboxes with all these labels, `key=value,key2=value2`.
    pub label: Option<String>,
    /// Only sandboxes in this state.
    pub state: Option<SandboxState>,
}

/// `GET /v1/events` filters, as the node takes them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EventFilter {
    /// Only this sandbox's events.
    pub sandbox: Option<SandboxId>,
    /// Only events of this task's sandboxes.
    pub task: Option<String>,
    /// Only this kind (its wire name).
    pub kind: Option<String>,
    /// Only events since then, ms since the epoch.
    pub since_ms: Option<u64>,
}

/// The typed API of one node.
#[derive(Debug, Clone, Copy)]
pub struct NodeApi<'a> {
    client: &'a NodeClient,
    timeouts: Timeouts,
}

impl<'a> NodeApi<'a> {
    /// The API of the node `client` reaches, waiting as long as `timeouts` say.
    pub fn new(client: &'a NodeClient, timeouts: Timeouts) -> Self {
        NodeApi { client, timeouts }
    }

    /// `GET /v1/node`: the node's identity and load.
    pub async fn info(&self) -> Result<NodeInfo, CallError> {
        self.call(reqwest::Method::GET, "/v1/node", INFO_TIMEOUT)
            .await
    }

    /// `GET /v1/node/sandboxes`: what changed in the node's set of sandboxes since generation
    /// `since`.
    pub async fn changes(&self, since: u64) -> Result<SandboxChanges, CallError> {
        self.read(&format!("/v1/node/sandboxes?since={since}"))
            .await
    }

    /// `GET /v1/sandboxes`: the node's sandboxes that match `filter`.
    pub async fn sandboxes(&self, filter: &SandboxFilter) -> Result<SandboxList, CallError> {
        let q = query(&[
            ("task", filter.task.as_deref()),
            ("label", filter.label.as_deref()),
            ("state", filter.state.map(|s| s.as_str())),
        ]);
        self.call_scoped(
            reqwest::Method::GET,
            &format!("/v1/sandboxes{q}"),
            self.timeouts.read,
            None,
            filter.scope.as_deref(),
        )
        .await
    }

    /// `GET /v1/sandboxes/{id}`: one sandbox's record.
    pub async fn sandbox(&self, id: &SandboxId) -> Result<Sandbox, CallError> {
        self.read(&format!("/v1/sandboxes/{id}")).await
    }

    /// [`NodeApi::sandbox`] for a caller: the node answers 404 or 403 for a sandbox outside
    /// `scope` (where it may act) and `visible` (where it may see).
    pub async fn sandbox_scoped(
        &self,
        id: &SandboxId,
        scope: &str,
        visible: &str,
    ) -> Result<Sandbox, CallError> {
        self.call_headers(
            reqwest::Method::GET,
            &format!("/v1/sandboxes/{id}"),
            self.timeouts.read,
            &[
                (warren_types::project::SCOPE_HEADER, scope),
                (warren_types::project::VISIBLE_HEADER, visible),
            ],
        )
        .await
    }

    /// [`NodeApi::commit`] for a caller (see [`NodeApi::sandbox_scoped`]), recording who
    /// made the layer.
    pub async fn commit_scoped(
        &self,
        id: &SandboxId,
        creator: &str,
        scope: &str,
        visible: &str,
    ) -> Result<Layer, CallError> {
        self.call_headers(
            reqwest::Method::POST,
            &format!("/v1/sandboxes/{id}/commit"),
            self.timeouts.read,
            &[
                (warren_types::project::SCOPE_HEADER, scope),
                (warren_types::project::VISIBLE_HEADER, visible),
                ("x-warren-creator", creator),
            ],
        )
        .await
    }

    /// `POST /v1/sandboxes/{id}/commit`: the sandbox's changes as a new layer.
    pub async fn commit(&self, id: &SandboxId) -> Result<Layer, CallError> {
        let path = format!("/v1/sandboxes/{id}/commit");
        self.call(reqwest::Method::POST, &path, self.timeouts.read)
            .await
    }

    /// `POST /v1/tasks/{task}/{action}`: pause, resume or stop the task's sandboxes on the node.
    pub async fn task_action(
        &self,
        task: &str,
        action: TaskAction,
        scope: Option<&str>,
    ) -> Result<TaskResult, CallError> {
        let path = format!("/v1/tasks/{}/{}", encode(task), action.as_str());
        self.call_scoped(
            reqwest::Method::POST,
            &path,
            self.timeouts.task,
            None,
            scope,
        )
        .await
    }

    /// `PUT /v1/tasks/{task}/network`: a new network policy for the task's sandboxes on the
    /// node.
    pub async fn task_network(
        &self,
        task: &str,
        policy: &warren_types::net::NetworkPolicy,
        scope: Option<&str>,
    ) -> Result<warren_types::api::TaskNetworkResult, CallError> {
        let path = format!("/v1/tasks/{}/network", encode(task));
        let body = serde_json::to_vec(policy).map_err(|e| CallError::Unreachable(e.to_string()))?;
        self.call_scoped(
            reqwest::Method::PUT,
            &path,
            self.timeouts.task,
            Some(body),
            scope,
        )
        .await
    }

    /// `GET /v1/tasks`: the node's tasks and their counts.
    pub async fn tasks(&self, scope: Option<&str>) -> Result<TaskList, CallError> {
        self.call_scoped(
            reqwest::Method::GET,
            "/v1/tasks",
            self.timeouts.read,
            None,
            scope,
        )
        .await
    }

    /// `GET /v1/events`: the node's incident events that match `filter`.
    pub async fn events(
        &self,
        filter: &EventFilter,
        scope: Option<&str>,
    ) -> Result<EventList, CallError> {
        let sandbox = filter.sandbox.as_ref().map(|s| s.to_string());
        let since = filter.since_ms.map(|s| s.to_string());
        let q = query(&[
            ("kind", filter.kind.as_deref()),
            ("task", filter.task.as_deref()),
            ("since_ms", since.as_deref()),
            ("sandbox", sandbox.as_deref()),
        ]);
        self.call_scoped(
            reqwest::Method::GET,
            &format!("/v1/events{q}"),
            self.timeouts.read,
            None,
            scope,
        )
        .await
    }

    /// `POST /v1/node/fncall`: a function call on a worker of the node; `timeout` bounds the
    /// whole call (its steps' limits, plus a worker's start).
    pub async fn fncall(
        &self,
        call: &warren_types::fncall::NodeCall,
        timeout: Duration,
    ) -> Result<warren_types::fncall::NodeCallResult, CallError> {
        let body = serde_json::to_vec(call).map_err(|e| CallError::Unreachable(e.to_string()))?;
        self.call_with(
            reqwest::Method::POST,
            "/v1/node/fncall",
            timeout,
            Some(body),
        )
        .await
    }

    /// `GET /v1/images/stats`: reads of the node's mounted layers and of its sandboxes.
    pub async fn image_stats(&self) -> Result<ImageStats, CallError> {
        self.read("/v1/images/stats").await
    }

    async fn read<T: serde::de::DeserializeOwned>(&self, path: &str) -> Result<T, CallError> {
        self.call(reqwest::Method::GET, path, self.timeouts.read)
            .await
    }

    /// Sends one request and decodes its JSON answer, reading at most [`MAX_ANSWER`] bytes
    /// within `timeout` (the whole exchange, body included).
    async fn call<T: serde::de::DeserializeOwned>(
        &self,
        method: reqwest::Method,
        path: &str,
        timeout: Duration,
    ) -> Result<T, CallError> {
        self.call_with(method, path, timeout, None).await
    }

    /// [`NodeApi::call`] with a JSON body.
    async fn call_with<T: serde::de::DeserializeOwned>(
        &self,
        method: reqwest::Method,
        path: &str,
        timeout: Duration,
        body: Option<Vec<u8>>,
    ) -> Result<T, CallError> {
        self.call_scoped(method, path, timeout, body, None).await
    }

    /// A call with these headers and no body.
    async fn call_headers<T: serde::de::DeserializeOwned>(
        &self,
        method: reqwest::Method,
        path: &str,
        timeout: Duration,
        headers: &[(&str, &str)],
    ) -> Result<T, CallError> {
        self.exchange(method, path, timeout, None, headers).await
    }

    /// [`NodeApi::call_with`] limited to the sandboxes of projects in `scope`
    /// (comma-separated subtrees; none: no limit).
    async fn call_scoped<T: serde::de::DeserializeOwned>(
        &self,
        method: reqwest::Method,
        path: &str,
        timeout: Duration,
        body: Option<Vec<u8>>,
        scope: Option<&str>,
    ) -> Result<T, CallError> {
        match scope {
            Some(s) => {
                self.exchange(
                    method,
                    path,
                    timeout,
                    body,
                    &[(warren_types::project::SCOPE_HEADER, s)],
                )
                .await
            }
            None => self.exchange(method, path, timeout, body, &[]).await,
        }
    }

    async fn exchange<T: serde::de::DeserializeOwned>(
        &self,
        method: reqwest::Method,
        path: &str,
        timeout: Duration,
        body: Option<Vec<u8>>,
        headers: &[(&str, &str)],
    ) -> Result<T, CallError> {
        let exchange = async {
            let mut req = self.client.request(method, path);
            for (k, v) in headers {
                req = req.header(*k, *v);
            }
            if let Some(b) = body {
                req = req
                    .header(reqwest::header::CONTENT_TYPE, "application/json")
                    .body(b);
            }
            let mut resp = req
                .send()
                .await
                .map_err(|e| CallError::Unreachable(cause(&e)))?;
            let status = resp.status();
            let max = if status.is_success() {
                MAX_ANSWER
            } else {
                MAX_ERROR_BODY
            };
            let bytes = read_bounded(&mut resp, max).await?;
            if status.is_success() {
                return serde_json::from_slice(&bytes).map_err(|e| {
                    CallError::Unreachable(format!(
                        "its answer to {path} is not what Warren sends ({e})"
                    ))
                });
            }
            match serde_json::from_slice::<ErrorBody>(&bytes) {
                Ok(b) => Err(CallError::Refused(b.error)),
                Err(_) => Err(CallError::Unreachable(format!(
                    "it answered {path} with status {status} and no Warren error"
                ))),
            }
        };
        match tokio::time::timeout(timeout, exchange).await {
            Ok(r) => r,
            Err(_) => Err(CallError::Unreachable(format!(
                "no answer to {path} within {} s",
                timeout.as_secs_f64()
            ))),
        }
    }
}

/// The body of `resp`, refused past `max` bytes.
async fn read_bounded(resp: &mut reqwest::Response, max: usize) -> Result<Vec<u8>, CallError> {
    let too_large = || {
        CallError::Unreachable(format!(
            "its answer is larger than {max} bytes, which is refused"
        ))
    };
    if resp.content_length().is_some_and(|n| n > max as u64) {
        return Err(too_large());
    }
    let mut buf = Vec::new();
    while let Some(chunk) = resp
        .chunk()
        .await
        .map_err(|e| CallError::Unreachable(format!("its answer broke off: {}", cause(&e))))?
    {
        if buf.len() + chunk.len() > max {
            return Err(too_large());
        }
        buf.extend_from_slice(&chunk);
    }
    Ok(buf)
}

/// A reqwest error with its causes, for people.
fn cause(e: &reqwest::Error) -> String {
    let mut s = e.to_string();
    let mut src = std::error::Error::source(e);
    while let Some(inner) = src {
        s.push_str(": ");
        s.push_str(&inner.to_string());
        src = inner.source();
    }
    s
}

/// `?k=v&…` of the parameters that are set, values percent-encoded; empty when none is.
fn query(params: &[(&str, Option<&str>)]) -> String {
    let parts: Vec<String> = params
        .iter()
        .filter_map(|(k, v)| v.map(|v| format!("{k}={}", encode(v))))
        .collect();
    if parts.is_empty() {
        String::new()
    } else {
        format!("?{}", parts.join("&"))
    }
}

/// Percent-encodes a path segment or query value (everything but RFC 3986's unreserved set).
pub(crate) fn encode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn queries_name_only_what_is_set_and_encode_values() {
        assert_eq!(query(&[("task", None), ("label", None)]), "");
        assert_eq!(
            query(&[
                ("task", Some("a b/c")),
                ("label", None),
                ("state", Some("paused"))
            ]),
            "?task=a%20b%2Fc&state=paused"
        );
        assert_eq!(encode("run-7_x.y~"), "run-7_x.y~");
        assert_eq!(encode("a&b=c"), "a%26b%3Dc");
    }
}
