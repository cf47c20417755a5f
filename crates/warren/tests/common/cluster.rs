//! A cluster on this machine for integration tests: control-plane replicas (`warren server`,
//! sharing one data directory, so one SQLite database, admin key and cluster token) and node
//! daemons (`warren node --join`), each with its own data directory, port and cgroup parent.
//! Everything talks over loopback. The teardown removes every process, cgroup and mount it
//! made, even when the test fails.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use warren_sdk::Client;

use super::{free_port, warren_bin};

/// A process the cluster started, and how to start it again.
struct Proc {
    child: Option<Child>,
    args: Vec<String>,
    log: PathBuf,
}

impl Proc {
    fn start(args: Vec<String>, log: PathBuf) -> Proc {
        let mut p = Proc {
            child: None,
            args,
            log,
        };
        p.spawn();
        p
    }

    fn spawn(&mut self) {
        assert!(self.child.is_none(), "already running");
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .unwrap();
        let child = Command::new(warren_bin())
            .args(&self.args)
            .env("WARREN_LOG", "info")
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("spawn warren");
        self.child = Some(child);
    }

    fn kill9(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    fn term(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = Command::new("kill")
                .arg("-TERM")
                .arg(c.id().to_string())
                .status();
            let _ = c.wait();
        }
    }

    fn exited(&mut self) -> Option<std::process::ExitStatus> {
        self.child
            .as_mut()
            .and_then(|c| c.try_wait().ok().flatten())
    }
}

/// A node daemon of the cluster.
pub struct NodeProc {
    proc_: Proc,
    /// Its data directory (its state is in `node/` there).
    pub dir: PathBuf,
    /// Its API's port.
    pub port: u16,
    /// Its parent cgroup.
    pub cgroup_parent: String,
}

/// The cluster.
pub struct Cluster {
    /// Everything lives under here.
    pub root: tempfile::TempDir,
    servers: Vec<(Proc, u16)>,
    /// The node daemons, in start order.
    pub nodes: Vec<NodeProc>,
    /// The admin key (shared by the replicas).
    pub key: String,
    /// The replicas' database URL (none: SQLite in the shared data directory).
    database: Option<String>,
    /// The replicas' config file, when they have one.
    server_config: Option<PathBuf>,
}

impl Cluster {
    /// `replicas` control planes and `nodes` node daemons; `node_config` is extra TOML for
    /// every node's `[node]` table (e.g. `max_sandboxes = 3`). Returns once every node is
    /// known and answering through the first replica.
    pub fn start(replicas: usize, nodes: usize, node_config: &str) -> Cluster {
        Cluster::start_on(replicas, nodes, node_config, None)
    }

    /// [`Cluster::start`] with the replicas on the database at `database`.
    pub fn start_on(
        replicas: usize,
        nodes: usize,
        node_config: &str,
        database: Option<&str>,
    ) -> Cluster {
        let mut c = Cluster::empty(database, None);
        for _ in 0..replicas {
            c.add_replica();
        }
        for _ in 0..nodes {
            c.add_node(node_config);
        }
        c.wait_nodes(nodes, Duration::from_secs(30));
        c
    }

    /// No process yet: the replicas that [`Cluster::add_replica`] starts use `database` and,
    /// when given, the TOML `server_config` (e.g. a `[control]` table).
    pub fn empty(database: Option<&str>, server_config: Option<&str>) -> Cluster {
        let guest = warren_bin().with_file_name("warren-guest");
        assert!(
            guest.is_file(),
            "{} is missing: build the workspace first",
            guest.display()
        );
        let root = tempfile::Builder::new()
            .prefix("warren-cluster-")
            .tempdir()
            .unwrap();
        let server_config = server_config.map(|text| {
            let p = root.path().join("server.toml");
            std::fs::write(&p, text).unwrap();
            p
        });
        Cluster {
            root,
            servers: Vec::new(),
            nodes: Vec::new(),
            key: String::new(),
            database: database.map(str::to_string),
            server_config,
        }
    }

    fn server_dir(&self) -> PathBuf {
        self.root.path().join("control")
    }

    /// Starts one more control-plane replica on the shared data directory; returns its index.
    pub fn add_replica(&mut self) -> usize {
        let port = free_port();
        let i = self.servers.len();
        let mut args = vec![
            "server".into(),
            "--data-dir".into(),
            self.server_dir().display().to_string(),
            "--listen".into(),
            format!("127.0.0.1:{port}"),
        ];
        if let Some(db) = &self.database {
            args.push("--database".into());
            args.push(db.clone());
        }
        if let Some(cfg) = &self.server_config {
            args.push("--config".into());
            args.push(cfg.display().to_string());
        }
        let p = Proc::start(args, self.root.path().join(format!("server-{i}.log")));
        self.servers.push((p, port));
        self.wait_replica(i);
        if self.key.is_empty() {
            self.key = std::fs::read_to_string(self.server_dir().join("admin.key"))
                .unwrap()
                .trim()
                .to_string();
        }
        i
    }

