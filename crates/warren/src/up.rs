//! `warren up`: the control plane and a node daemon in one process, on one machine.
//!
//! The node serves its API on a unix socket in the data directory (`node.sock`, mode 0600); the
//! control plane reaches it there, exactly as it would reach a remote node over TCP. Stopping
//! `warren up` (Ctrl-C, SIGTERM) leaves sandboxes running; the next `warren up` re-adopts them.

use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::PathBuf;

use anyhow::Context;
use axum::serve::ListenerExt;
use serde::Deserialize;
use warren_control::{Control, ControlConfig, Endpoint};
use warren_node::{Node, NodeConfig};

/// How long requests in flight may take to finish once `warren up` is asked to stop.
const SHUTDOWN_GRACE: std::time::Duration = std::time::Duration::from_secs(10);

/// Options of `warren up`. Flags override the config file; the file overrides defaults.
#[derive(Debug, Clone, clap::Args)]
#[command(
    after_help = "Examples:\n  warren up\n  warren up --data-dir /srv/warren --listen 0.0.0.0:7700\n  warren up --config /etc/warren/warren.toml\n\n\
The first start writes an admin API key to <data-dir>/admin.key (mode 0600); the CLI on this\n\
machine reads it from there. Elsewhere, export WARREN_URL and WARREN_API_KEY."
)]
pub struct UpArgs {
    /// Data directory (database, admin key, node state).
    #[arg(long, env = "WARREN_DATA_DIR")]
    pub data_dir: Option<PathBuf>,
    /// Address the REST API listens on [default: 127.0.0.1:7700].
    #[arg(long, env = "WARREN_LISTEN")]
    pub listen: Option<String>,
    /// TOML config file: top-level `data_dir`, `listen`, and `[node]`, `[control]` tables
    /// (see docs/configuration.md).
    #[arg(long, env = "WARREN_CONFIG")]
    pub config: Option<PathBuf>,
    /// The image layer store, a directory shared by every node in a cluster
    /// [default: <data-dir>/images].
    #[arg(long, env = "WARREN_IMAGE_STORE")]
    pub image_store: Option<PathBuf>,
    /// Name of Warren's parent cgroup [default: warren].
    #[arg(long, env = "WARREN_CGROUP_PARENT")]
    pub cgroup_parent: Option<String>,
    /// Kill every sandbox when stopping, instead of leaving them for the next start.
    #[arg(long)]
    pub kill_sandboxes_on_exit: bool,
    /// Address the E2B-compatible gateway listens on, or `off` [default: 127.0.0.1:7701]. Its
    /// key is in <data-dir>/e2b.key: E2B_API_KEY=$(cat that) E2B_API_URL=http://ADDR
    /// E2B_SANDBOX_URL=http://ADDR.
    #[arg(long, env = "WARREN_E2B_LISTEN")]
    pub e2b_listen: Option<String>,
    /// Address of a keyless SandboxFusion `/run_code` listener, for frameworks that cannot
    /// send a key [default: none]. Every request on it acts as the key in --run-code-key-file:
    /// bind it to loopback or to an address only the job reaches (see docs/fncall.md).
    #[arg(long, env = "WARREN_RUN_CODE_LISTEN", requires = "run_code_key_file")]
    pub run_code_listen: Option<String>,
    /// The file holding the key the keyless /run_code listener acts as (read at each request),
    /// e.g. one made with `warren key create --project root/rl --role runner`.
    #[arg(long, env = "WARREN_RUN_CODE_KEY_FILE")]
    pub run_code_key_file: Option<PathBuf>,
}

/// The config file of `warren up`.
#[derive(Debug, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub(crate) struct FileConfig {
    pub(crate) data_dir: Option<PathBuf>,
    pub(crate) listen: Option<String>,
    pub(crate) e2b_listen: Option<String>,
    pub(crate) run_code_listen: Option<String>,
    pub(crate) run_code_key_file: Option<PathBuf>,
    pub(crate) node: Option<NodeConfig>,
    pub(crate) control: Option<ControlConfig>,
}

