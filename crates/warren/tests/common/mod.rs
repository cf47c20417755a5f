//! A real `warren up` for integration tests: its own data directory, port and cgroup parent,
//! so tests run side by side, and a teardown that removes every process, cgroup and directory
//! it made even when the test fails.
#![allow(dead_code)]

pub mod cluster;
pub mod dev;
pub mod lab;

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use warren_node::container::WARM_PREFIX as WARM;
use warren_sdk::Client;

/// Whether the tests run as root (CI does). Tests that need root print SKIP otherwise.
pub fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("Uid:"))
                .map(|l| l.split_whitespace().nth(1) == Some("0"))
        })
        .unwrap_or(false)
}

/// Returns early from a test that needs root, saying so.
#[macro_export]
macro_rules! require_root {
    () => {
        if !common::is_root() {
            eprintln!(
                "SKIP {}: needs root (real namespaces, cgroups and mounts)",
                module_path!()
            );
            return;
        }
    };
}

/// A running `warren up`.
pub struct Platform {
    child: Option<Child>,
    pub data: tempfile::TempDir,
    pub url: String,
    pub key: String,
    pub cgroup_parent: String,
    port: u16,
    extra_config: Option<String>,
    /// The network namespace it runs in (a test's own), if not the test's.
    netns: Option<String>,
}

/// Runs `f` on a thread inside the network namespace `ns` (its sockets are made there).
pub fn in_netns<T: Send>(ns: Option<&str>, f: impl FnOnce() -> T + Send) -> T {
    let Some(ns) = ns else { return f() };
    let fd = std::fs::File::open(format!("/run/netns/{ns}")).expect("open netns");
    std::thread::scope(|s| {
        s.spawn(move || {
            rustix::thread::move_into_link_name_space(
                std::os::fd::AsFd::as_fd(&fd),
                Some(rustix::thread::LinkNameSpaceType::Network),
            )
            .expect("setns");
            f()
        })
        .join()
        .expect("thread in the namespace")
    })
}

/// Whether `GET /v1/health` answers 200 on this port of loopback.
pub fn health_answers(port: u16) -> bool {
    health_ok(port)
}

/// Whether `GET /v1/health` answers 200 (served only once the platform is fully up).
fn health_ok(port: u16) -> bool {
    use std::io::{Read, Write};
    let Ok(mut s) = std::net::TcpStream::connect(("127.0.0.1", port)) else {
        return false;
    };
    let _ = s.set_read_timeout(Some(Duration::from_secs(2)));
    if s.write_all(b"GET /v1/health HTTP/1.0\r\nHost: localhost\r\n\r\n")
        .is_err()
    {
        return false;
    }
    let mut buf = [0u8; 16];
    matches!(s.read(&mut buf), Ok(n) if n >= 12 && &buf[9..12] == b"200")
}

