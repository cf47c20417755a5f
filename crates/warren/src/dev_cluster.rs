//! `warren dev cluster`: a whole cluster on one machine, for development and for the
//! multi-node tests.
//!
//! - A hub network namespace with a bridge (`10.250.0.1/24`), where the control-plane
//!   replicas (`warren server`) listen, `10.250.0.1:7700` and up.
//! - One network namespace per node daemon (`warren node --join`), joined to the bridge by a
//!   veth pair, with its own address (`10.250.0.10` and up). Cutting a node off is taking its
//!   link down.
//! - PostgreSQL (Debian's package, its own data directory, run as the `postgres` user on a
//!   unix socket), or SQLite in the replicas' shared data directory.
//! - On loopback of the namespace it was started in, a port per replica forwarded to it, so
//!   `warren --url http://127.0.0.1:PORT` and the SDKs reach the cluster.
//!
//! Every address is inside namespaces the harness made: nothing is added to or changed in the
//! namespace it runs in, beyond its loopback listeners. It reads commands on standard input —
//! `kill N`, `start N`, `cut N`, `mend N`, `restart-replica N`, `status`, `quit` — and answers
//! each with one JSON line; the first line it prints is `{"ready": ...}` with the addresses.
//! At the end (`quit`, end of input, Ctrl-C, SIGTERM) it kills every sandbox, stops every
//! process, and removes the namespaces, cgroups, mounts and directories it made.

use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use serde::Serialize;
use tokio::io::AsyncBufReadExt;

/// Options of `warren dev cluster`.
#[derive(Debug, clap::Args)]
pub struct ClusterArgs {
    /// Node daemons, each in a network namespace of its own.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u8).range(1..=32))]
    pub nodes: u8,
    /// Control-plane replicas.
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u8).range(1..=8))]
    pub replicas: u8,
    /// The replicas' shared database: `postgres` (a server the harness starts and stops) or
    /// `sqlite` (in their shared data directory).
    #[arg(long, default_value = "postgres", value_parser = ["postgres", "sqlite"])]
    pub database: String,
    /// Where everything lives (kept at the end) [default: a new directory under /tmp,
    /// removed at the end].
    #[arg(long)]
    pub dir: Option<PathBuf>,
    /// Extra TOML for every node's `[node]` table, e.g. `max_sandboxes = 8`.
    #[arg(long, default_value = "")]
    pub node_config: String,
    /// Extra TOML for the replicas' `[control]` table, e.g. `collect_interval_ms = 500`.
    #[arg(long, default_value = "")]
    pub control_config: String,
    /// Loopback port of replica 0's forwarded API; replica i gets PORT+i [default: free
    /// ports].
    #[arg(long)]
    pub port: Option<u16>,
}

/// The hub's address on its bridge; node `i` is at `.10 + i`.
const HUB: Ipv4Addr = Ipv4Addr::new(10, 250, 0, 1);
/// The replicas' first port in the hub.
const REPLICA_PORT: u16 = 7700;
/// The nodes' API port, each in its own namespace.
const NODE_PORT: u16 = 7701;

fn node_addr(i: usize) -> Ipv4Addr {
    Ipv4Addr::new(10, 250, 0, 10 + i as u8)
}

/// What the first line says.
#[derive(Debug, Serialize)]
struct Ready<'a> {
    dir: String,
    database: String,
    admin_key_file: String,
    replicas: Vec<ReplicaState>,
    nodes: Vec<NodeState<'a>>,
}

#[derive(Debug, Serialize)]
struct ReplicaState {
    index: usize,
    /// The forwarded URL on loopback.
    url: String,
    /// Its address in the hub namespace.
    inner: String,
    running: bool,
}

#[derive(Debug, Serialize)]
struct NodeState<'a> {
    index: usize,
    id: Option<String>,
    netns: &'a str,
    address: String,
    cgroup_parent: &'a str,
    running: bool,
    cut: bool,
}

/// A process of the cluster, and how to start it again.
struct Proc {
    child: Option<Child>,
    netns: String,
    args: Vec<String>,
    log: PathBuf,
}

impl Proc {
    fn spawn(&mut self) -> anyhow::Result<()> {
        if self.child.is_some() {
            bail!("it is running");
        }
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .with_context(|| format!("{}", self.log.display()))?;
        // Only the network namespace changes (`ip netns exec` would also remount /sys).
        let child = Command::new("nsenter")
            .arg(format!("--net=/run/netns/{}", self.netns))
            .arg(std::env::current_exe().context("this program's path")?)
            .args(&self.args)
            .env(
                "WARREN_LOG",
                std::env::var("WARREN_LOG").unwrap_or_else(|_| "info".into()),
            )
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .context("starting nsenter (util-linux)")?;
        self.child = Some(child);
        Ok(())
    }