/// Runs the all-in-one platform until Ctrl-C or SIGTERM.
pub fn run(args: UpArgs) -> anyhow::Result<()> {
    init_logging();
    if !is_root() {
        anyhow::bail!(
            "warren up needs root: it creates namespaces, cgroups and mounts for sandboxes (run it with sudo, or as root)"
        );
    }
    let file: FileConfig = match &args.config {
        Some(p) => {
            let raw = std::fs::read_to_string(p)
                .with_context(|| format!("reading config {}", p.display()))?;
            toml::from_str(&raw).with_context(|| format!("config {}", p.display()))?
        }
        None => FileConfig::default(),
    };
    let data_dir = args
        .data_dir
        .clone()
        .or(file.data_dir)
        .unwrap_or_else(|| PathBuf::from("/var/lib/warren"));
    let listen = args
        .listen
        .clone()
        .or(file.listen)
        .unwrap_or_else(|| "127.0.0.1:7700".to_string());
    let e2b_listen = args
        .e2b_listen
        .clone()
        .or(file.e2b_listen)
        .unwrap_or_else(|| "127.0.0.1:7701".to_string());
    let e2b_listen = (e2b_listen != "off").then_some(e2b_listen);
    let run_code = match (
        args.run_code_listen.clone().or(file.run_code_listen),
        args.run_code_key_file.clone().or(file.run_code_key_file),
    ) {
        (Some(a), Some(k)) => Some((a, k)),
        (None, _) => None,
        (Some(_), None) => anyhow::bail!(
            "run_code_listen needs run_code_key_file: the key every request on that listener \
             acts as (make one with `warren key create --project root/rl --role runner` and \
             save it to a file only root reads)"
        ),
    };
    let mut node_cfg = file.node.unwrap_or_default();
    if file_sets_no_state_dir(&node_cfg) {
        node_cfg.state_dir = data_dir.join("node");
    }
    if let Some(p) = &args.cgroup_parent {
        node_cfg.cgroup_parent = p.clone();
    }
    let mut control_cfg = file.control.unwrap_or_default();
    control_cfg.data_dir = data_dir.clone();
    let store = args
        .image_store
        .clone()
        .or(control_cfg.image_store.clone())
        .or_else(|| {
            (node_cfg.image_store != NodeConfig::default().image_store)
                .then(|| node_cfg.image_store.clone())
        })
        .unwrap_or_else(|| data_dir.join("images"));
    node_cfg.image_store = store.clone();
    control_cfg.image_store = Some(store);

    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    rt.block_on(serve(
        data_dir,
        listen,
        e2b_listen,
        run_code,
        node_cfg,
        control_cfg,
        args.kill_sandboxes_on_exit,
    ))
}

/// Listens on `addr` with `SO_REUSEADDR`, so a restart right after a crash is not refused
/// while the old process's connections sit in TIME_WAIT.
pub(crate) async fn listen_tcp(addr: &str) -> std::io::Result<tokio::net::TcpListener> {
    let mut last = None;
    for a in tokio::net::lookup_host(addr).await? {
        let socket = if a.is_ipv4() {
            tokio::net::TcpSocket::new_v4()?
        } else {
            tokio::net::TcpSocket::new_v6()?
        };
        socket.set_reuseaddr(true)?;
        match socket.bind(a).and_then(|()| socket.listen(1024)) {
            Ok(l) => return Ok(l),
            Err(e) => last = Some(e),
        }
    }
    Err(last.unwrap_or_else(|| std::io::Error::other("the address resolves to nothing")))
}

/// Sends each write at once (`TCP_NODELAY`): a streamed answer (exec events, a process's
/// output, the E2B gateway's Connect streams) is written in small pieces, and with Nagle's
/// algorithm each piece after the first waited for the client's delayed ACK, ~40 ms.
pub(crate) fn no_delay(tcp: &mut tokio::net::TcpStream) {
    let _ = tcp.set_nodelay(true);
}

pub(crate) fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("Uid:"))
                .map(|l| l.split_whitespace().nth(2) == Some("0"))
        })
        .unwrap_or(false)
}

pub(crate) fn file_sets_no_state_dir(cfg: &NodeConfig) -> bool {
    cfg.state_dir == NodeConfig::default().state_dir
}

