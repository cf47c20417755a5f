//! Warren's control plane: the public REST API, API keys, and placement over nodes.
//!
//! It keeps no sandbox state on disk: it learns load from nodes and asks them about their
//! sandboxes; its own database holds API keys and the image catalog (later IAM and audit). It never
//! links the syscall layer or a backend, so it runs on any host.

pub mod api;
pub mod auth;
pub mod catalog;
pub mod cluster;
pub mod config;
pub mod create_keys;
pub mod db;
pub mod fanout;
pub mod iam;
pub mod local_pg;
pub mod node_api;
pub mod nodes;
pub mod openapi;
pub mod quota;
pub mod registry;
pub mod scheduler;

use std::sync::Arc;
use std::time::Duration;

pub use config::ControlConfig;
pub use nodes::Endpoint;

/// The control plane's state.
pub struct Control {
    /// Configuration.
    pub cfg: ControlConfig,
    /// The nodes it places sandboxes on.
    pub nodes: Arc<nodes::Nodes>,
    /// Identities, keys and their grants.
    pub iam: Arc<iam::Iam>,
    /// What projects hold, for quotas.
    pub usage: Arc<quota::Usage>,
    /// Its database.
    pub db: db::Db,
    /// The image layer store (None when it cannot be opened: image routes then answer 503).
    pub store: Option<warren_images::Store>,
    /// The image catalog (names → layers), in the database.
    pub catalog: catalog::Catalog,
    /// Places for streams to sandboxes' exposed ports (`api::ports`).
    pub tunnels: Arc<tokio::sync::Semaphore>,
    /// The cluster token (nodes join with it; the control plane calls their APIs with it).
    pub cluster_token: String,
    /// Nodes that ran function calls of each image and memory lately (they hold warm workers).
    pub warm_calls: api::WarmCalls,
    /// The cluster's addresses joined nodes deny their sandboxes (`cluster::cluster_addresses`).
    pub cluster_addresses: cluster::ClusterAddresses,
}

/// Why the control plane could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// The database.
    #[error("database {url}: {source}")]
    Db {
        /// Its URL.
        url: String,
        /// What failed.
        #[source]
        source: sqlx::Error,
    },
    /// Migrating the database.
    #[error("database migration: {0}")]
    Migrate(#[from] sqlx::migrate::MigrateError),
    /// API keys.
    #[error(transparent)]
    Auth(#[from] auth::AuthError),
    /// A node.
    #[error(transparent)]
    Node(#[from] nodes::Unreachable),
    /// A setting out of range.
    #[error("configuration: {0}")]
    Config(String),
    /// The cluster token's file.
    #[error("cluster token {path}: {source}")]
    Token {
        /// The file.
        path: String,
        /// What failed.
        #[source]
        source: std::io::Error,
    },
}

/// What [`Control::start`] made.
pub struct Started {
    /// The control plane.
    pub control: Arc<Control>,
    /// The admin key, when it was made by this start.
    pub new_admin_key: Option<String>,
}

impl Control {
    /// Opens the database, makes sure an admin key exists, and registers `nodes`.
    pub async fn start(cfg: ControlConfig, endpoints: &[Endpoint]) -> Result<Started, StartError> {
        if !(0.0..=1.0).contains(&cfg.burst_threshold) {
            return Err(StartError::Config(format!(
                "burst_threshold = {}: give a utilisation from 0 to 1 (e.g. 0.8)",
                cfg.burst_threshold
            )));
        }
        cfg.registry_denied().map_err(StartError::Config)?;
        let url = cfg.database_url();
        // Shown without its password, should it hold one.
        let shown = match url.split_once('@') {
            Some((scheme_user, host)) => format!(
                "{}@{host}",
                scheme_user.split(':').take(2).collect::<Vec<_>>().join(":")
            ),
            None => url.clone(),
        };
        let db = db::open(&url).await.map_err(|e| match e {
            sqlx::Error::Migrate(m) => StartError::Migrate(*m),
            source => StartError::Db {
                url: shown.clone(),
                source,
            },
        })?;
        let new_admin_key = auth::bootstrap_admin(&db, &cfg.data_dir).await?;
        let iam = Arc::new(
            iam::Iam::new(db.clone())
                .await
                .map_err(|e| StartError::Db {
                    url: shown.clone(),
                    source: match e {
                        iam::IamError::Db(e) => e,
                        other => sqlx::Error::Protocol(other.to_string()),
                    },
                })?,
        );
        // Revocations reach this replica within a second.
        iam.spawn_refresh(Duration::from_secs(1));
        let token_file = cfg.cluster_token_file();
        let cluster_token =
            cluster::load_or_make_token(&token_file).map_err(|source| StartError::Token {
                path: token_file.display().to_string(),
                source,
            })?;
        let nodes = Arc::new(nodes::Nodes::new(cfg.node_timeouts()));
        for e in endpoints {
            let n = nodes.add(e).await?;
            if let Endpoint::Unix(path) = e {
                let cordoned =
                    cluster::record_local_in(&db, &n.id, path)
                        .await
                        .map_err(|source| StartError::Db {
                            url: shown.clone(),
                            source,
                        })?;
                n.set_cordoned(cordoned);
            }
        }
        // Every node that joined before (through this replica or another) is known before the
        // first request: a restarted replica's view is complete once the first polls answer.
        cluster::sync(&nodes, &db, &cluster_token)
            .await
            .map_err(|source| StartError::Db {
                url: shown.clone(),
                source,
            })?;
        let interval = Duration::from_millis(cfg.collect_interval_ms);
        nodes.collect().await;
        nodes.spawn_collector(interval);
        cluster::spawn_sync(&nodes, db.clone(), cluster_token.clone(), interval);
        let store = match warren_images::Store::open(&cfg.image_store()) {
            Ok(s) => Some(s),
            Err(e) => {
                tracing::error!(path = %cfg.image_store().display(), "image store: {e}");
                None
            }
        };
        let control = Arc::new(Control {
            cfg,
            nodes,
            iam,
            usage: Arc::default(),
            catalog: catalog::Catalog::new(db.clone()),
            db,
            store,
            tunnels: Arc::new(tokio::sync::Semaphore::new(api::ports::MAX_TUNNELS)),
            cluster_token,
            warm_calls: Default::default(),
            cluster_addresses: Default::default(),
        });
        Ok(Started {
            control,
            new_admin_key,
        })
    }
}
