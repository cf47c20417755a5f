//! `warren up`: the control plane and a node daemon in one process, on one machine.

use std::path::PathBuf;

/// Options of `warren up`.
#[derive(Debug, Clone, clap::Args)]
pub struct UpArgs {
    /// Data directory (database, admin key, node state).
    #[arg(long, env = "WARREN_DATA_DIR", default_value = "/var/lib/warren")]
    pub data_dir: PathBuf,
    /// Address the REST API listens on.
    #[arg(long, env = "WARREN_LISTEN", default_value = "127.0.0.1:7700")]
    pub listen: String,
}

/// Runs the all-in-one platform until Ctrl-C or SIGTERM.
pub fn run(_args: UpArgs) -> anyhow::Result<()> {
    anyhow::bail!("warren up is not built yet")
}
