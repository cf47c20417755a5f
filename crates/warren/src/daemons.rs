//! `warren server` (the control plane alone) and `warren node` (a node daemon alone, joined to
//! a control plane over the network): the two halves of `warren up`, for clusters.

use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context;
use warren_control::{Control, ControlConfig};
use warren_node::{Node, NodeConfig};
use warren_types::api::{NodeRegistered, NodeRegistration};

use crate::up::{
    FileConfig, file_sets_no_state_dir, init_logging, is_root, listen_tcp, serve_until_stopped,
    stop_node,
};

/// Options of `warren server`. Flags override the config file; the file overrides defaults.
#[derive(Debug, Clone, clap::Args)]
#[command(after_help = "Examples:\n  warren server --listen 0.0.0.0:7700\n  \
    warren server --data-dir /srv/warren --image-store /mnt/shared/warren-images\n\n\
Nodes join with `warren node --join http://THIS:7700 --cluster-token-file FILE`, FILE holding\n\
the token in <data-dir>/cluster.token (made at the first start, mode 0600). Replicas of one\n\
cluster share the database and the cluster token.")]
pub struct ServerArgs {
    /// Data directory (database, admin key, cluster token).
    #[arg(long, env = "WARREN_DATA_DIR")]
    pub data_dir: Option<PathBuf>,
    /// Address the REST API listens on [default: 127.0.0.1:7700].
    #[arg(long, env = "WARREN_LISTEN")]
    pub listen: Option<String>,
    /// TOML config file: top-level `data_dir`, `listen`, and a `[control]` table.
    #[arg(long, env = "WARREN_CONFIG")]
    pub config: Option<PathBuf>,
    /// The image layer store, a directory every node reads too [default: <data-dir>/images].
    #[arg(long, env = "WARREN_IMAGE_STORE")]
    pub image_store: Option<PathBuf>,
    /// Database URL [default: sqlite://<data-dir>/warren.db].
    #[arg(long, env = "WARREN_DATABASE")]
    pub database: Option<String>,
    /// The cluster token's file [default: <data-dir>/cluster.token, made when missing].
    #[arg(long, env = "WARREN_CLUSTER_TOKEN_FILE")]
    pub cluster_token_file: Option<PathBuf>,
}

/// Options of `warren node` when it runs the daemon.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct NodeDaemonArgs {
    /// The control plane to join (repeat for replicas: the first that answers takes the
    /// heartbeat).
    #[arg(long, env = "WARREN_JOIN", value_delimiter = ',')]
    pub join: Vec<String>,
    /// File holding the cluster token (the control plane's <data-dir>/cluster.token).
    #[arg(long, env = "WARREN_CLUSTER_TOKEN_FILE")]
    pub cluster_token_file: Option<PathBuf>,
    /// Address the node API listens on [default: 127.0.0.1:7702].
    #[arg(long, env = "WARREN_NODE_LISTEN")]
    pub listen: Option<String>,
    /// Where the control plane reaches the node API [default: http://<listen>].
    #[arg(long, env = "WARREN_ADVERTISE")]
    pub advertise: Option<String>,
    /// Data directory (the node's state is in <data-dir>/node).
    #[arg(long, env = "WARREN_DATA_DIR")]
    pub data_dir: Option<PathBuf>,
    /// TOML config file: top-level `data_dir`, and a `[node]` table.
    #[arg(long, env = "WARREN_CONFIG")]
    pub config: Option<PathBuf>,
    /// The image layer store the control plane writes [default: <data-dir>/images].
    #[arg(long, env = "WARREN_IMAGE_STORE")]
    pub image_store: Option<PathBuf>,
    /// Name of Warren's parent cgroup [default: warren].
    #[arg(long, env = "WARREN_CGROUP_PARENT")]
    pub cgroup_parent: Option<String>,
    /// Kill every sandbox when stopping, instead of leaving them for the next start.
    #[arg(long)]
    pub kill_sandboxes_on_exit: bool,
}