    fn running(&mut self) -> bool {
        match &mut self.child {
            Some(c) => match c.try_wait() {
                Ok(None) => true,
                _ => {
                    self.child = None;
                    false
                }
            },
            None => false,
        }
    }

    fn kill9(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// SIGTERM, then SIGKILL after `grace`.
    fn stop(&mut self, grace: Duration) {
        let Some(mut c) = self.child.take() else {
            return;
        };
        // The pid is our own child's, not yet reaped: it cannot have been reused.
        if let Some(pid) = i32::try_from(c.id())
            .ok()
            .and_then(rustix::process::Pid::from_raw)
        {
            let _ = rustix::process::kill_process(pid, rustix::process::Signal::TERM);
        }
        let deadline = Instant::now() + grace;
        while Instant::now() < deadline {
            if let Ok(Some(_)) = c.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = c.kill();
        let _ = c.wait();
    }
}

struct NodeProc {
    proc_: Proc,
    dir: PathBuf,
    cgroup_parent: String,
    veth: String,
    cut: bool,
}

/// Opens TCP connections from inside the hub namespace (a thread that entered it).
#[derive(Clone)]
struct Connector {
    tx: mpsc::Sender<(
        SocketAddr,
        tokio::sync::oneshot::Sender<std::io::Result<std::net::TcpStream>>,
    )>,
}

impl Connector {
    fn start(netns: &str) -> anyhow::Result<Connector> {
        let fd = std::fs::File::open(format!("/run/netns/{netns}"))
            .with_context(|| format!("opening network namespace {netns}"))?;
        type Ask = (
            SocketAddr,
            tokio::sync::oneshot::Sender<std::io::Result<std::net::TcpStream>>,
        );
        let (tx, rx) = mpsc::channel::<Ask>();
        let (ok_tx, ok_rx) = mpsc::channel();
        std::thread::Builder::new()
            .name("dev-cluster-hub".into())
            .spawn(move || {
                let entered = rustix::thread::move_into_link_name_space(
                    std::os::fd::AsFd::as_fd(&fd),
                    Some(rustix::thread::LinkNameSpaceType::Network),
                );
                let _ = ok_tx.send(entered.map_err(std::io::Error::from));
                for (addr, reply) in rx {
                    let s = std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(3));
                    let _ = reply.send(s);
                }
            })?;
        ok_rx
            .recv()
            .context("the hub thread")?
            .context("entering the hub namespace")?;
        Ok(Connector { tx })
    }

    async fn connect(&self, addr: SocketAddr) -> std::io::Result<tokio::net::TcpStream> {
        let (reply, rx) = tokio::sync::oneshot::channel();
        self.tx
            .send((addr, reply))
            .map_err(|_| std::io::Error::other("the hub thread is gone"))?;
        let s = rx
            .await
            .map_err(|_| std::io::Error::other("the hub thread is gone"))??;
        s.set_nonblocking(true)?;
        s.set_nodelay(true)?;
        tokio::net::TcpStream::from_std(s)
    }
}

/// Forwards connections to `listener` to `inner` in the hub, until the process ends.
fn forward(listener: tokio::net::TcpListener, inner: SocketAddr, hub: Connector) {
    tokio::spawn(async move {
        while let Ok((mut outer, _)) = listener.accept().await {
            let hub = hub.clone();
            tokio::spawn(async move {
                if let Ok(mut s) = hub.connect(inner).await {
                    let _ = tokio::io::copy_bidirectional(&mut outer, &mut s).await;
                }
            });
        }
    });
}

/// The cluster, as far as it was made.
struct Harness {
    dir: PathBuf,
    remove_dir: bool,
    tag: String,
    hub: Option<String>,
    netns: Vec<String>,
    pg: Option<(warren_control::local_pg::LocalPostgres, tempfile::TempDir)>,
    database: String,
    replicas: Vec<(Proc, u16)>,
    nodes: Vec<NodeProc>,
    connector: Option<Connector>,
    admin_key: String,
}

fn ip(args: &[&str]) -> anyhow::Result<()> {
    let o = Command::new("ip")
        .args(args)
        .output()
        .context("running ip (iproute2)")?;
    if !o.status.success() {
        bail!(
            "ip {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&o.stderr).trim()
        );
    }
    Ok(())
}

impl Harness {
    fn hub(&self) -> &str {
        self.hub.as_deref().unwrap_or("")
    }

