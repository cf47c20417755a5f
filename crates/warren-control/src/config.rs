//! The control plane's configuration, with its defaults.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

/// How the control plane runs.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ControlConfig {
    /// Where the database and the admin key live. Default `/var/lib/warren`.
    pub data_dir: PathBuf,
    /// Database URL. Default `sqlite://<data_dir>/warren.db`.
    pub database_url: Option<String>,
    /// Candidates drawn per placement (power-of-k choice); the number of nodes or more means
    /// the least loaded of all. Default 2.
    pub schedule_k: usize,
    /// Count placements in flight, and those no report counts yet, in a node's load (the
    /// in-flight overlay). Off only to measure what it is for (`warren-bench cluster`).
    /// Default true.
    pub schedule_overlay: bool,
    /// Nodes a create is sent to at most, one after another, while they refuse (full, or too
    /// busy); then 429 with Retry-After. Default 4.
    pub schedule_attempts: usize,
    /// Images whose sandboxes may go to nodes of the `burst` pool: names, or prefixes ending
    /// in `*` (`base/python:*`, `host`, `*` for all). A create whose every image matches is
    /// eligible. Default none: the burst pool is never used.
    pub burst_images: Vec<String>,
    /// The default pool's utilisation (0 to 1; see `scheduler::utilisation`) from which
    /// eligible creates may go to the burst pool. They also go there when no default node has
    /// room. Default 0.8.
    pub burst_threshold: f64,
    /// How often node load is polled, milliseconds. Default 2000.
    pub collect_interval_ms: u64,
    /// The image layer store (shared with the nodes). Default `<data_dir>/images`.
    pub image_store: Option<PathBuf>,
    /// Largest image upload (`POST /v1/images`), bytes. Default 64Gi.
    pub max_image_upload: warren_types::ByteSize,
    /// How long a node has to answer the control plane's own calls (lists, counts,
    /// statistics, commit), milliseconds; a node slower than that is named as not answering.
    /// Default 30000.
    pub node_timeout_ms: u64,
    /// The same for task-level pause, resume and stop, milliseconds. Default 600000.
    pub node_task_timeout_ms: u64,
    /// The domain of the `<port>-<sandbox id>.<domain>` route: a request whose `Host` is such
    /// a name goes to that exposed port of that sandbox (point a wildcard DNS record
    /// `*.<domain>` at the control plane). Default none: no such route.
    pub sandbox_domain: Option<String>,
    /// The cluster token's file: nodes present the token to join, and the control plane to
    /// their APIs. Made (mode 0600) when missing. Every replica of a cluster needs the same
    /// one. Default `<data_dir>/cluster.token`.
    pub cluster_token_file: Option<PathBuf>,
    /// Ranges image pulls may reach although they are always denied (private, loopback,
    /// link-local and metadata addresses, `warren_types::denied`): a registry on the site's
    /// own network, e.g. `["10.20.0.0/16"]`. CIDRs. Default none.
    pub registry_exempt: Vec<String>,
}

impl Default for ControlConfig {
    fn default() -> Self {
        ControlConfig {
            data_dir: PathBuf::from("/var/lib/warren"),
            database_url: None,
            schedule_k: 2,
            schedule_overlay: true,
            schedule_attempts: 4,
            burst_images: Vec::new(),
            burst_threshold: 0.8,
            collect_interval_ms: 2000,
            image_store: None,
            max_image_upload: warren_types::ByteSize(64 << 30),
            node_timeout_ms: 30_000,
            node_task_timeout_ms: 600_000,
            sandbox_domain: None,
            cluster_token_file: None,
            registry_exempt: Vec::new(),
        }
    }
}

impl ControlConfig {
    /// How long the control plane waits for nodes.
    pub fn node_timeouts(&self) -> crate::node_api::Timeouts {
        crate::node_api::Timeouts {
            read: std::time::Duration::from_millis(self.node_timeout_ms.max(1)),
            task: std::time::Duration::from_millis(self.node_task_timeout_ms.max(1)),
        }
    }

    /// How often a joined node says it is still there: the poll interval, at least a second.
    pub fn heartbeat_ms(&self) -> u64 {
        self.collect_interval_ms.max(1000)
    }

    /// Whether a create of `image` (names, comma-separated) may go to the burst pool, and
    /// from what utilisation of the default pool.
    pub fn burst_above(&self, image: &str) -> Option<f64> {
        let eligible = |name: &str| {
            self.burst_images.iter().any(|p| match p.strip_suffix('*') {
                Some(prefix) => name.starts_with(prefix),
                None => name == p,
            })
        };
        let all = image
            .split(',')
            .map(str::trim)
            .filter(|n| !n.is_empty())
            .all(eligible);
        (all && !self.burst_images.is_empty()).then_some(self.burst_threshold)
    }

    /// The destinations image pulls may not reach: the always-denied ranges less
    /// `registry_exempt`, or what is wrong with that setting.
    pub fn registry_denied(&self) -> Result<warren_types::denied::Denied, String> {
        let exempt = self
            .registry_exempt
            .iter()
            .map(|s| {
                warren_types::net::Cidr::parse(s)
                    .map_err(|e| format!("[control] registry_exempt: {e}"))
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(warren_types::denied::Denied::new(&[], &exempt))
    }

    /// The cluster token's file in effect.
    pub fn cluster_token_file(&self) -> PathBuf {
        self.cluster_token_file
            .clone()
            .unwrap_or_else(|| self.data_dir.join("cluster.token"))
    }

    /// The image store in effect.
    pub fn image_store(&self) -> PathBuf {
        self.image_store
            .clone()
            .unwrap_or_else(|| self.data_dir.join("images"))
    }

    /// The database URL in effect.
    pub fn database_url(&self) -> String {
        self.database_url.clone().unwrap_or_else(|| {
            format!(
                "sqlite://{}?mode=rwc",
                self.data_dir.join("warren.db").display()
            )
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn burst_eligibility_needs_every_image_named() {
        let mut c = ControlConfig::default();
        assert_eq!(c.burst_above("host"), None, "nothing bursts by default");
        c.burst_images = vec!["base/python:*".into(), "host".into()];
        c.burst_threshold = 0.7;
        assert_eq!(c.burst_above("host"), Some(0.7));
        assert_eq!(c.burst_above("base/python:3.12"), Some(0.7));
        assert_eq!(c.burst_above("base/python:3.12,host"), Some(0.7));
        assert_eq!(c.burst_above("base/python:3.12,tk/agent:v3"), None);
        assert_eq!(c.burst_above("base/pythonista:1"), None);
        assert_eq!(c.burst_above("hostile"), None);
        c.burst_images = vec!["*".into()];
        assert_eq!(c.burst_above("tk/agent:v3"), Some(0.7));
    }
}
