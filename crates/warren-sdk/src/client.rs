//! The client: one connection pool to Warren, and the operations that are not about one
//! sandbox (create, list, nodes, health).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use reqwest::header::{HeaderValue, RETRY_AFTER};
use reqwest::{Method, RequestBuilder, Response, Url};
use serde::de::DeserializeOwned;
use warren_types::api::{
    CreateSandbox, Gathered, Health, NodeInfo, NodeList, SandboxList, SandboxState, TaskAction,
    TaskInfo, TaskList, TaskResult,
};
use warren_types::error::ErrorCode;
use warren_types::events::{Event, EventKind, EventList};
use warren_types::id::SandboxId;

use crate::config::Config;
use crate::error::{self, Error, Result};
use crate::{Listing, Sandbox, SandboxInfo};

/// How long to wait for a connection to Warren before giving up.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// A client of Warren's REST API.
///
/// Cheap to clone (clones share one connection pool) and safe to use from many tasks at once:
/// create one and pass clones around, e.g. to thousands of rollouts under `join_all`.
///
/// ```no_run
/// # async fn demo() -> warren_sdk::Result<()> {
/// use warren_sdk::{Client, CreateSandbox};
///
/// let client = Client::from_env()?;
/// let sb = client
///     .create(&CreateSandbox { image: "host".into(), ..Default::default() })
///     .await?;
/// let out = sb.exec(&warren_sdk::shell("echo hello")).await?;
/// assert_eq!(out.stdout, "hello\n");
/// sb.kill().await?;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Client {
    inner: Arc<Inner>,
}

struct Inner {
    http: reqwest::Client,
    /// The base address without a trailing `/`.
    base: String,
    api_key: Option<String>,
    missing_key: Option<String>,
    /// The key id its requests are made on behalf of (`x-warren-on-behalf-of`), if any.
    on_behalf_of: Option<String>,
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client")
            .field("url", &self.inner.base)
            .field(
                "api_key",
                &self.inner.api_key.as_ref().map(|_| "<redacted>"),
            )
            .finish()
    }
}

/// Which sandboxes [`Client::list`] returns; the default returns all of them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ListFilter {
    /// Only this training task's sandboxes.
    pub task: Option<String>,
    /// Only sandboxes that have all these labels.
    pub labels: BTreeMap<String, String>,
    /// Only sandboxes in this state.
    pub state: Option<SandboxState>,
}

impl ListFilter {
    /// Only this task's sandboxes.
    pub fn task(mut self, task: impl Into<String>) -> Self {
        self.task = Some(task.into());
        self
    }

    /// Only sandboxes with this label (add more to require all).
    pub fn label(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.labels.insert(key.into(), value.into());
        self
    }

    /// Only sandboxes in this state.
    pub fn state(mut self, state: SandboxState) -> Self {
        self.state = Some(state);
        self
    }

    /// The query parameters of `GET /v1/sandboxes`.
    pub(crate) fn query(&self) -> Result<Vec<(&'static str, String)>> {
        let mut q = Vec::new();
        if let Some(task) = &self.task {
            q.push(("task", task.clone()));
        }
        if !self.labels.is_empty() {
            let mut pairs = Vec::with_capacity(self.labels.len());
            for (k, v) in &self.labels {
                if k.is_empty() || k.contains([',', '=']) || v.contains(',') {
                    return Err(Error::Invalid(format!(
                        "label filter {k:?}={v:?} cannot be sent: keys must be non-empty and \
                         without ',' or '=', values without ','"
                    )));
                }
                pairs.push(format!("{k}={v}"));
            }
            q.push(("label", pairs.join(",")));
        }
        if let Some(state) = self.state {
            q.push(("state", state.as_str().to_string()));
        }
        Ok(q)
    }
}

impl Client {
    /// A client of the Warren at `url` (e.g. `http://127.0.0.1:7700`) that sends `api_key`.
    ///
    /// Fails only when `url` is not an `http://` address.
    pub fn new(url: &str, api_key: Option<&str>) -> Result<Client> {
        Client::from_config(Config::new(url, api_key.map(str::to_string)))
    }

    /// A client configured from the environment: `WARREN_URL`, `WARREN_API_KEY`, or the key
    /// file `warren up` writes (see [`Config::from_env`]).
    pub fn from_env() -> Result<Client> {
        Client::from_config(Config::from_env())
    }