    fn control_dir(&self) -> PathBuf {
        self.dir.join("control")
    }

    fn make_hub(&mut self) -> anyhow::Result<()> {
        let hub = format!("{}-hub", self.tag);
        ip(&["netns", "add", &hub])?;
        self.hub = Some(hub.clone());
        ip(&["-n", &hub, "link", "set", "lo", "up"])?;
        ip(&["-n", &hub, "link", "add", "br0", "type", "bridge"])?;
        ip(&[
            "-n",
            &hub,
            "addr",
            "add",
            &format!("{HUB}/24"),
            "dev",
            "br0",
        ])?;
        ip(&["-n", &hub, "link", "set", "br0", "up"])?;
        self.connector = Some(Connector::start(&hub)?);
        Ok(())
    }

    fn add_replica(&mut self, control_config: &str) -> anyhow::Result<()> {
        let i = self.replicas.len();
        let cfg = self.dir.join("server.toml");
        if !cfg.exists() {
            std::fs::write(&cfg, format!("[control]\n{control_config}\n"))?;
        }
        let mut args = vec![
            "server".to_string(),
            "--data-dir".into(),
            self.control_dir().display().to_string(),
            "--listen".into(),
            format!("{HUB}:{}", REPLICA_PORT + i as u16),
            "--config".into(),
            cfg.display().to_string(),
        ];
        if let Some((pg, _)) = &self.pg {
            args.push("--database".into());
            args.push(pg.url.clone());
        }
        let mut p = Proc {
            child: None,
            netns: self.hub().to_string(),
            args,
            log: self.dir.join(format!("server-{i}.log")),
        };
        p.spawn()?;
        self.replicas.push((p, 0));
        Ok(())
    }

    fn add_node(&mut self, node_config: &str) -> anyhow::Result<()> {
        let i = self.nodes.len();
        let ns = format!("{}-n{i}", self.tag);
        ip(&["netns", "add", &ns])?;
        self.netns.push(ns.clone());
        let hub = self.hub().to_string();
        let veth = format!("n{i}");
        ip(&["-n", &ns, "link", "set", "lo", "up"])?;
        ip(&[
            "-n", &hub, "link", "add", &veth, "type", "veth", "peer", "name", "eth0", "netns", &ns,
        ])?;
        ip(&["-n", &hub, "link", "set", &veth, "master", "br0"])?;
        ip(&["-n", &hub, "link", "set", &veth, "up"])?;
        let addr = node_addr(i);
        ip(&[
            "-n",
            &ns,
            "addr",
            "add",
            &format!("{addr}/24"),
            "dev",
            "eth0",
        ])?;
        ip(&["-n", &ns, "link", "set", "eth0", "up"])?;
        let dir = self.dir.join(format!("node-{i}"));
        std::fs::create_dir_all(&dir)?;
        let cfg = dir.join("config.toml");
        std::fs::write(
            &cfg,
            format!("[node]\n{node_config}\n\n[node.network]\nenabled = false\n"),
        )?;
        let cgroup_parent = format!("{}-n{i}", self.tag);
        let joins: Vec<String> = (0..self.replicas.len())
            .map(|r| format!("http://{HUB}:{}", REPLICA_PORT + r as u16))
            .collect();
        let args = vec![
            "node".to_string(),
            "--join".into(),
            joins.join(","),
            "--cluster-token-file".into(),
            self.control_dir()
                .join("cluster.token")
                .display()
                .to_string(),
            "--listen".into(),
            format!("{addr}:{NODE_PORT}"),
            "--advertise".into(),
            format!("http://{addr}:{NODE_PORT}"),
            "--data-dir".into(),
            dir.display().to_string(),
            "--image-store".into(),
            self.control_dir().join("images").display().to_string(),
            "--cgroup-parent".into(),
            cgroup_parent.clone(),
            "--config".into(),
            cfg.display().to_string(),
            "--kill-sandboxes-on-exit".into(),
        ];
        let mut p = Proc {
            child: None,
            netns: ns,
            args,
            log: self.dir.join(format!("node-{i}.log")),
        };
        p.spawn()?;
        self.nodes.push(NodeProc {
            proc_: p,
            dir,
            cgroup_parent,
            veth,
            cut: false,
        });
        Ok(())
    }