fn read_file_config(path: Option<&Path>) -> anyhow::Result<FileConfig> {
    match path {
        Some(p) => {
            let raw = std::fs::read_to_string(p)
                .with_context(|| format!("reading config {}", p.display()))?;
            toml::from_str(&raw).with_context(|| format!("config {}", p.display()))
        }
        None => Ok(FileConfig::default()),
    }
}

/// Makes the data directory, or takes an existing one, private to its owner (mode 0700): it
/// holds the identities, key hashes and audit log. The directory is looked at and changed
/// through one descriptor opened without following a link at its last component (a link the
/// operator made higher up the path is theirs), and refused when it belongs to another user
/// (who could open it again) or is a shared directory such as `/tmp` (sticky, writable by
/// others) rather than closed to them.
pub(crate) fn make_data_dir(d: &Path) -> anyhow::Result<()> {
    use rustix::fs::{Mode, OFlags};
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(d)
        .with_context(|| format!("creating data directory {}", d.display()))?;
    let fd = rustix::fs::open(
        d,
        OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC | OFlags::RDONLY,
        Mode::empty(),
    )
    .with_context(|| {
        format!(
            "opening data directory {} (it must be a directory, not a link to one)",
            d.display()
        )
    })?;
    let st = rustix::fs::fstat(&fd)
        .with_context(|| format!("reading data directory {}", d.display()))?;
    let mode = st.st_mode & 0o7777;
    let me = rustix::process::geteuid().as_raw();
    if st.st_uid != me {
        anyhow::bail!(
            "data directory {} belongs to uid {}, not to warren's uid {me}: give warren a \
             directory of its own with --data-dir",
            d.display(),
            st.st_uid
        );
    }
    if mode & 0o1002 == 0o1002 {
        anyhow::bail!(
            "data directory {} is a shared directory (mode {mode:o}): give warren a directory \
             of its own with --data-dir",
            d.display()
        );
    }
    if mode & 0o077 != 0 {
        rustix::fs::fchmod(&fd, Mode::from_raw_mode(0o700))
            .with_context(|| format!("making data directory {} private", d.display()))?;
        tracing::warn!(
            "data directory {} was mode {mode:o}: made 0700 (it holds keys and the audit log)",
            d.display()
        );
    }
    Ok(())
}