pub(crate) fn init_logging() {
    let filter = tracing_subscriber::EnvFilter::try_from_env("WARREN_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .try_init();
}

async fn serve(
    data_dir: PathBuf,
    listen: String,
    e2b_listen: Option<String>,
    run_code: Option<(String, PathBuf)>,
    node_cfg: NodeConfig,
    control_cfg: ControlConfig,
    kill_on_exit: bool,
) -> anyhow::Result<()> {
    crate::daemons::make_data_dir(&data_dir)?;
    let tcp = listen_tcp(&listen).await.with_context(|| {
        format!(
            "listening on {listen} (is another warren up running? choose another with --listen)"
        )
    })?;
    // The gateway's key is read (or made) before anything starts: a bad one stops here.
    let e2b_key = match &e2b_listen {
        Some(_) => Some(e2b_key(&data_dir)?),
        None => None,
    };
    let e2b_tcp = match &e2b_listen {
        Some(a) => Some(listen_tcp(a).await.with_context(|| {
            format!("the E2B gateway listening on {a} (choose another with --e2b-listen, or `off`)")
        })?),
        None => None,
    };

    let run_code_tcp = match &run_code {
        Some((a, _)) => Some(listen_tcp(a).await.with_context(|| {
            format!("the keyless /run_code listener on {a} (choose another with --run-code-listen)")
        })?),
        None => None,
    };

    let (node, report) = Node::start(node_cfg).await?;
    let sock = data_dir.join("node.sock");
    let _ = std::fs::remove_file(&sock);
    let node_listener = tokio::net::UnixListener::bind(&sock)
        .with_context(|| format!("binding {}", sock.display()))?;
    std::fs::set_permissions(&sock, std::fs::Permissions::from_mode(0o600))?;
    let node_app = warren_node::api::router(node.clone(), None);
    let node_server = tokio::spawn(warren_http::serve::serve(
        node_listener,
        node_app,
        std::future::pending(),
    ));

    let sandbox_domain = control_cfg.sandbox_domain.clone();
    let started = Control::start(control_cfg, &[Endpoint::Unix(sock.clone())]).await?;
    let key_file = data_dir.join("admin.key");
    if started.new_admin_key.is_some() {
        eprintln!(
            "warren: created an admin API key in {} (mode 0600).\n        The CLI on this machine uses it; elsewhere: export WARREN_API_KEY=$(cat {})",
            key_file.display(),
            key_file.display()
        );
    }
    let app = warren_control::api::router(started.control.clone());
    let e2b_server = match (e2b_tcp, &e2b_listen, e2b_key) {
        (Some(tcp), Some(addr), Some(key)) => {
            let gw = e2b_gateway(&data_dir, &listen, key, sandbox_domain)?;
            eprintln!(
                "warren: serving the E2B gateway on http://{addr}: E2B_API_KEY=$(cat {}) \
                 E2B_API_URL=http://{addr} E2B_SANDBOX_URL=http://{addr}",
                data_dir.join("e2b.key").display()
            );
            Some(tokio::spawn(warren_http::serve::serve(
                tcp.tap_io(no_delay),
                warren_e2b::router(std::sync::Arc::new(gw)),
                std::future::pending(),
            )))
        }
        _ => None,
    };
    let run_code_server = match (run_code_tcp, &run_code) {
        (Some(tcp), Some((addr, key_file))) => {
            eprintln!(
                "warren: serving SandboxFusion's /run_code without a key on http://{addr}: \
                 every request there acts as the key in {}",
                key_file.display()
            );
            Some(tokio::spawn(warren_http::serve::serve(
                tcp.tap_io(no_delay),
                warren_control::api::keyless_router(started.control.clone(), key_file.clone()),
                std::future::pending(),
            )))
        }
        _ => None,
    };
    eprintln!(
        "warren: serving http://{listen} (node {}, {} sandboxes re-adopted). Try: warren sandbox create --image host",
        node.id, report.adopted
    );
    serve_until_stopped(tcp, app).await;
    if let Some(s) = e2b_server {
        s.abort();
    }
    if let Some(s) = run_code_server {
        s.abort();
    }
    // The control plane goes first, so its collector stops polling the node.
    drop(started);
    node_server.abort();
    let _ = std::fs::remove_file(&sock);
    stop_node(&node, kill_on_exit).await;
    Ok(())
}

/// Serves `app` on `tcp` until Ctrl-C or SIGTERM; then stops accepting and gives requests in
/// flight (streams included) a grace period, and stops anyway.
pub(crate) async fn serve_until_stopped(tcp: tokio::net::TcpListener, app: axum::Router) {
    let (stopping_tx, stopping_rx) = tokio::sync::oneshot::channel::<()>();
    let server = warren_http::serve::serve(tcp.tap_io(no_delay), app, async move {
        shutdown_signal().await;
        let _ = stopping_tx.send(());
    });
    let grace = async move {
        if stopping_rx.await.is_ok() {
            tokio::time::sleep(SHUTDOWN_GRACE).await;
        } else {
            std::future::pending::<()>().await;
        }
    };
    tokio::select! {
        () = server => {}
        _ = grace => eprintln!(
            "warren: requests still in flight after {} s; stopping anyway",
            SHUTDOWN_GRACE.as_secs()
        ),
    }
}

/// Stops a node daemon: its sandboxes are left running (and their layers mounted, their
/// firewall kept) for the next start, or all killed and everything removed.
pub(crate) async fn stop_node(node: &std::sync::Arc<Node>, kill_on_exit: bool) {
    node.shutdown().await;
    if kill_on_exit {
        let n = node.kill_all().await;
        eprintln!("warren: killed {n} sandboxes");
        // Nothing runs any more: layer mounts and Warren's parent cgroups go too.
        node.unmount_unused_layers();
        node.unmount_disk_pool_if_unused();
        if let Err(e) = node.remove_cgroups() {
            eprintln!("warren: could not remove its cgroups: {e}");
        }
    } else {
        // Layers no sandbox uses are unmounted; the running sandboxes' stay for the next start.
        node.unmount_unused_layers();
        node.unmount_disk_pool_if_unused();
        // Their firewall stays too: it keeps enforcing their policies while no daemon runs.
        node.remove_network_if_unused();
        eprintln!("warren: stopped; sandboxes keep running and are re-adopted on the next start");
    }
}

/// The E2B gateway's key: `<data-dir>/e2b.key`, made at the first start (mode 0600).
pub(crate) fn e2b_key(data_dir: &std::path::Path) -> anyhow::Result<String> {
    let key_file = data_dir.join("e2b.key");
    let key = match std::fs::read_to_string(&key_file) {
        Ok(k) => k.trim().to_string(),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let k = warren_e2b::keys::new_key();
            let mut f = std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(&key_file)
                .with_context(|| format!("creating {}", key_file.display()))?;
            std::io::Write::write_all(&mut f, format!("{k}\n").as_bytes())?;
            k
        }
        Err(e) => return Err(e).with_context(|| format!("reading {}", key_file.display())),
    };
    if !warren_e2b::keys::is_key_form(&key) {
        anyhow::bail!(
            "{} does not hold an E2B-form key (e2b_ and 40 hex digits): remove it to have a new \
             one made, or start with --e2b-listen off",
            key_file.display()
        );
    }
    Ok(key)
}

