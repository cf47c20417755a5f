//! The handle on one sandbox, and its lifecycle: info, pause, resume, kill.
//!
//! Running commands ([`exec`](crate::exec)), background processes ([`process`](crate::process))
//! and files ([`files`](crate::files)) are methods of the same handle, each in its own module.

use std::sync::Arc;

use reqwest::Method;
use warren_types::id::SandboxId;

use crate::error::Result;
use crate::{Client, SandboxInfo};

/// A handle on one sandbox: its id and a client. Cheap to clone; making one makes no request.
///
/// Get one from [`Client::create`], or from an id with [`Client::sandbox`]. Every operation
/// on a paused sandbox resumes it first, except [`pause`](Self::pause) and
/// [`kill`](Self::kill).
#[derive(Debug, Clone)]
pub struct Sandbox {
    client: Client,
    id: SandboxId,
    user: Option<Arc<str>>,
    snapshot: Option<Arc<SandboxInfo>>,
}

impl Sandbox {
    pub(crate) fn new(client: Client, id: SandboxId, snapshot: Option<SandboxInfo>) -> Sandbox {
        Sandbox {
            client,
            id,
            user: None,
            snapshot: snapshot.map(Arc::new),
        }
    }

    /// The sandbox's id.
    pub fn id(&self) -> &SandboxId {
        &self.id
    }

    /// The client this handle sends its requests with.
    pub fn client(&self) -> &Client {
        &self.client
    }

    /// The sandbox as the server described it when [`Client::create`] made this handle;
    /// `None` for a handle made by [`Client::sandbox`]. It is not kept up to date: call
    /// [`info`](Self::info) for the current state.
    pub fn snapshot(&self) -> Option<&SandboxInfo> {
        self.snapshot.as_deref()
    }

    /// A handle that acts as `user` (a name or uid; `root` runs as root without capabilities):
    /// file operations, and commands whose request names no user of its own.
    ///
    /// Without it, both act as the sandbox's unprivileged `user` (uid 1000).
    pub fn as_user(&self, user: &str) -> Sandbox {
        Sandbox {
            user: Some(Arc::from(user)),
            ..self.clone()
        }
    }

    /// The user set with [`as_user`](Self::as_user), if any.
    pub fn user(&self) -> Option<&str> {
        self.user.as_deref()
    }

    /// The sandbox as it is now (`GET /v1/sandboxes/{id}`).
    pub async fn info(&self) -> Result<SandboxInfo> {
        let rb = self.client.request(Method::GET, self.endpoint("", &[])?);
        self.client.json(rb).await
    }

    /// What the sandbox uses now (`GET /v1/sandboxes/{id}/metrics`).
    pub async fn metrics(&self) -> Result<crate::SandboxMetrics> {
        let rb = self
            .client
            .request(Method::GET, self.endpoint("/metrics", &[])?);
        self.client.json(rb).await
    }

    /// Kills the sandbox and frees everything it held (`DELETE /v1/sandboxes/{id}`).
    pub async fn kill(&self) -> Result<()> {
        let rb = self.client.request(Method::DELETE, self.endpoint("", &[])?);
        self.client.empty(rb).await
    }

    /// Freezes the sandbox: its processes stop, its memory is kept. Any later operation
    /// resumes it.
    pub async fn pause(&self) -> Result<SandboxInfo> {
        let rb = self
            .client
            .request(Method::POST, self.endpoint("/pause", &[])?);
        self.client.json(rb).await
    }

    /// Gives the sandbox `secs` seconds to live from now (`POST /v1/sandboxes/{id}/timeout`).
    pub async fn set_timeout(&self, secs: u64) -> Result<SandboxInfo> {
        let rb = self
            .client
            .request(Method::POST, self.endpoint("/timeout", &[])?)
            .json(&warren_types::api::SetTimeout { timeout: secs });
        self.client.json(rb).await
    }

    /// Its network: mode, addresses, gateway and policy (`GET /v1/sandboxes/{id}/network`).
    pub async fn network(&self) -> Result<crate::NetworkStatus> {
        let rb = self
            .client
            .request(Method::GET, self.endpoint("/network", &[])?);
        self.client.json(rb).await
    }

    /// Replaces its network policy (`PUT /v1/sandboxes/{id}/network`): new connections follow
    /// it at once, open ones at their next packet (reset if no longer allowed).
    pub async fn set_network(&self, policy: &crate::NetworkPolicy) -> Result<crate::NetworkStatus> {
        let rb = self
            .client
            .request(Method::PUT, self.endpoint("/network", &[])?)
            .json(policy);
        self.client.json(rb).await
    }

    /// Exposes exactly `ports` (TCP), keeping the rest of its policy: each gets a port on its
    /// node's host (`exposed` in the answer) and the control plane's
    /// `<port>-<id>.<sandbox_domain>` route. An empty list unexposes every port.
    pub async fn expose(&self, ports: &[u16]) -> Result<crate::NetworkStatus> {
        let now = self.network().await?;
        let policy = crate::NetworkPolicy {
            mode: now.mode,
            allow: now.allow,
            deny: now.deny,
            expose: ports.to_vec(),
        };
        self.set_network(&policy).await
    }

    /// A TCP stream to exposed port `port` of the sandbox, through the control plane and its
    /// node (`GET /v1/sandboxes/{id}/ports/{port}/connect`, an HTTP upgrade); a paused sandbox
    /// is resumed first.
    pub async fn connect_port(&self, port: u16) -> Result<reqwest::Upgraded> {
        let rb = self
            .client
            .request(
                Method::GET,
                self.endpoint(&format!("/ports/{port}/connect"), &[])?,
            )
            .header(reqwest::header::CONNECTION, "upgrade")
            .header(reqwest::header::UPGRADE, "tcp");
        let resp = rb.send().await.map_err(|e| self.client.transport(e))?;
        if resp.status() != reqwest::StatusCode::SWITCHING_PROTOCOLS {
            return Err(self.client.failure(resp).await);
        }
        resp.upgrade().await.map_err(crate::Error::Transport)
    }

    /// The trajectory log so far (`GET /v1/sandboxes/{id}/trajectory`), for sandboxes created
    /// with `trajectory: true`.
    pub async fn trajectory(&self) -> Result<Vec<warren_types::api::TrajectoryEntry>> {
        let rb = self
            .client
            .request(Method::GET, self.endpoint("/trajectory", &[])?);
        let body = self
            .client
            .send(rb)
            .await?
            .bytes()
            .await
            .map_err(crate::Error::Transport)?;
        body.split(|b| *b == b'\n')
            .filter(|l| !l.is_empty())
            .map(|l| {
                serde_json::from_slice(l)
                    .map_err(|e| crate::Error::Decode(format!("trajectory entry: {e}")))
            })
            .collect()
    }

    /// Thaws a paused sandbox.
    pub async fn resume(&self) -> Result<SandboxInfo> {
        let rb = self
            .client
            .request(Method::POST, self.endpoint("/resume", &[])?);
        self.client.json(rb).await
    }

    /// The address of `/v1/sandboxes/{id}{rest}` with these query parameters.
    pub(crate) fn endpoint(&self, rest: &str, query: &[(&str, &str)]) -> Result<reqwest::Url> {
        self.client
            .endpoint(&format!("/v1/sandboxes/{}{rest}", self.id), query)
    }
}
