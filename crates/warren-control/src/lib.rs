//! Warren's control plane: the public REST API, API keys, and placement over nodes.
//!
//! It keeps no sandbox state on disk: it learns load from nodes and asks them about their
//! sandboxes; its own database holds API keys and the image catalog (later IAM and audit). It never
//! links the syscall layer or a backend, so it runs on any host.

pub mod api;
pub mod auth;
pub mod catalog;
pub mod config;
pub mod fanout;
pub mod node_api;
pub mod nodes;
pub mod openapi;
pub mod scheduler;

use std::sync::Arc;
use std::time::Duration;

use sqlx::SqlitePool;
use sqlx::sqlite::SqliteConnectOptions;

pub use config::ControlConfig;
pub use nodes::Endpoint;

/// The control plane's state.
pub struct Control {
    /// Configuration.
    pub cfg: ControlConfig,
    /// The nodes it places sandboxes on.
    pub nodes: Arc<nodes::Nodes>,
    /// Known API keys.
    pub keys: Arc<auth::Keys>,
    /// Its database.
    pub db: SqlitePool,
    /// The image layer store (None when it cannot be opened: image routes then answer 503).
    pub store: Option<warren_images::Store>,
    /// The image catalog (names → layers), in the database.
    pub catalog: catalog::Catalog,
    /// Places for streams to sandboxes' exposed ports (`api::ports`).
    pub tunnels: Arc<tokio::sync::Semaphore>,
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
        let url = cfg.database_url();
        let opts: SqliteConnectOptions = url.parse().map_err(|source| StartError::Db {
            url: url.clone(),
            source,
        })?;
        let db = sqlx::sqlite::SqlitePoolOptions::new()
            .max_connections(4)
            .connect_with(opts.create_if_missing(true))
            .await
            .map_err(|source| StartError::Db {
                url: url.clone(),
                source,
            })?;
        sqlx::migrate!("./migrations/sqlite").run(&db).await?;
        let new_admin_key = auth::bootstrap_admin(&db, &cfg.data_dir).await?;
        let keys = Arc::new(auth::Keys::load(&db).await?);
        let nodes = Arc::new(nodes::Nodes::new(cfg.node_timeouts()));
        for e in endpoints {
            nodes.add(e).await?;
        }
        nodes.spawn_collector(Duration::from_millis(cfg.collect_interval_ms));
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
            keys,
            catalog: catalog::Catalog::new(db.clone()),
            db,
            store,
            tunnels: Arc::new(tokio::sync::Semaphore::new(api::ports::MAX_TUNNELS)),
        });
        Ok(Started {
            control,
            new_admin_key,
        })
    }
}