/// The E2B gateway, acting on the REST API at `listen` with the admin key.
pub(crate) fn e2b_gateway(
    data_dir: &std::path::Path,
    listen: &str,
    key: String,
    domain: Option<String>,
) -> anyhow::Result<warren_e2b::Gateway> {
    let admin = std::fs::read_to_string(warren_sdk::config::key_file(data_dir))
        .with_context(|| "reading the admin key the E2B gateway acts with")?;
    let warren = warren_sdk::Client::new(&format!("http://{listen}"), Some(admin.trim()))?;
    // What signs envd access tokens: only the gateway reads it.
    let secret_file = data_dir.join("e2b-token.secret");
    let secret = warren_e2b::keys::token_secret(&secret_file)
        .with_context(|| format!("the E2B gateway's token secret {}", secret_file.display()))?;
    let tokens = warren_e2b::tokens::Tokens::new(warren_e2b::keys::TokenKey::new(&secret, &key));
    Ok(warren_e2b::Gateway {
        warren,
        key,
        base_image: "host".into(),
        domain,
        caller: None,
        tokens: std::sync::Arc::new(tokens),
    })
}

pub(crate) async fn shutdown_signal() {
    let mut term = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
        Ok(s) => s,
        Err(_) => return std::future::pending().await,
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
}
