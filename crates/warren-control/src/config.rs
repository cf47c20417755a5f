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
    /// Candidates drawn per placement (power-of-k choice). Default 2.
    pub schedule_k: usize,
    /// How often node load is polled, milliseconds. Default 2000.
    pub collect_interval_ms: u64,
    /// The image layer store (shared with the nodes). Default `<data_dir>/images`.
    pub image_store: Option<PathBuf>,
    /// Largest image upload (`POST /v1/images`), bytes. Default 64Gi.
    pub max_image_upload: warren_types::ByteSize,
}

impl Default for ControlConfig {
    fn default() -> Self {
        ControlConfig {
            data_dir: PathBuf::from("/var/lib/warren"),
            database_url: None,
            schedule_k: 2,
            collect_interval_ms: 2000,
            image_store: None,
            max_image_upload: warren_types::ByteSize(64 << 30),
        }
    }
}

impl ControlConfig {
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