    fn wait_replica(&mut self, i: usize) {
        let port = self.servers[i].1;
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(st) = self.servers[i].0.exited() {
                panic!("warren server {i} exited with {st}:\n{}", self.logs());
            }
            if super::health_answers(port) {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "warren server {i} did not answer within 30 s:\n{}",
                self.logs()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Starts one more node daemon joined to every replica; returns its index.
    pub fn add_node(&mut self, node_config: &str) -> usize {
        let i = self.nodes.len();
        let dir = self.root.path().join(format!("node-{i}"));
        std::fs::create_dir_all(&dir).unwrap();
        let cfg = dir.join("config.toml");
        std::fs::write(
            &cfg,
            format!("[node]\n{node_config}\n\n[node.network]\nenabled = false\n"),
        )
        .unwrap();
        let port = free_port();
        let suffix: String = self
            .root
            .path()
            .file_name()
            .unwrap()
            .to_string_lossy()
            .chars()
            .rev()
            .take(6)
            .collect::<String>()
            .to_ascii_lowercase();
        let cgroup_parent = format!("warren-cl-{suffix}-{i}");
        let joins: Vec<String> = self.servers.iter().map(|(_, p)| self.url_of(*p)).collect();
        let args = vec![
            "node".into(),
            "--join".into(),
            joins.join(","),
            "--cluster-token-file".into(),
            self.server_dir()
                .join("cluster.token")
                .display()
                .to_string(),
            "--listen".into(),
            format!("127.0.0.1:{port}"),
            "--data-dir".into(),
            dir.display().to_string(),
            "--image-store".into(),
            self.server_dir().join("images").display().to_string(),
            "--cgroup-parent".into(),
            cgroup_parent.clone(),
            "--config".into(),
            cfg.display().to_string(),
        ];
        let p = Proc::start(args, self.root.path().join(format!("node-{i}.log")));
        self.nodes.push(NodeProc {
            proc_: p,
            dir,
            port,
            cgroup_parent,
        });
        i
    }

    fn url_of(&self, port: u16) -> String {
        format!("http://127.0.0.1:{port}")
    }

    /// The URL of replica `i`.
    pub fn url(&self, i: usize) -> String {
        self.url_of(self.servers[i].1)
    }

    /// A client of replica `i` with the admin key.
    pub fn client(&self, i: usize) -> Client {
        Client::new(&self.url(i), Some(&self.key)).unwrap()
    }

    /// The id node `i` made for itself (in its state directory).
    pub fn node_id(&self, i: usize) -> String {
        let p = self.nodes[i].dir.join("node").join("node.id");
        std::fs::read_to_string(&p)
            .unwrap_or_else(|e| panic!("{}: {e}", p.display()))
            .trim()
            .to_string()
    }

    /// Waits until replica 0 knows `n` nodes, all answering.
    pub fn wait_nodes(&self, n: usize, within: Duration) {
        self.wait_nodes_on(0, n, within)
    }

    /// Waits until replica `r` knows `n` nodes, all answering (the others learn joins from
    /// the database within a poll interval).
    pub fn wait_nodes_on(&self, r: usize, n: usize, within: Duration) {
        let deadline = Instant::now() + within;
        loop {
            let ok = tokio_block(async {
                match self.client(r).nodes().await {
                    Ok(l) => l.items.len() == n && l.items.iter().all(|i| i.reachable),
                    Err(_) => false,
                }
            });
            if ok {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "{n} nodes did not join within {within:?}:\n{}",
                self.logs()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Kills node `i` with SIGKILL (a crash): its sandboxes run on.
    pub fn kill9_node(&mut self, i: usize) {
        self.nodes[i].proc_.kill9();
    }

    /// Starts node `i` again after [`Cluster::kill9_node`].
    pub fn start_node(&mut self, i: usize) {
        self.nodes[i].proc_.spawn();
    }

    /// Stops replica `i` (SIGTERM) and starts it again on the same port.
    pub fn restart_replica(&mut self, i: usize) {
        self.servers[i].0.term();
        self.servers[i].0.spawn();
        self.wait_replica(i);
    }

    /// Every process's log, for failure messages.
    pub fn logs(&self) -> String {
        let mut out = String::new();
        for e in std::fs::read_dir(self.root.path())
            .into_iter()
            .flatten()
            .flatten()
        {
            let p = e.path();
            if p.extension().is_some_and(|x| x == "log") {
                let text = std::fs::read_to_string(&p).unwrap_or_default();
                let tail: Vec<&str> = text.lines().rev().take(40).collect();
                out.push_str(&format!("--- {}\n", p.display()));
                for l in tail.into_iter().rev() {
                    out.push_str(l);
                    out.push('\n');
                }
            }
        }
        out
    }
}

/// Runs a future to completion on a runtime of its own (tests call from sync code).
pub fn tokio_block<T>(f: impl std::future::Future<Output = T>) -> T {
    tokio::task::block_in_place(|| {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
            .block_on(f)
    })
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for (s, _) in &mut self.servers {
            s.kill9();
        }
        for n in &mut self.nodes {
            n.proc_.kill9();
        }
        for n in &self.nodes {
            super::remove_node_leftovers(&n.cgroup_parent, &n.dir, &n.dir.join("node"));
        }
    }
}