    /// A client with this configuration.
    pub fn from_config(cfg: Config) -> Result<Client> {
        let base = check_url(&cfg.url)?;
        let http = reqwest::Client::builder()
            .connect_timeout(CONNECT_TIMEOUT)
            .user_agent(concat!("warren-sdk/", env!("CARGO_PKG_VERSION")))
            .build()
            .map_err(Error::Transport)?;
        let missing_key = cfg.missing_key_reason().map(str::to_string);
        Ok(Client {
            inner: Arc::new(Inner {
                http,
                base,
                api_key: cfg.api_key,
                missing_key,
                on_behalf_of: None,
            }),
        })
    }

    /// The base address this client talks to.
    pub fn url(&self) -> &str {
        &self.inner.base
    }

    /// A handle on an existing sandbox, by id; makes no request.
    ///
    /// Fails with [`Error::Invalid`] when `id` is not a sandbox id.
    pub fn sandbox(&self, id: &str) -> Result<Sandbox> {
        Ok(Sandbox::new(self.clone(), parse_id(id)?, None))
    }

    /// Creates a sandbox (`POST /v1/sandboxes`) and returns a handle on it.
    ///
    /// Fails with [`ErrorCode::Capacity`] when no node has room (see
    /// [`Error::is_retryable`]), or [`ErrorCode::ImageNotFound`].
    pub async fn create(&self, req: &CreateSandbox) -> Result<Sandbox> {
        self.create_inner(req, None).await
    }

    /// Like [`create`](Self::create), with an `Idempotency-Key`: a retry with the same key
    /// returns the sandbox the first request made instead of making another.
    pub async fn create_idempotent(&self, req: &CreateSandbox, key: &str) -> Result<Sandbox> {
        self.create_inner(req, Some(key)).await
    }

    async fn create_inner(&self, req: &CreateSandbox, key: Option<&str>) -> Result<Sandbox> {
        let mut rb = self
            .request(Method::POST, self.endpoint("/v1/sandboxes", &[])?)
            .json(req);
        if let Some(key) = key {
            let value = HeaderValue::from_str(key).map_err(|_| {
                Error::Invalid(format!(
                    "idempotency key {key:?} must be printable ASCII (it travels in a header)"
                ))
            })?;
            rb = rb.header("Idempotency-Key", value);
        }
        let info: SandboxInfo = self.json(rb).await?;
        Ok(Sandbox::new(self.clone(), info.id.clone(), Some(info)))
    }

    /// The sandboxes that match `filter` (`GET /v1/sandboxes`), oldest first. Those of a node
    /// that did not answer are missing; the listing names it ([`Listing::unreachable`]).
    pub async fn list(&self, filter: &ListFilter) -> Result<Listing<SandboxInfo>> {
        let query = filter.query()?;
        let query: Vec<(&str, &str)> = query.iter().map(|(k, v)| (*k, v.as_str())).collect();
        let rb = self.request(Method::GET, self.endpoint("/v1/sandboxes", &query)?);
        let list: Gathered<SandboxList> = self.json(rb).await?;
        Ok(Listing {
            items: list.answer.sandboxes,
            unreachable: list.unreachable,
        })
    }

    /// One sandbox as the API shows it (`GET /v1/sandboxes/{id}`).
    pub async fn get(&self, id: &str) -> Result<SandboxInfo> {
        self.sandbox(id)?.info().await
    }

    /// The nodes and their load (`GET /v1/nodes`); a node that did not answer now is listed
    /// with its last report and named in [`Listing::unreachable`].
    pub async fn nodes(&self) -> Result<Listing<NodeInfo>> {
        let rb = self.request(Method::GET, self.endpoint("/v1/nodes", &[])?);
        let list: Gathered<NodeList> = self.json(rb).await?;
        Ok(Listing {
            items: list.answer.nodes,
            unreachable: list.unreachable,
        })
    }

    /// Keeps new sandboxes off node `node` (`true`, `POST /v1/nodes/{node}/cordon`), or lets
    /// them on again (`false`, `.../uncordon`). Its sandboxes run on either way.
    pub async fn cordon(&self, node: &str, on: bool) -> Result<NodeInfo> {
        if node.is_empty() {
            return Err(Error::Invalid("node id is empty".into()));
        }
        let mut url = self.endpoint("/v1/nodes", &[])?;
        url.path_segments_mut()
            .map_err(|_| Error::Invalid("the base URL cannot take a path".into()))?
            .push(node)
            .push(if on { "cordon" } else { "uncordon" });
        self.json(self.request(Method::POST, url)).await
    }

