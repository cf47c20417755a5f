//! The nodes the control plane knows: a client for each, and their last reported load.
//!
//! The control plane keeps no sandbox state of its own. It learns load from the nodes (the
//! collector polls `GET /v1/node`) and asks them for sandboxes when it needs to list them.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use warren_types::api::NodeInfo;
use warren_types::id::NodeId;

use crate::fanout::{self, Answers};
use crate::node_api::{NodeApi, Timeouts};

/// How to reach a node.
#[derive(Debug, Clone)]
pub enum Endpoint {
    /// The node API on a local unix socket (`warren up`).
    Unix(PathBuf),
    /// The node API over HTTP with a cluster token.
    Http {
        /// Base URL, e.g. `http://10.0.0.5:7701`.
        url: String,
        /// Cluster token.
        token: Option<String>,
    },
}

/// Why a node could not be reached.
#[derive(Debug, thiserror::Error)]
#[error("node at {endpoint} does not answer: {reason}")]
pub struct Unreachable {
    /// Where we looked.
    pub endpoint: String,
    /// Why.
    pub reason: String,
}

/// A client for one node's API.
#[derive(Debug, Clone)]
pub struct NodeClient {
    http: reqwest::Client,
    base: String,
    token: Option<String>,
    endpoint: String,
}

impl NodeClient {
    /// A client for `endpoint`.
    pub fn new(endpoint: &Endpoint) -> Result<NodeClient, Unreachable> {
        // Idle connections are dropped before the node closes them (it does after
        // `HEADER_READ_TIMEOUT`): a request sent on one the node is closing would be lost.
        let builder = reqwest::Client::builder()
            .pool_max_idle_per_host(256)
            .pool_idle_timeout(warren_http::serve::HEADER_READ_TIMEOUT / 2)
            .tcp_nodelay(true);
        let (builder, base, token, shown) = match endpoint {
            Endpoint::Unix(path) => (
                builder.unix_socket(path.clone()),
                "http://node".to_string(),
                None,
                path.display().to_string(),
            ),
            Endpoint::Http { url, token } => (
                builder,
                url.trim_end_matches('/').to_string(),
                token.clone(),
                url.clone(),
            ),
        };
        let http = builder.build().map_err(|e| Unreachable {
            endpoint: shown.clone(),
            reason: e.to_string(),
        })?;
        Ok(NodeClient {
            http,
            base,
            token,
            endpoint: shown,
        })
    }

    /// A request to `path_and_query` on the node.
    pub fn request(
        &self,
        method: reqwest::Method,
        path_and_query: &str,
    ) -> reqwest::RequestBuilder {
        let rb = self
            .http
            .request(method, format!("{}{}", self.base, path_and_query));
        match &self.token {
            Some(t) => rb.bearer_auth(t),
            None => rb,
        }
    }

    /// Where the node is, for messages.
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }
}

/// A node and what the control plane knows of its load.
#[derive(Debug)]
pub struct NodeEntry {
    /// Its id.
    pub id: NodeId,
    /// Its client.
    pub client: NodeClient,
    last: RwLock<NodeInfo>,
    up: AtomicBool,
    /// Placements sent to it and not yet answered (the in-flight overlay).
    pub inflight: AtomicU32,
    /// Memory of those placements.
    pub inflight_memory: AtomicU64,
    timeouts: Timeouts,
}

impl NodeEntry {
    /// Its typed API, for the control plane's own calls.
    pub fn api(&self) -> NodeApi<'_> {
        NodeApi::new(&self.client, self.timeouts)
    }

    /// Its last reported state.
    pub fn info(&self) -> NodeInfo {
        self.last.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Whether it answered the last poll.
    pub fn is_up(&self) -> bool {
        self.up.load(Ordering::Relaxed)
    }
}

/// Every node the control plane knows.
#[derive(Debug, Default)]
pub struct Nodes {
    map: RwLock<HashMap<NodeId, Arc<NodeEntry>>>,
    timeouts: Timeouts,
}

impl Nodes {
    /// No nodes yet; calls to the nodes added will wait as long as `timeouts` say.
    pub fn new(timeouts: Timeouts) -> Self {
        Nodes {
            map: RwLock::default(),
            timeouts,
        }
    }

    /// Registers a node after asking for its identity.
    pub async fn add(&self, endpoint: &Endpoint) -> Result<Arc<NodeEntry>, Unreachable> {
        let client = NodeClient::new(endpoint)?;
        let info = NodeApi::new(&client, self.timeouts)
            .info()
            .await
            .map_err(|e| Unreachable {
                endpoint: client.endpoint().to_string(),
                reason: e.to_string(),
            })?;
        let entry = Arc::new(NodeEntry {
            id: info.id.clone(),
            client,
            last: RwLock::new(info),
            up: AtomicBool::new(true),
            inflight: AtomicU32::new(0),
            inflight_memory: AtomicU64::new(0),
            timeouts: self.timeouts,
        });
        self.map
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .insert(entry.id.clone(), entry.clone());
        Ok(entry)
    }

    /// The node `id`.
    pub fn get(&self, id: &NodeId) -> Option<Arc<NodeEntry>> {
        self.map
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .get(id)
            .cloned()
    }

    /// All nodes.
    pub fn all(&self) -> Vec<Arc<NodeEntry>> {
        let mut v: Vec<_> = self
            .map
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .values()
            .cloned()
            .collect();
        v.sort_by(|a, b| a.id.cmp(&b.id));
        v
    }

    /// Polls every node once and records what it says; the answers say which did not.
    pub async fn collect(&self) -> Answers<()> {
        fanout::ask(self.all(), |n| async move {
            match n.api().info().await {
                Ok(info) => {
                    *n.last.write().unwrap_or_else(|p| p.into_inner()) = info;
                    n.up.store(true, Ordering::Relaxed);
                    Ok(())
                }
                Err(e) => {
                    if n.up.swap(false, Ordering::Relaxed) {
                        tracing::warn!(node_id = %n.id, "node stopped answering: {e}");
                    }
                    Err(e)
                }
            }
        })
        .await
    }

    /// Polls nodes every `interval` until the process ends.
    pub fn spawn_collector(self: &Arc<Self>, interval: Duration) {
        let nodes = Arc::downgrade(self);
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(interval).await;
                let Some(n) = nodes.upgrade() else { break };
                // Each node that stops answering is logged once, above.
                n.collect().await;
            }
        });
    }
}