/// Runs the control plane alone until Ctrl-C or SIGTERM.
pub fn run_server(args: ServerArgs) -> anyhow::Result<()> {
    init_logging();
    let file = read_file_config(args.config.as_deref())?;
    let data_dir = args
        .data_dir
        .or(file.data_dir)
        .unwrap_or_else(|| PathBuf::from("/var/lib/warren"));
    let listen = args
        .listen
        .or(file.listen)
        .unwrap_or_else(|| "127.0.0.1:7700".to_string());
    let mut cfg: ControlConfig = file.control.unwrap_or_default();
    cfg.data_dir = data_dir.clone();
    if let Some(s) = args.image_store {
        cfg.image_store = Some(s);
    }
    if let Some(d) = args.database {
        cfg.database_url = Some(d);
    }
    if let Some(t) = args.cluster_token_file {
        cfg.cluster_token_file = Some(t);
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    rt.block_on(async move {
        make_data_dir(&data_dir)?;
        let tcp = listen_tcp(&listen)
            .await
            .with_context(|| format!("listening on {listen} (choose another with --listen)"))?;
        let token_file = cfg.cluster_token_file();
        let started = Control::start(cfg, &[]).await?;
        if started.new_admin_key.is_some() {
            eprintln!(
                "warren: created an admin API key in {} (mode 0600)",
                data_dir.join("admin.key").display()
            );
        }
        eprintln!(
            "warren: serving the control plane on http://{listen} ({} nodes known). Nodes join \
             with: warren node --join http://{listen} --cluster-token-file {}",
            started.control.nodes.all().len(),
            token_file.display()
        );
        let app = warren_control::api::router(started.control.clone());
        serve_until_stopped(tcp, app).await;
        drop(started);
        eprintln!("warren: control plane stopped");
        Ok(())
    })
}

/// The cluster token a node presents, from its file.
fn read_token(path: Option<&Path>) -> anyhow::Result<String> {
    let Some(path) = path else {
        anyhow::bail!(
            "warren node needs the cluster token: --cluster-token-file FILE (a copy of the \
             control plane's <data-dir>/cluster.token)"
        );
    };
    let t = std::fs::read_to_string(path)
        .with_context(|| format!("reading the cluster token {}", path.display()))?;
    let t = t.trim().to_string();
    if t.len() < 16 {
        anyhow::bail!(
            "{} holds no cluster token (shorter than 16 characters)",
            path.display()
        );
    }
    Ok(t)
}

/// Runs a node daemon that joins the control plane at `--join`, until Ctrl-C or SIGTERM.
pub fn run_node(args: NodeDaemonArgs) -> anyhow::Result<()> {
    init_logging();
    if !is_root() {
        anyhow::bail!(
            "warren node needs root: it creates namespaces, cgroups and mounts for sandboxes"
        );
    }
    if args.join.is_empty() {
        anyhow::bail!(
            "warren node runs a node daemon that joins a control plane: give --join \
             http://CONTROL:7700 (or use a subcommand: warren node ls|cordon|uncordon|drain)"
        );
    }
    let token = read_token(args.cluster_token_file.as_deref())?;
    let file = read_file_config(args.config.as_deref())?;
    let data_dir = args
        .data_dir
        .or(file.data_dir)
        .unwrap_or_else(|| PathBuf::from("/var/lib/warren"));
    let listen = args.listen.unwrap_or_else(|| "127.0.0.1:7702".to_string());
    let advertise = match args.advertise {
        Some(a) => a,
        None if listen.starts_with("0.0.0.0:") || listen.starts_with("[::]:") => anyhow::bail!(
            "--listen {listen} is every address: give --advertise http://THIS-NODE:PORT, where \
             the control plane reaches it"
        ),
        None => format!("http://{listen}"),
    };
    let mut cfg: NodeConfig = file.node.unwrap_or_default();
    if file_sets_no_state_dir(&cfg) {
        cfg.state_dir = data_dir.join("node");
    }
    if let Some(p) = args.cgroup_parent {
        cfg.cgroup_parent = p;
    }
    if let Some(s) = args.image_store {
        cfg.image_store = s;
    } else if cfg.image_store == NodeConfig::default().image_store {
        cfg.image_store = data_dir.join("images");
    }
    let joins: Vec<String> = args
        .join
        .iter()
        .map(|j| j.trim().trim_end_matches('/').to_string())
        .filter(|j| !j.is_empty())
        .collect();
    // The control plane is an always-denied destination of this node's sandboxes: every
    // address its `--join` names resolve to now (a name that moves later is not followed).
    for a in control_plane_addresses(&joins)? {
        cfg.network.internal.push(a.to_string());
    }
    let kill_on_exit = args.kill_sandboxes_on_exit;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    rt.block_on(async move {
        make_data_dir(&data_dir)?;
        let tcp = listen_tcp(&listen).await.with_context(|| {
            format!("the node API listening on {listen} (choose another with --listen)")
        })?;
        let (node, report) = Node::start(cfg).await?;
        let app = warren_node::api::router(node.clone(), Some(token.clone()));
        eprintln!(
            "warren: node {} serving its API on {advertise} ({} sandboxes re-adopted); joining {}",
            node.id,
            report.adopted,
            joins.join(", ")
        );
        let heartbeat = tokio::spawn(join_loop(
            joins,
            token,
            NodeRegistration {
                id: node.id.clone(),
                url: advertise,
                version: env!("CARGO_PKG_VERSION").to_string(),
            },
            node.clone(),
        ));
        serve_until_stopped(tcp, app).await;
        heartbeat.abort();
        stop_node(&node, kill_on_exit).await;
        Ok(())
    })
}

/// The addresses of the control planes a node joins, resolved once at start.
fn control_plane_addresses(joins: &[String]) -> anyhow::Result<Vec<std::net::IpAddr>> {
    use std::net::ToSocketAddrs;
    let mut out = Vec::new();
    for j in joins {
        let url = reqwest::Url::parse(j)
            .with_context(|| format!("--join {j:?} is not a URL: give http://CONTROL:7700"))?;
        let port = url.port_or_known_default().unwrap_or(80);
        let Some(host) = url.host_str() else {
            anyhow::bail!("--join {j:?} names no host: give http://CONTROL:7700");
        };
        let host = host.trim_start_matches('[').trim_end_matches(']');
        let addrs: Vec<std::net::IpAddr> = match host.parse::<std::net::IpAddr>() {
            Ok(a) => vec![a],
            // A name not resolvable yet (the node started before the cluster's DNS) does not
            // stop the node: the control plane's answer to each heartbeat names the cluster's
            // addresses to deny as well.
            Err(_) => match (host, port).to_socket_addrs() {
                Ok(a) => a.map(|a| a.ip()).collect(),
                Err(e) => {
                    tracing::warn!(
                        "resolving {host} (--join {j}): {e}; its addresses are denied to \
                         sandboxes once the control plane names them in a heartbeat's answer"
                    );
                    Vec::new()
                }
            },
        };
        out.extend(addrs);
    }
    Ok(out)
}

/// At most 16 KiB of an answer's body (a join answer is tens of bytes; a wrong `--join`
/// might be anything).
async fn bounded_body(mut resp: reqwest::Response) -> Vec<u8> {
    const MAX: usize = 16 << 10;
    let mut out = Vec::new();
    while let Ok(Some(chunk)) = resp.chunk().await {
        let room = MAX - out.len();
        out.extend_from_slice(&chunk[..chunk.len().min(room)]);
        if out.len() >= MAX {
            break;
        }
    }
    out
}

/// Joins (and then says it is still there) at the first control plane of `joins` that
/// answers, every heartbeat it is told; a failure is logged once, until it changes.
async fn join_loop(
    joins: Vec<String>,
    token: String,
    reg: NodeRegistration,
    node: std::sync::Arc<Node>,
) {
    // The cluster's addresses the control plane named, once they are denied.
    let mut denied: Vec<std::net::IpAddr> = Vec::new();
    let http = match reqwest::Client::builder()
        .timeout(Duration::from_secs(10))
        .redirect(reqwest::redirect::Policy::none())
        .build()
    {
        Ok(h) => h,
        Err(e) => {
            tracing::error!("join: {e}");
            return;
        }
    };
    let mut last_error: Option<String> = None;
    let mut joined_at: Option<String> = None;
    loop {
        let mut wait = Duration::from_secs(2);
        let mut errors = Vec::new();
        for j in &joins {
            let r = http
                .post(format!("{j}/v1/cluster/nodes"))
                .bearer_auth(&token)
                .json(&reg)
                .send()
                .await;
            match r {
                Ok(resp) => {
                    let status = resp.status();
                    let body = bounded_body(resp).await;
                    if status.is_success() {
                        match serde_json::from_slice::<NodeRegistered>(&body) {
                            Ok(a) => {
                                wait = Duration::from_millis(a.heartbeat_ms.clamp(500, 60_000));
                                if a.deny.iter().any(|x| !denied.contains(x)) {
                                    let n = node.clone();
                                    let more = a.deny.clone();
                                    let r = tokio::task::spawn_blocking(move || {
                                        n.deny_destinations(&more)
                                    })
                                    .await;
                                    match r {
                                        Ok(Ok(())) => {
                                            tracing::info!(
                                                addresses = ?a.deny,
                                                "the cluster's addresses are denied to sandboxes"
                                            );
                                            denied.extend(a.deny.iter().copied());
                                            denied.sort();
                                            denied.dedup();
                                        }
                                        Ok(Err(e)) => tracing::error!(
                                            "denying the cluster's addresses to sandboxes: {e}"
                                        ),
                                        Err(e) => tracing::error!(
                                            "denying the cluster's addresses to sandboxes: {e}"
                                        ),
                                    }
                                }
                                if joined_at.as_deref() != Some(j.as_str()) {
                                    tracing::info!(control = %j, "joined the cluster");
                                    joined_at = Some(j.clone());
                                }
                                errors.clear();
                                break;
                            }
                            Err(e) => errors.push(format!("{j}: not a join answer: {e}")),
                        }
                        continue;
                    }
                    let text = String::from_utf8_lossy(&body).into_owned();
                    let message = serde_json::from_str::<serde_json::Value>(&text)
                        .ok()
                        .and_then(|v| v["error"]["message"].as_str().map(str::to_string))
                        .unwrap_or(text);
                    errors.push(format!("{j}: {status}: {message}"));
                    wait = Duration::from_secs(5);
                }
                Err(e) => errors.push(format!("{j}: {e}")),
            }
        }
        if errors.is_empty() {
            last_error = None;
        } else {
            joined_at = None;
            let e = errors.join("; ");
            if last_error.as_deref() != Some(e.as_str()) {
                tracing::error!("could not join the cluster: {e}");
                last_error = Some(e);
            }
        }
        tokio::time::sleep(wait).await;
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn the_control_planes_a_node_joins_are_named_by_address() {
        let a = super::control_plane_addresses(&[
            "http://127.0.0.1:7700".into(),
            "http://[::1]:7700".into(),
            "http://localhost:7700".into(),
        ])
        .unwrap();
        let ip = |s: &str| s.parse::<std::net::IpAddr>().unwrap();
        assert_eq!(&a[..2], &[ip("127.0.0.1"), ip("::1")]);
        assert!(a.len() > 2, "localhost resolves: {a:?}");
        let e = super::control_plane_addresses(&["control:7700".into()]).unwrap_err();
        assert!(format!("{e:#}").contains("CONTROL:7700"), "{e:#}");
    }

    fn mode(p: &std::path::Path) -> u32 {
        std::fs::metadata(p).unwrap().permissions().mode() & 0o7777
    }

    #[test]
    fn the_data_directory_is_private_whoever_made_it() {
        let t = tempfile::tempdir().unwrap();
        let new = t.path().join("a/b");
        super::make_data_dir(&new).unwrap();
        assert_eq!(mode(&new), 0o700);
        let old = t.path().join("old");
        std::fs::create_dir(&old).unwrap();
        std::fs::set_permissions(&old, std::fs::Permissions::from_mode(0o755)).unwrap();
        super::make_data_dir(&old).unwrap();
        assert_eq!(mode(&old), 0o700);
        let shared = t.path().join("shared");
        std::fs::create_dir(&shared).unwrap();
        std::fs::set_permissions(&shared, std::fs::Permissions::from_mode(0o1777)).unwrap();
        let e = super::make_data_dir(&shared).unwrap_err().to_string();
        assert!(e.contains("shared directory"), "{e}");
        assert_eq!(mode(&shared), 0o1777, "left as it was");
        // A link in its place (another user could have made it) is not followed.
        let link = t.path().join("link");
        std::os::unix::fs::symlink(&old, &link).unwrap();
        let e = format!("{:#}", super::make_data_dir(&link).unwrap_err());
        assert!(e.contains("not a link"), "{e}");
        // Another user's directory stays theirs: refused, not closed (they could open it
        // again). Only root can make one to try.
        if rustix::process::geteuid().is_root() {
            let theirs = t.path().join("theirs");
            std::fs::create_dir(&theirs).unwrap();
            std::fs::set_permissions(&theirs, std::fs::Permissions::from_mode(0o755)).unwrap();
            std::os::unix::fs::chown(&theirs, Some(4321), Some(4321)).unwrap();
            let e = super::make_data_dir(&theirs).unwrap_err().to_string();
            assert!(e.contains("belongs to uid 4321"), "{e}");
            assert_eq!(mode(&theirs), 0o755, "left as it was");
        }
    }
}