    /// Removes node `node` from the cluster for good (`DELETE /v1/nodes/{node}`); refused
    /// while it answers.
    pub async fn remove_node(&self, node: &str) -> Result<()> {
        if node.is_empty() {
            return Err(Error::Invalid("node id is empty".into()));
        }
        let mut url = self.endpoint("/v1/nodes", &[])?;
        url.path_segments_mut()
            .map_err(|_| Error::Invalid("the base URL cannot take a path".into()))?
            .push(node);
        self.empty(self.request(Method::DELETE, url)).await
    }

    /// Pauses, resumes or stops every sandbox of `task` (`POST /v1/tasks/{task}/{action}`).
    /// The sandboxes of a node that did not answer were not reached; the answer names it
    /// ([`Gathered::unreachable`]).
    pub async fn task_action(
        &self,
        task: &str,
        action: TaskAction,
    ) -> Result<Gathered<TaskResult>> {
        if task.is_empty() {
            return Err(Error::Invalid("task name is empty".into()));
        }
        let mut url = self.endpoint("/v1/tasks", &[])?;
        url.path_segments_mut()
            .map_err(|_| Error::Invalid("the base URL cannot take a path".into()))?
            .push(task)
            .push(action.as_str());
        self.json(self.request(Method::POST, url)).await
    }

    /// Replaces the network policy of every sandbox of `task`, on every node at once
    /// (`PUT /v1/tasks/{task}/network`).
    pub async fn set_task_network(
        &self,
        task: &str,
        policy: &crate::NetworkPolicy,
    ) -> Result<Gathered<crate::TaskNetworkResult>> {
        if task.is_empty() {
            return Err(Error::Invalid("task name is empty".into()));
        }
        let mut url = self.endpoint("/v1/tasks", &[])?;
        url.path_segments_mut()
            .map_err(|_| Error::Invalid("the base URL cannot take a path".into()))?
            .push(task)
            .push("network");
        self.json(self.request(Method::PUT, url).json(policy)).await
    }

    /// Every task with sandboxes (`GET /v1/tasks`); a node that did not answer is named in
    /// [`Listing::unreachable`] and its sandboxes are not counted.
    pub async fn tasks(&self) -> Result<Listing<TaskInfo>> {
        let rb = self.request(Method::GET, self.endpoint("/v1/tasks", &[])?);
        let list: Gathered<TaskList> = self.json(rb).await?;
        Ok(Listing {
            items: list.answer.tasks,
            unreachable: list.unreachable,
        })
    }

    /// Incident events, oldest first (`GET /v1/events`): what sandboxes tried that the
    /// platform stopped or cut. A node that did not answer is named in
    /// [`Listing::unreachable`].
    pub async fn events(&self, filter: &EventFilter) -> Result<Listing<Event>> {
        let mut query: Vec<(&str, &str)> = Vec::new();
        let kind = filter.kind.map(|k| k.name());
        for (k, v) in [
            ("sandbox", filter.sandbox.as_deref()),
            ("task", filter.task.as_deref()),
            ("kind", kind),
            ("since", filter.since.as_deref()),
        ] {
            if let Some(v) = v {
                query.push((k, v));
            }
        }
        let rb = self.request(Method::GET, self.endpoint("/v1/events", &query)?);
        let list: Gathered<EventList> = self.json(rb).await?;
        Ok(Listing {
            items: list.answer.events,
            unreachable: list.unreachable,
        })
    }

    /// Whether Warren and its nodes answer (`GET /v1/health`; needs no key).
    pub async fn health(&self) -> Result<Health> {
        let rb = self.request(Method::GET, self.endpoint("/v1/health", &[])?);
        self.json(rb).await
    }

    /// The same client (same connections) sending `key` instead: for a gateway acting for
    /// each of its callers with the caller's own key.
    pub fn with_api_key(&self, key: &str) -> Client {
        Client {
            inner: Arc::new(Inner {
                http: self.inner.http.clone(),
                base: self.inner.base.clone(),
                api_key: Some(key.to_string()),
                missing_key: None,
                on_behalf_of: None,
            }),
        }
    }

    /// The same client (same key, same connections) making its requests on behalf of the key
    /// whose id is `key_id`: Warren then gives them that key's grants, refuses them once it is
    /// revoked or expired, and audits what they change under it. Only a key holding every
    /// permission on `root` may do this (Warren's E2B gateway does, for its callers).
    pub fn on_behalf_of(&self, key_id: &str) -> Client {
        Client {
            inner: Arc::new(Inner {
                http: self.inner.http.clone(),
                base: self.inner.base.clone(),
                api_key: self.inner.api_key.clone(),
                missing_key: self.inner.missing_key.clone(),
                on_behalf_of: Some(key_id.to_string()),
            }),
        }
    }