/// Polls `check` until it answers `Ok`, every 50 ms for up to `within`; past that, panics with
/// `what` and its last answer. For what a loaded machine makes late: never a fixed sleep.
pub async fn poll_until(
    within: Duration,
    what: &str,
    mut check: impl AsyncFnMut() -> Result<(), String>,
) {
    let deadline = Instant::now() + within;
    loop {
        let last = match check().await {
            Ok(()) => return,
            Err(e) => e,
        };
        assert!(Instant::now() < deadline, "{what}: {last}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A free port below the kernel's ephemeral range (32768 and up here), so that no client
/// connection's source port takes it while a platform restarts on it. A port is handed out
/// once per test process: tests run side by side, and a port found free is free only until
/// the platform it was picked for binds it, so two tests must never pick the same one.
pub fn free_port() -> u16 {
    static GIVEN: std::sync::Mutex<Vec<u16>> = std::sync::Mutex::new(Vec::new());
    let mut given = GIVEN.lock().unwrap_or_else(|e| e.into_inner());
    let mut seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0)
        ^ std::process::id().wrapping_mul(2_654_435_761);
    for _ in 0..1000 {
        seed = seed.wrapping_mul(1_103_515_245).wrapping_add(12345);
        let port = 20000 + (seed >> 8) as u16 % 12000;
        if !given.contains(&port) && TcpListener::bind(("127.0.0.1", port)).is_ok() {
            given.push(port);
            return port;
        }
    }
    panic!("no free port in 20000-31999")
}

pub fn warren_bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_warren"))
}

impl Platform {
    /// Starts a platform with default settings.
    pub fn start() -> Platform {
        Self::start_with(None)
    }

    /// Starts a platform with extra TOML config (e.g. `[node]\nmax_upload = 1024`).
    pub fn start_with(extra_config: Option<&str>) -> Platform {
        Platform::start_inner(extra_config, None)
    }

    /// A platform whose node runs in the network namespace `netns` (one the test made), with
    /// its sandbox network on. Talk to it from that namespace: [`Platform::run`],
    /// [`Platform::cli`].
    pub fn start_in(netns: &str, extra_config: Option<&str>) -> Platform {
        Platform::start_inner(extra_config, Some(netns.to_string()))
    }

    fn start_inner(extra_config: Option<&str>, netns: Option<String>) -> Platform {
        let guest = warren_bin().with_file_name("warren-guest");
        assert!(
            guest.is_file(),
            "{} is missing: build the workspace first (cargo build --workspace; make test does)",
            guest.display()
        );
        let data = tempfile::Builder::new()
            .prefix("warren-test-")
            .tempdir()
            .expect("tempdir");
        let suffix: String = data
            .path()
            .file_name()
            .unwrap()
            .to_string_lossy()
            .chars()
            .rev()
            .take(6)
            .collect();
        let mut p = Platform {
            child: None,
            url: String::new(),
            key: String::new(),
            cgroup_parent: format!("warren-test-{}", suffix.to_ascii_lowercase()),
            port: free_port(),
            data,
            extra_config: extra_config.map(str::to_string),
            netns,
        };
        // Another process on the machine may take the port between the check and the bind:
        // a first start then moves to another port (a restart keeps its port and fails).
        for _ in 0..3 {
            match p.try_launch() {
                Ok(()) => return p,
                Err(e) if e.contains("Address already in use") => {
                    eprintln!("port {} was taken; trying another:\n{e}", p.port);
                    p.port = free_port();
                    let _ = std::fs::remove_file(p.log_path());
                }
                Err(e) => panic!("{e}"),
            }
        }
        panic!("warren up found every port it tried in use")
    }

    /// Runs `f` on a thread in the platform's network namespace, on a runtime of its own (so
    /// every socket a client makes there is made in that namespace).
    pub fn run<T: Send>(&self, f: impl AsyncFnOnce() -> T + Send) -> T {
        in_netns(self.netns.as_deref(), || {
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap()
                .block_on(f())
        })
    }

    fn launch(&mut self) {
        if let Err(e) = self.try_launch() {
            panic!("{e}");
        }
    }

    /// Starts `warren up` and waits until it answers; the error says why it exited.
    fn try_launch(&mut self) -> Result<(), String> {
        let mut cmd = match &self.netns {
            // Only the network namespace changes (`ip netns exec` would remount /sys and hide
            // the cgroup hierarchies).
            Some(ns) => {
                let mut c = Command::new("nsenter");
                c.arg(format!("--net=/run/netns/{ns}"))
                    .arg("--")
                    .arg(warren_bin());
                c
            }
            None => Command::new(warren_bin()),
        };
        cmd.arg("up")
            .arg("--data-dir")
            .arg(self.data.path())
            .arg("--listen")
            .arg(format!("127.0.0.1:{}", self.port))
            .arg("--cgroup-parent")
            .arg(&self.cgroup_parent)
            // Tests run many platforms at once: none takes the E2B gateway's default port.
            .arg("--e2b-listen")
            .arg("off")
            .env("WARREN_LOG", "warn,warren_node=info")
            .stdin(Stdio::null());
        // Tests share the machine's network namespace: a node there gets no sandbox network
        // (it would add interfaces, routes and a firewall table beside the host's own), unless
        // it runs in a namespace of the test's.
        let mut cfg = self.extra_config.clone().unwrap_or_default();
        if self.netns.is_none() && !cfg.contains("[node.network]") {
            cfg.push_str("\n[node.network]\nenabled = false\n");
        }
        let path = self.data.path().join("test-config.toml");
        std::fs::write(&path, cfg).unwrap();
        cmd.arg("--config").arg(path);
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.log_path())
            .unwrap();
        cmd.stdout(log.try_clone().unwrap()).stderr(log);
        self.child = Some(cmd.spawn().expect("spawn warren up"));
        self.url = format!("http://127.0.0.1:{}", self.port);
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(status) = self.child.as_mut().unwrap().try_wait().unwrap() {
                // Who holds the port, should it be taken (a restart that finds it in use).
                let ss = Command::new("ss")
                    .arg("-tanp")
                    .output()
                    .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
                    .unwrap_or_default();
                let ss: String = ss
                    .lines()
                    .filter(|l| l.contains(&format!(":{}", self.port)))
                    .collect::<Vec<_>>()
                    .join("\n");
                return Err(format!(
                    "warren up exited with {status}:\n{}\nsockets on port {} (ss -tanp):\n{ss}",
                    self.log(),
                    self.port
                ));
            }
            let port = self.port;
            if self.data.path().join("admin.key").exists()
                && in_netns(self.netns.as_deref(), || health_ok(port))
            {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "warren up did not listen within 30 s:\n{}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        self.key = std::fs::read_to_string(self.data.path().join("admin.key"))
            .unwrap()
            .trim()
            .to_string();
        Ok(())
    }

    pub fn log_path(&self) -> PathBuf {
        self.data.path().join("warren-up.log")
    }

    /// What `warren up` printed.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.log_path()).unwrap_or_default()
    }

    /// A client with the admin key.
    pub fn client(&self) -> Client {
        Client::new(&self.url, Some(&self.key)).unwrap()
    }

    /// A raw HTTP client and the auth header value.
    pub fn http(&self) -> reqwest::Client {
        reqwest::Client::new()
    }

    /// Stops `warren up` with SIGKILL (a crash): sandboxes must survive.
    pub fn kill9(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Stops `warren up` with SIGTERM and waits.
    pub fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            // SAFETY-free: signal our own child by pid through the kill command.
            let _ = Command::new("kill")
                .arg("-TERM")
                .arg(c.id().to_string())
                .status();
            let _ = c.wait();
        }
    }

    /// Starts `warren up` again on the same data directory, port and cgroup parent.
    pub fn restart(&mut self) {
        self.stop();
        self.launch();
    }

    /// Starts it again after [`Platform::kill9`].
    pub fn start_again(&mut self) {
        assert!(self.child.is_none());
        self.launch();
    }

    /// Runs the CLI against this platform.
    pub fn cli(&self, args: &[&str]) -> std::process::Output {
        let mut cmd = match &self.netns {
            Some(ns) => {
                let mut c = Command::new("nsenter");
                c.arg(format!("--net=/run/netns/{ns}"))
                    .arg("--")
                    .arg(warren_bin());
                c
            }
            None => Command::new(warren_bin()),
        };
        cmd.args(args)
            .env("WARREN_URL", &self.url)
            .env("WARREN_API_KEY", &self.key)
            .stdin(Stdio::null())
            .output()
            .expect("run warren")
    }

    /// The node's state directory.
    pub fn state_dir(&self) -> PathBuf {
        self.data.path().join("node")
    }

    /// Everything this platform may have left behind: sandbox directories, sockets, sandbox
    /// cgroups, and mounts under the data directory.
    pub fn leftovers(&self) -> Vec<String> {
        let mut out = Vec::new();
        for sub in ["sandboxes", "sockets"] {
            for e in std::fs::read_dir(self.state_dir().join(sub))
                .into_iter()
                .flatten()
                .flatten()
            {
                // The warm pool's inits are the node's own, not a sandbox's leftovers.
                if !e.file_name().to_string_lossy().starts_with(WARM) {
                    out.push(e.path().display().to_string());
                }
            }
        }
        let cg = warren_node::container::cgroups::Cgroups::new(&self.cgroup_parent).unwrap();
        for name in cg.existing().into_iter().filter(|n| !n.starts_with(WARM)) {
            out.push(format!("cgroup {}/{name}", self.cgroup_parent));
        }
        // Disk volumes (writable layers under quota) that no warm init or sandbox links to.
        let pool = self.state_dir().join("disk");
        let linked: Vec<PathBuf> = ["warm", "sandboxes"]
            .iter()
            .flat_map(|d| {
                std::fs::read_dir(self.state_dir().join(d))
                    .into_iter()
                    .flatten()
            })
            .flatten()
            .filter_map(|e| std::fs::read_link(e.path().join("upper")).ok())
            .collect();
        for e in std::fs::read_dir(&pool).into_iter().flatten().flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if name.starts_with("v-") && !linked.iter().any(|l| l.starts_with(e.path())) {
                out.push(format!("disk volume {name}"));
            }
        }
        let data = self.data.path().display().to_string();
        let pool = pool.display().to_string();
        for line in std::fs::read_to_string("/proc/self/mountinfo")
            .unwrap_or_default()
            .lines()
        {
            // The node's disk pool stays mounted while the platform runs.
            if line.contains(&data) && line.split(' ').nth(4) != Some(pool.as_str()) {
                out.push(format!("mount: {line}"));
            }
        }
        out
    }

    /// Waits until nothing is left behind (deletion of writable layers runs in the background).
    pub fn assert_clean(&self) {
        self.assert_clean_within(Duration::from_secs(10))
    }

    /// [`Platform::assert_clean`], waiting up to `wait`.
    pub fn assert_clean_within(&self, wait: Duration) {
        let deadline = Instant::now() + wait;
        loop {
            let left = self.leftovers();
            let trash_empty = std::fs::read_dir(self.state_dir().join("trash"))
                .map(|mut d| d.next().is_none())
                .unwrap_or(true);
            if left.is_empty() && trash_empty {
                return;
            }
            assert!(Instant::now() < deadline, "left behind: {left:#?}");
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Platform {
    fn drop(&mut self) {
        self.kill9();
        // Whatever the test did, leave no process, cgroup or mount behind.
        remove_node_leftovers(&self.cgroup_parent, self.data.path(), &self.state_dir());
    }
}

/// What a node daemon (killed) may have left: every process in its own cgroups (sandbox
/// inits and their processes) and the cgroups, the mounts under `root` (image layers, the disk
/// pool; their loop devices free themselves), and its state directory's sandbox trees —
/// removed iteratively, as a sandbox may have left a tree too deep for a recursive removal.
pub fn remove_node_leftovers(cgroup_parent: &str, root: &Path, state_dir: &Path) {
    if let Ok(cg) = warren_node::container::cgroups::Cgroups::new(cgroup_parent)
        && let Err(e) = cg.remove_all()
    {
        eprintln!("cleanup of cgroup {cgroup_parent}: {e}");
    }
    let root = root.display().to_string();
    for line in std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap_or_default()
        .lines()
    {
        if let Some(point) = line.split(' ').nth(4)
            && point.starts_with(&root)
        {
            let _ = Command::new("umount").arg("-l").arg(point).status();
        }
    }
    for d in ["trash", "sandboxes"] {
        let _ = warren_fs::remove_path(&state_dir.join(d));
    }
}

/// Reads a file, for error messages.
pub fn read(p: &Path) -> String {
    std::fs::read_to_string(p).unwrap_or_default()
}