    /// An HTTP client of replica `r`'s forwarded port, with the admin key.
    fn client(&self, r: usize) -> anyhow::Result<warren_sdk::Client> {
        let url = format!("http://127.0.0.1:{}", self.replicas[r].1);
        Ok(warren_sdk::Client::new(&url, Some(&self.admin_key))?)
    }

    /// Waits until replica `r`'s `GET /v1/health` answers 200.
    async fn wait_replica(&mut self, r: usize, within: Duration) -> anyhow::Result<()> {
        let deadline = Instant::now() + within;
        let inner = SocketAddr::V4(SocketAddrV4::new(HUB, REPLICA_PORT + r as u16));
        let hub = self.connector.clone().context("no hub")?;
        loop {
            if !self.replicas[r].0.running() {
                bail!(
                    "replica {r} exited; its log is {}",
                    self.replicas[r].0.log.display()
                );
            }
            if let Ok(s) = hub.connect(inner).await
                && health(s).await
            {
                return Ok(());
            }
            if Instant::now() > deadline {
                bail!(
                    "replica {r} did not answer within {within:?}; its log is {}",
                    self.replicas[r].0.log.display()
                );
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Waits until replica `r` lists every node, answering.
    async fn wait_nodes(&mut self, r: usize, within: Duration) -> anyhow::Result<()> {
        let deadline = Instant::now() + within;
        let want = self.nodes.len();
        let c = self.client(r)?;
        loop {
            if let Ok(l) = c.nodes().await
                && l.items.len() == want
                && l.items.iter().all(|n| n.reachable)
            {
                return Ok(());
            }
            if Instant::now() > deadline {
                bail!(
                    "replica {r} does not see all {want} nodes answering within {within:?}; \
                     the logs are in {}",
                    self.dir.display()
                );
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    fn node_id(&self, i: usize) -> Option<String> {
        std::fs::read_to_string(self.nodes[i].dir.join("node").join("node.id"))
            .ok()
            .map(|s| s.trim().to_string())
    }

    fn state(&mut self) -> Ready<'_> {
        let running: Vec<bool> = self.nodes.iter_mut().map(|n| n.proc_.running()).collect();
        let replicas_running: Vec<bool> =
            self.replicas.iter_mut().map(|(p, _)| p.running()).collect();
        let ids: Vec<Option<String>> = (0..self.nodes.len()).map(|i| self.node_id(i)).collect();
        Ready {
            dir: self.dir.display().to_string(),
            database: self.database.clone(),
            admin_key_file: self.control_dir().join("admin.key").display().to_string(),
            replicas: self
                .replicas
                .iter()
                .enumerate()
                .map(|(i, (_, port))| ReplicaState {
                    index: i,
                    url: format!("http://127.0.0.1:{port}"),
                    inner: format!("http://{HUB}:{}", REPLICA_PORT + i as u16),
                    running: replicas_running[i],
                })
                .collect(),
            nodes: self
                .nodes
                .iter()
                .enumerate()
                .map(|(i, n)| NodeState {
                    index: i,
                    id: ids[i].clone(),
                    netns: &n.proc_.netns,
                    address: format!("http://{}:{NODE_PORT}", node_addr(i)),
                    cgroup_parent: &n.cgroup_parent,
                    running: running[i],
                    cut: n.cut,
                })
                .collect(),
        }
    }

    fn node_index(&self, arg: Option<&str>) -> anyhow::Result<usize> {
        let i: usize = arg
            .context("give the node's index")?
            .parse()
            .context("the node's index is a number")?;
        if i >= self.nodes.len() {
            bail!("no node {i}: nodes are 0 to {}", self.nodes.len() - 1);
        }
        Ok(i)
    }

    /// Runs one command line; the answer's text.
    async fn command(&mut self, line: &str) -> anyhow::Result<String> {
        let mut words = line.split_whitespace();
        let cmd = words.next().unwrap_or("");
        let arg = words.next();
        match cmd {
            "kill" => {
                let i = self.node_index(arg)?;
                if !self.nodes[i].proc_.running() {
                    bail!("node {i} is not running");
                }
                self.nodes[i].proc_.kill9();
                Ok(format!("node {i} killed (SIGKILL); its sandboxes run on"))
            }
            "start" => {
                let i = self.node_index(arg)?;
                self.nodes[i].proc_.spawn()?;
                Ok(format!("node {i} started"))
            }
            "cut" | "mend" => {
                let i = self.node_index(arg)?;
                let up = cmd == "mend";
                let hub = self.hub().to_string();
                let veth = self.nodes[i].veth.clone();
                ip(&[
                    "-n",
                    &hub,
                    "link",
                    "set",
                    &veth,
                    if up { "up" } else { "down" },
                ])?;
                self.nodes[i].cut = !up;
                Ok(if up {
                    format!("node {i}'s link is up again")
                } else {
                    format!("node {i} cut off (its link is down)")
                })
            }
            "restart-replica" => {
                let r: usize = arg
                    .context("give the replica's index")?
                    .parse()
                    .context("the replica's index is a number")?;
                if r >= self.replicas.len() {
                    bail!("no replica {r}");
                }
                self.replicas[r].0.stop(Duration::from_secs(30));
                self.replicas[r].0.spawn()?;
                self.wait_replica(r, Duration::from_secs(60)).await?;
                Ok(format!("replica {r} restarted and answering"))
            }
            "status" => Ok(serde_json::to_string(&self.state())?),
            "" => bail!("empty command"),
            other => bail!(
                "unknown command {other:?}: kill N, start N, cut N, mend N, restart-replica N, \
                 status, quit"
            ),
        }
    }

    /// Kills every sandbox, stops every process, removes what was made.
    async fn teardown(&mut self) {
        // Every node running and reachable, so that it kills its sandboxes as it stops.
        let hub = self.hub().to_string();
        for i in 0..self.nodes.len() {
            if self.nodes[i].cut {
                let veth = self.nodes[i].veth.clone();
                let _ = ip(&["-n", &hub, "link", "set", &veth, "up"]);
                self.nodes[i].cut = false;
            }
            if !self.nodes[i].proc_.running() {
                let _ = self.nodes[i].proc_.spawn();
            }
        }
        // Started again: give each a moment to re-adopt what it ran.
        let deadline = Instant::now() + Duration::from_secs(30);
        for i in 0..self.nodes.len() {
            let addr = SocketAddr::V4(SocketAddrV4::new(node_addr(i), NODE_PORT));
            while Instant::now() < deadline && self.nodes[i].proc_.running() {
                match &self.connector {
                    Some(c) if c.connect(addr).await.is_ok() => break,
                    Some(_) => tokio::time::sleep(Duration::from_millis(100)).await,
                    None => break,
                }
            }
        }
        let nodes = std::mem::take(&mut self.nodes);
        let mut handles = Vec::new();
        for mut n in nodes {
            handles.push(tokio::task::spawn_blocking(move || {
                n.proc_.stop(Duration::from_secs(60));
                n
            }));
        }
        for h in handles {
            if let Ok(n) = h.await {
                self.nodes.push(n);
            }
        }
        for (p, _) in &mut self.replicas {
            p.stop(Duration::from_secs(30));
        }
        if let Some((pg, _dir)) = self.pg.take() {
            pg.stop();
        }
        // Whatever a node could not remove itself.
        for n in &self.nodes {
            if let Ok(cg) = warren_node::container::cgroups::Cgroups::new(&n.cgroup_parent)
                && let Err(e) = cg.remove_all()
            {
                eprintln!("warren: cgroup {}: {e}", n.cgroup_parent);
            }
        }
        let root = self.dir.display().to_string();
        let mut mounts: Vec<String> = std::fs::read_to_string("/proc/self/mountinfo")
            .unwrap_or_default()
            .lines()
            .filter_map(|l| l.split(' ').nth(4).map(str::to_string))
            .filter(|p| p.starts_with(&format!("{root}/")))
            .collect();
        mounts.sort_by_key(|p| std::cmp::Reverse(p.len()));
        for m in mounts {
            let _ = Command::new("umount").arg("-l").arg(&m).status();
        }
        for ns in self.netns.drain(..).rev() {
            let _ = ip(&["netns", "del", &ns]);
        }
        if let Some(h) = self.hub.take() {
            let _ = ip(&["netns", "del", &h]);
        }
        if self.remove_dir
            && let Err(e) = warren_fs::remove_path(&self.dir)
        {
            eprintln!("warren: removing {}: {e}", self.dir.display());
        }
    }
}

/// Whether `GET /v1/health` on `s` answers 200.
async fn health(mut s: tokio::net::TcpStream) -> bool {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    if s.write_all(b"GET /v1/health HTTP/1.0\r\nHost: warren\r\n\r\n")
        .await
        .is_err()
    {
        return false;
    }
    let mut buf = [0u8; 16];
    matches!(
        tokio::time::timeout(Duration::from_secs(2), s.read(&mut buf)).await,
        Ok(Ok(n)) if n >= 12 && &buf[9..12] == b"200"
    )
}

/// `warren dev cluster`.
pub fn run(args: ClusterArgs) -> anyhow::Result<()> {
    if !rustix::process::geteuid().is_root() {
        bail!("warren dev cluster makes network namespaces and cgroups: run it as root");
    }
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?
        .block_on(run_async(args))
}

async fn run_async(args: ClusterArgs) -> anyhow::Result<()> {
    let suffix: String = (0..5)
        .map(|_| char::from(b'a' + rand::random_range(0..26u8)))
        .collect();
    let tag = format!("wdc{suffix}");
    let (dir, remove_dir) = match &args.dir {
        Some(d) => {
            std::fs::create_dir_all(d).with_context(|| format!("{}", d.display()))?;
            (d.canonicalize()?, false)
        }
        None => (
            tempfile::Builder::new()
                .prefix("warren-dev-cluster-")
                .tempdir()?
                .keep(),
            true,
        ),
    };
    let mut h = Harness {
        dir,
        remove_dir,
        tag,
        hub: None,
        netns: Vec::new(),
        pg: None,
        database: args.database.clone(),
        replicas: Vec::new(),
        nodes: Vec::new(),
        connector: None,
        admin_key: String::new(),
    };
    let outcome = serve(&mut h, &args).await;
    h.teardown().await;
    outcome
}

async fn serve(h: &mut Harness, args: &ClusterArgs) -> anyhow::Result<()> {
    h.make_hub()?;
    if args.database == "postgres" {
        // Its own directory under /tmp: the postgres user must reach it.
        let d = tempfile::Builder::new()
            .prefix("warren-dev-pg-")
            .tempdir()?;
        let path = d.path().to_path_buf();
        let pg = tokio::task::spawn_blocking(move || {
            warren_control::local_pg::LocalPostgres::start(&path)
        })
        .await?
        .map_err(anyhow::Error::msg)?;
        h.database = pg.url.clone();
        h.pg = Some((pg, d));
    }
    std::fs::create_dir_all(h.control_dir())?;
    for r in 0..args.replicas as usize {
        h.add_replica(&args.control_config)?;
        // The first makes the admin key and the cluster token the others read.
        h.wait_replica(r, Duration::from_secs(60)).await?;
    }
    h.admin_key = std::fs::read_to_string(h.control_dir().join("admin.key"))
        .context("the admin key")?
        .trim()
        .to_string();
    let hub = h.connector.clone().context("no hub")?;
    for r in 0..h.replicas.len() {
        let port = args.port.map(|p| p.saturating_add(r as u16)).unwrap_or(0);
        let l = tokio::net::TcpListener::bind(("127.0.0.1", port))
            .await
            .with_context(|| format!("listening on 127.0.0.1:{port}"))?;
        h.replicas[r].1 = l.local_addr()?.port();
        let inner = SocketAddr::V4(SocketAddrV4::new(HUB, REPLICA_PORT + r as u16));
        forward(l, inner, hub.clone());
    }
    for _ in 0..args.nodes {
        h.add_node(&args.node_config)?;
    }
    for r in 0..h.replicas.len() {
        h.wait_nodes(r, Duration::from_secs(90)).await?;
    }
    println!(
        "{}",
        serde_json::to_string(&serde_json::json!({ "ready": h.state() }))?
    );
    eprintln!(
        "warren: dev cluster up: {} replicas ({}), {} nodes; commands: kill N, start N, cut N, \
         mend N, restart-replica N, status, quit",
        h.replicas.len(),
        h.replicas
            .iter()
            .map(|(_, p)| format!("http://127.0.0.1:{p}"))
            .collect::<Vec<_>>()
            .join(", "),
        h.nodes.len()
    );
    let mut lines = tokio::io::BufReader::new(tokio::io::stdin()).lines();
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    loop {
        let line = tokio::select! {
            l = lines.next_line() => l?,
            _ = tokio::signal::ctrl_c() => None,
            _ = term.recv() => None,
        };
        let Some(line) = line else { break };
        let line = line.trim();
        if line == "quit" {
            break;
        }
        let answer = match h.command(line).await {
            Ok(msg) if line == "status" => format!("{{\"status\":{msg}}}"),
            Ok(msg) => serde_json::json!({ "ok": msg }).to_string(),
            Err(e) => serde_json::json!({ "error": format!("{e:#}") }).to_string(),
        };
        println!("{answer}");
    }
    eprintln!("warren: stopping the dev cluster");
    Ok(())
}