    // Plumbing shared by the per-sandbox operations.

    /// The address of `path` (which starts with `/`) with these query parameters.
    pub(crate) fn endpoint(&self, path: &str, query: &[(&str, &str)]) -> Result<Url> {
        build_url(&self.inner.base, path, query)
    }

    /// A request with the client's credentials.
    pub(crate) fn request(&self, method: Method, url: Url) -> RequestBuilder {
        let mut rb = self.inner.http.request(method, url);
        if let Some(id) = &self.inner.on_behalf_of {
            rb = rb.header(warren_types::project::ON_BEHALF_HEADER, id);
        }
        match &self.inner.api_key {
            Some(key) => rb.bearer_auth(key),
            None => rb,
        }
    }

    /// Sends a request; a reply with a failure status becomes an [`Error::Api`].
    pub(crate) async fn send(&self, rb: RequestBuilder) -> Result<Response> {
        let resp = rb.send().await.map_err(|e| self.transport(e))?;
        if resp.status().is_success() {
            return Ok(resp);
        }
        Err(self.failure(resp).await)
    }

    /// A reply with a failure status as the error it carries.
    pub(crate) async fn failure(&self, resp: Response) -> Error {
        let status = resp.status();
        let retry_after = resp
            .headers()
            .get(RETRY_AFTER)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.trim().parse().ok());
        let body = resp.bytes().await.unwrap_or_default();
        let mut err = error::from_reply(status.as_u16(), retry_after, &body);
        if let (Error::Api { code, message, .. }, Some(why)) = (&mut err, &self.inner.missing_key)
            && *code == ErrorCode::Unauthenticated
        {
            message.push_str(&format!(" (this client sent no API key: {why})"));
        }
        err
    }

    /// Sends a request and decodes its JSON reply.
    pub(crate) async fn json<T: DeserializeOwned>(&self, rb: RequestBuilder) -> Result<T> {
        read_json(self.send(rb).await?).await
    }

    /// Sends a request whose reply has no body worth reading.
    pub(crate) async fn empty(&self, rb: RequestBuilder) -> Result<()> {
        self.send(rb).await.map(drop)
    }

    /// A failed send as the error the user should see.
    pub(crate) fn transport(&self, e: reqwest::Error) -> Error {
        if e.is_connect() {
            Error::Connect {
                url: self.inner.base.clone(),
                source: e,
            }
        } else {
            Error::Transport(e)
        }
    }
}

/// Reads a successful reply's JSON body.
pub(crate) async fn read_json<T: DeserializeOwned>(resp: Response) -> Result<T> {
    let body = resp.bytes().await.map_err(Error::Transport)?;
    serde_json::from_slice(&body).map_err(|e| {
        let text = String::from_utf8_lossy(&body);
        let shown: String = text.chars().take(120).collect();
        Error::Decode(format!(
            "could not understand Warren's reply ({e}): {shown}"
        ))
    })
}

/// Parses a sandbox id given by a caller.
pub(crate) fn parse_id(id: &str) -> Result<SandboxId> {
    id.trim()
        .parse()
        .map_err(|e| Error::Invalid(format!("{e}; sandbox ids are what create returned")))
}

/// Checks a base address and returns it without a trailing `/`; `host:port` alone means
/// `http://host:port`.
fn check_url(url: &str) -> Result<String> {
    let trimmed = url.trim();
    let trimmed = if trimmed.contains("://") {
        trimmed.to_string()
    } else {
        format!("http://{trimmed}")
    };
    let parsed = Url::parse(&trimmed).map_err(|e| {
        Error::Invalid(format!(
            "{url:?} is not an address ({e}): WARREN_URL should look like http://127.0.0.1:7700"
        ))
    })?;
    match parsed.scheme() {
        "http" => {}
        "https" => {
            return Err(Error::Invalid(format!(
                "{url:?} uses https, which this client does not speak: Warren serves plain \
                 HTTP, e.g. http://127.0.0.1:7700 (put TLS in front of it separately)"
            )));
        }
        other => {
            return Err(Error::Invalid(format!(
                "{url:?} is not an http:// address (scheme {other:?}): WARREN_URL should look \
                 like http://127.0.0.1:7700"
            )));
        }
    }
    if parsed.query().is_some() || parsed.fragment().is_some() {
        return Err(Error::Invalid(format!(
            "{url:?} has a query or fragment: give only scheme, host, port and path prefix"
        )));
    }
    if parsed.host_str().is_none_or(str::is_empty) {
        return Err(Error::Invalid(format!(
            "{url:?} names no host: WARREN_URL should look like http://127.0.0.1:7700"
        )));
    }
    Ok(trimmed.trim_end_matches('/').to_string())
}

/// `base` + `path`, with the query parameters percent-encoded.
fn build_url(base: &str, path: &str, query: &[(&str, &str)]) -> Result<Url> {
    let mut url = Url::parse(&format!("{base}{path}"))
        .map_err(|e| Error::Invalid(format!("cannot build an address from {base}{path}: {e}")))?;
    if !query.is_empty() {
        url.query_pairs_mut().extend_pairs(query);
    }
    Ok(url)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base_addresses_are_checked_and_normalised() {
        assert_eq!(
            check_url("http://127.0.0.1:7700/").unwrap(),
            "http://127.0.0.1:7700"
        );
        assert_eq!(check_url(" http://h/warren/ ").unwrap(), "http://h/warren");
        assert_eq!(
            check_url("127.0.0.1:7700").unwrap(),
            "http://127.0.0.1:7700"
        );
        assert_eq!(
            check_url("localhost:7700").unwrap(),
            "http://localhost:7700"
        );
        for (bad, why) in [
            ("ftp://h", "not an http:// address"),
            ("http://", "not an address"),
            ("http://h:99999", "not an address"),
            ("https://h", "https"),
            ("http://h/?x=1", "query"),
        ] {
            let err = check_url(bad).unwrap_err().to_string();
            assert!(err.contains(why), "{bad}: {err}");
        }
    }

    #[test]
    fn query_parameters_are_encoded() {
        let url = build_url(
            "http://h:1/pre",
            "/v1/sandboxes/abcdef0123456789wxyz/files",
            &[("path", "/tmp/a b&c=d#e"), ("mode", "644")],
        )
        .unwrap();
        assert_eq!(url.path(), "/pre/v1/sandboxes/abcdef0123456789wxyz/files");
        let pairs: Vec<(String, String)> = url.query_pairs().into_owned().collect();
        assert_eq!(
            pairs,
            vec![
                ("path".into(), "/tmp/a b&c=d#e".into()),
                ("mode".into(), "644".into())
            ]
        );
        assert!(
            build_url("http://h:1", "/v1/health", &[])
                .unwrap()
                .query()
                .is_none()
        );
    }

    #[test]
    fn list_filters_become_the_servers_query() {
        assert!(ListFilter::default().query().unwrap().is_empty());
        let f = ListFilter::default()
            .task("t1")
            .label("b", "2")
            .label("a", "x=y")
            .state(SandboxState::Paused);
        assert_eq!(
            f.query().unwrap(),
            vec![
                ("task", "t1".to_string()),
                ("label", "a=x=y,b=2".to_string()),
                ("state", "paused".to_string())
            ]
        );
        let err = ListFilter::default().label("a,b", "1").query().unwrap_err();
        assert!(matches!(err, Error::Invalid(_)));
    }

    #[test]
    fn ids_are_checked_before_they_reach_a_url() {
        let client = Client::new("http://127.0.0.1:1", None).unwrap();
        assert!(client.sandbox("abcdef0123456789wxyz").is_ok());
        let err = client.sandbox("../../v1/nodes").unwrap_err();
        assert!(matches!(err, Error::Invalid(_)));
        assert!(err.to_string().contains("not a valid sandbox id"), "{err}");
    }

    #[tokio::test]
    async fn nothing_listening_is_a_connect_error_that_says_what_to_do() {
        // Port 1 on loopback: nothing listens there on any sane machine.
        let client = Client::new("http://127.0.0.1:1", None).unwrap();
        let err = client.health().await.unwrap_err();
        assert!(matches!(err, Error::Connect { .. }), "{err:?}");
        let msg = err.to_string();
        assert!(
            msg.contains("warren up") && msg.contains("WARREN_URL"),
            "{msg}"
        );
        assert!(err.is_retryable());
    }
}

/// Which events [`Client::events`] lists.
#[derive(Debug, Clone, Default)]
pub struct EventFilter {
    /// Only this sandbox's.
    pub sandbox: Option<String>,
    /// Only those of this task's sandboxes.
    pub task: Option<String>,
    /// Only this kind.
    pub kind: Option<EventKind>,
    /// Only since then: RFC 3339, or a duration back from now (`10m`).
    pub since: Option<String>,
}
