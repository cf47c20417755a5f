//! Creating a container sandbox.
//!
//! The path: validate → admission → directories and cgroup → bind the guest's control socket
//! on the host → one clone3 into new namespaces, exec of the guest agent (no Rust runs in the
//! child before exec) → the agent builds the root (overlay, /proc, /dev, pivot_root) → its
//! hello on the control socket. Anything that fails on the way is undone.

use std::collections::BTreeMap;
use std::io::Write;
use std::os::fd::AsFd;
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use warren_types::ByteSize;
use warren_types::api::{
    CreateSandbox, ExecRequest, Resources, Sandbox as SandboxView, TrajectoryEntry,
};
use warren_types::guest::{Activate, InitConfig, Op, Reply, RootfsSpec};
use warren_types::id::SandboxId;

use crate::admission::HostLoad;
use crate::cgroups::{JoinFds, SandboxCgroup};
use crate::error::NodeError;
use crate::guest_client::GuestConn;
use crate::images::Rootfs;
use crate::node::{IdemSlot, Node, Phase, Sandbox, blocking, teardown};
use crate::state::{self, RECORD_VERSION, Record};

/// How long a new sandbox's init may take to answer.
const READY_TIMEOUT: Duration = Duration::from_secs(20);

/// Most labels, environment variables, and their sizes.
const MAX_LABELS: usize = 64;
const MAX_ENV: usize = 256;
const MAX_ENV_BYTES: usize = 32 * 1024;

/// Checks a create request against this node's limits and fills in defaults.
pub fn validate(
    node: &Node,
    req: &CreateSandbox,
    mem_total: u64,
) -> Result<(Resources, u64), NodeError> {
    let cfg = &node.cfg;
    let bad = |m: String| Err(NodeError::Invalid(m));
    let ncpu = std::thread::available_parallelism()
        .map(|n| n.get() as u32)
        .unwrap_or(1);
    let cpu = req.cpu.unwrap_or(cfg.default_cpu);
    if !(10..=ncpu * 1000).contains(&cpu) {
        return bad(format!(
            "cpu {cpu} millicores is out of range: give 10 to {} (this node has {ncpu} cores; 1000 = one core)",
            ncpu * 1000
        ));
    }
    let memory = req.memory.unwrap_or(cfg.default_memory);
    if memory.bytes() < 16 << 20 || memory.bytes() > mem_total {
        return bad(format!(
            "memory {memory} is out of range: give 16Mi to {} (this node's physical memory)",
            ByteSize(mem_total)
        ));
    }
    let pids = req.pids.unwrap_or(cfg.default_pids);
    if !(16..=cfg.max_pids).contains(&pids) {
        return bad(format!(
            "pids {pids} is out of range: give 16 to {} (this node's max_pids)",
            cfg.max_pids
        ));
    }
    let timeout = req.timeout.unwrap_or(cfg.default_timeout);
    if timeout == 0 || timeout > cfg.max_timeout {
        return bad(format!(
            "timeout {timeout} s is out of range: give 1 to {} seconds",
            cfg.max_timeout
        ));
    }
    if let Some(task) = &req.task {
        check_name("task", task, 128)?;
    }
    if req.labels.len() > MAX_LABELS {
        return bad(format!(
            "{} labels; at most {MAX_LABELS} are allowed",
            req.labels.len()
        ));
    }
    for (k, v) in &req.labels {
        check_name("label key", k, 63)?;
        if v.len() > 256 || v.contains('\0') {
            return bad(format!(
                "label {k:?}: the value must be at most 256 bytes without NUL"
            ));
        }
    }
    check_env(&req.env)?;
    if let Some(idle) = req.idle_timeout
        && (idle == 0 || idle > cfg.max_timeout)
    {
        return bad(format!(
            "idle_timeout {idle} s is out of range: give 1 to {} seconds, or leave it out for none",
            cfg.max_timeout
        ));
    }
    if req.on_idle.is_some() && req.idle_timeout.is_none() {
        return bad("on_idle needs an idle_timeout".into());
    }
    let disk = match (&node.dirs.disk, req.disk) {
        (None, Some(_)) => {
            return bad(
                "this node enforces no disk quotas (see its log: it has no btrfs disk pool); \
                 leave disk out"
                    .into(),
            );
        }
        (None, None) => None,
        (Some(pool), d) => {
            let d = d.unwrap_or(cfg.default_disk);
            if d.bytes() < 16 << 20 || d.bytes() > pool.capacity {
                return bad(format!(
                    "disk {d} is out of range: give 16Mi to {} (this node's disk pool)",
                    ByteSize(pool.capacity)
                ));
            }
            Some(d)
        }
    };
    Ok((
        Resources {
            cpu,
            memory,
            pids,
            disk,
        },
        timeout,
    ))
}

fn check_name(what: &str, s: &str, max: usize) -> Result<(), NodeError> {
    let ok = !s.is_empty()
        && s.len() <= max
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._-:/".contains(&b));
    if ok {
        Ok(())
    } else {
        Err(NodeError::Invalid(format!(
            "{what} {s:?} is not valid: use 1 to {max} letters, digits and . _ - : /"
        )))
    }
}

/// Checks environment variables (names like shell variables, no NUL, bounded size).
pub fn check_env(env: &BTreeMap<String, String>) -> Result<(), NodeError> {
    if env.len() > MAX_ENV {
        return Err(NodeError::Invalid(format!(
            "{} environment variables; at most {MAX_ENV}",
            env.len()
        )));
    }
    let mut total = 0;
    for (k, v) in env {
        let name_ok = !k.is_empty()
            && !k.as_bytes()[0].is_ascii_digit()
            && k.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_');
        if !name_ok {
            return Err(NodeError::Invalid(format!(
                "environment variable name {k:?} is not valid: use letters, digits and _, not starting with a digit"
            )));
        }
        if v.contains('\0') {
            return Err(NodeError::Invalid(format!(
                "environment variable {k} contains a NUL byte"
            )));
        }
        total += k.len() + v.len() + 2;
    }
    if total > MAX_ENV_BYTES {
        return Err(NodeError::Invalid(format!(
            "environment is {total} bytes; at most {MAX_ENV_BYTES}"
        )));
    }
    Ok(())
}

/// Releases an admission reservation unless the create went through.
struct Reservation<'a> {
    node: &'a Node,
    ask: crate::admission::Ask,
    kept: bool,
}

impl Drop for Reservation<'_> {
    fn drop(&mut self) {
        if !self.kept {
            self.node.admission.release(self.ask);
        }
    }
}

/// Clears an in-flight idempotency slot if the create fails.
struct IdemGuard<'a> {
    node: &'a Node,
    key: Option<String>,
    notify: Option<Arc<tokio::sync::Notify>>,
}

impl Drop for IdemGuard<'_> {
    fn drop(&mut self) {
        if let Some(key) = &self.key {
            let mut map = self
                .node
                .idempotency
                .lock()
                .unwrap_or_else(|p| p.into_inner());
            if matches!(map.get(key), Some(IdemSlot::InFlight(_))) {
                map.remove(key);
            }
        }
        if let Some(n) = &self.notify {
            n.notify_waiters();
        }
    }
}

impl Node {
    /// Creates a sandbox. With an idempotency key, a retry returns the sandbox the first
    /// request made (`created` is then false).
    pub async fn create(
        self: &Arc<Self>,
        req: CreateSandbox,
        idempotency_key: Option<String>,
    ) -> Result<(SandboxView, bool), NodeError> {
        let mut idem = IdemGuard {
            node: self,
            key: None,
            notify: None,
        };
        if let Some(key) = idempotency_key.clone() {
            if key.is_empty() || key.len() > 256 {
                return Err(NodeError::Invalid(
                    "Idempotency-Key must be 1 to 256 characters".into(),
                ));
            }
            loop {
                let wait = {
                    let mut map = self.idempotency.lock().unwrap_or_else(|p| p.into_inner());
                    match map.get(&key) {
                        Some(IdemSlot::Done(id)) => {
                            let id = id.clone();
                            drop(map);
                            if let Ok(sb) = self.get(&id) {
                                return Ok((sb.view(&self.id), false));
                            }
                            // Killed since: the key is free again.
                            self.idempotency
                                .lock()
                                .unwrap_or_else(|p| p.into_inner())
                                .remove(&key);
                            continue;
                        }
                        Some(IdemSlot::InFlight(n)) => n.clone(),
                        None => {
                            let n = Arc::new(tokio::sync::Notify::new());
                            map.insert(key.clone(), IdemSlot::InFlight(n.clone()));
                            idem.key = Some(key.clone());
                            idem.notify = Some(n);
                            break;
                        }
                    }
                };
                let notified = wait.notified();
                // Re-check after registering, so a completion in between is not missed.
                if !matches!(
                    self.idempotency
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .get(&key),
                    Some(IdemSlot::InFlight(_))
                ) {
                    continue;
                }
                notified.await;
            }
        }

        let load = HostLoad::read().map_err(|e| NodeError::host("reading host load", e))?;
        let (resources, timeout) = validate(self, &req, load.mem_total)?;
        let resolved = self.images.resolve(&req.image, req.resolved.as_ref())?;
        let ask = crate::admission::Ask::of(&resources);
        let disk = self.dirs.disk.as_ref().map(|p| (p.capacity, p.free()));
        self.admission.reserve(&self.cfg, &load, disk, ask)?;
        let mut reservation = Reservation {
            node: self,
            ask,
            kept: false,
        };

        let id = SandboxId::new(&self.id, rand::random());
        let now = state::now_ms();
        let (host_rootfs, image) = match resolved {
            crate::images::Resolved::Host(r) => (Some(r), Default::default()),
            crate::images::Resolved::Layered(l) => (None, l),
        };
        // The image's environment under the request's.
        let mut env = image.env.clone();
        env.extend(req.env.clone());
        let record = Record {
            version: RECORD_VERSION,
            id: id.clone(),
            image: req.image.clone(),
            task: req.task.clone(),
            labels: req.labels.clone(),
            env,
            resources,
            created_ms: now,
            expires_ms: now + timeout * 1000,
            pid: 0,
            start_time: 0,
            idempotency_key: idempotency_key.clone(),
            idle_timeout: req.idle_timeout,
            on_idle: req.on_idle.unwrap_or_default(),
            trajectory: req.trajectory || req.replay.is_some(),
            backend: req.backend.unwrap_or_default(),
            layers: image.layers,
            default_user: image.user,
            default_cwd: image.workdir,
        };
        let sb = self.launch(record, host_rootfs).await?;
        reservation.kept = true;
        self.sandboxes
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .insert(id.clone(), sb.clone());
        self.watch(&sb);
        if let Some(entries) = req.replay {
            if let Err(e) = self.rebuild(&sb, &entries).await {
                let _ = self.kill(&id).await;
                return Err(e);
            }
            *sb.replay.lock().unwrap_or_else(|p| p.into_inner()) =
                Some(crate::trajectory::Replay::new(entries));
        }
        if let Some(key) = &idempotency_key {
            self.idempotency
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .insert(key.clone(), IdemSlot::Done(id.clone()));
        }
        tracing::info!(sandbox_id = %id, image = %req.image, task = ?req.task, "created");
        Ok((sb.view(&self.id), true))
    }

    /// Re-applies a trajectory to a new sandbox: commands run again, files are written again.
    async fn rebuild(
        &self,
        sb: &Arc<Sandbox>,
        entries: &[TrajectoryEntry],
    ) -> Result<(), NodeError> {
        let id = &sb.record.id;
        for (i, e) in entries.iter().enumerate() {
            let step = |e: NodeError| {
                NodeError::Invalid(format!("replaying entry {i} of the trajectory: {e}"))
            };
            match e {
                TrajectoryEntry::Exec {
                    argv,
                    env,
                    cwd,
                    user,
                    stdin_b64,
                    result,
                    ..
                } => {
                    let req = ExecRequest {
                        argv: Some(argv.clone()),
                        env: env.clone(),
                        cwd: cwd.clone(),
                        user: Some(user.clone()),
                        stdin_b64: stdin_b64.clone(),
                        max_output: Some(ByteSize(
                            result
                                .status
                                .stdout_bytes
                                .max(result.status.stderr_bytes)
                                .max(1),
                        )),
                        ..ExecRequest::default()
                    };
                    let p = crate::exec::prepare(&req, Some(crate::exec::DEFAULT_EXEC_TIMEOUT))
                        .map_err(step)?;
                    self.exec_live(id, p).await.map_err(step)?;
                }
                TrajectoryEntry::WriteFile {
                    path,
                    user,
                    mode,
                    content_b64,
                    ..
                } => {
                    use base64::Engine;
                    let data = base64::engine::general_purpose::STANDARD
                        .decode(content_b64)
                        .map_err(|e| {
                            NodeError::Invalid(format!("trajectory entry {i}: content_b64: {e}"))
                        })?;
                    let body = futures_util::stream::iter([Ok::<_, std::io::Error>(
                        bytes::Bytes::from(data),
                    )]);
                    self.write_file_live(id, path.clone(), Some(user.clone()), *mode, body)
                        .await
                        .map_err(step)?;
                }
            }
        }
        Ok(())
    }

    /// Starts the sandbox's init (a warm one from the pool when there is one) and waits for its
    /// guest agent to answer.
    async fn launch(
        self: &Arc<Self>,
        mut record: Record,
        host_rootfs: Option<Rootfs>,
    ) -> Result<Arc<Sandbox>, NodeError> {
        let dir = self.dirs.sandboxes.join(record.id.as_str());
        let socket = self.dirs.sockets.join(format!("{}.sock", record.id));
        let cgroup = self.cgroups.sandbox(record.id.as_str());
        let t0 = std::time::Instant::now();
        let warm = self.take_warm(&record.image);
        let was_warm = warm.is_some();
        let node = self.clone();
        let (d, s, c) = (dir.clone(), socket.clone(), cgroup.clone());
        let rec = record.clone();
        let started = blocking(move || {
            let rootfs = match host_rootfs {
                Some(r) => r,
                None => {
                    let mounts = node.layers.acquire(&rec.layers, |d| node.layer_file(d))?;
                    node.images.layered_rootfs(&mounts)
                }
            };
            let r = node.start_sandbox(&rec, &rootfs, &d, &s, &c, warm);
            if r.is_err() {
                teardown(None, &c, &d, &s, &node.dirs);
                node.layers.release(&rec.layers);
            }
            r
        })
        .await
        .map_err(|e| NodeError::host("starting the sandbox", e))?;
        let t_started = t0.elapsed();
        record.pid = started.pid;
        record.start_time = started.start_time;
        let sb = Sandbox::new(
            record,
            dir,
            socket,
            cgroup,
            started.pidfd,
            Phase::Running,
            self.cfg.max_trajectory.bytes(),
        );
        let ready = async {
            state::save(&sb.dir, &sb.record)
                .map_err(|e| NodeError::host("saving the sandbox's state", e))?;
            wait_ready(&sb).await
        };
        if let Err(e) = ready.await {
            let log = std::fs::read_to_string(sb.dir.join("guest.log")).unwrap_or_default();
            let dirs = self.dirs.clone();
            let sb2 = sb.clone();
            let _ = blocking(move || {
                teardown(Some(&sb2.pidfd), &sb2.cgroup, &sb2.dir, &sb2.socket, &dirs);
                Ok(())
            })
            .await;
            self.layers.release(&sb.record.layers);
            let tail: String = log
                .lines()
                .rev()
                .take(5)
                .collect::<Vec<_>>()
                .into_iter()
                .rev()
                .collect::<Vec<_>>()
                .join("; ");
            let msg = if tail.is_empty() {
                e.to_string()
            } else {
                format!("{e}; the guest agent said: {tail}")
            };
            return Err(NodeError::host(
                "the sandbox did not start",
                std::io::Error::other(msg),
            ));
        }
        tracing::debug!(
            sandbox_id = %sb.record.id,
            warm = was_warm,
            started_us = t_started.as_micros() as u64,
            ready_us = t0.elapsed().as_micros() as u64,
            "launched"
        );
        Ok(sb)
    }
}

impl Node {
    /// The file of a layer in the image store.
    pub(crate) fn layer_file(&self, digest: &str) -> std::io::Result<PathBuf> {
        let store = self.images.store.as_ref().ok_or_else(|| {
            std::io::Error::other("this node's image store is unusable (see its log)")
        })?;
        store
            .layer_path(digest)
            .map_err(|e| std::io::Error::other(e.to_string()))
    }

    /// Activates a warm init of the sandbox's image, or starts a new one. Blocking.
    fn start_sandbox(
        &self,
        record: &Record,
        rootfs: &Rootfs,
        dir: &Path,
        socket: &Path,
        cgroup: &SandboxCgroup,
        warm: Option<crate::pool::Warm>,
    ) -> std::io::Result<Started> {
        let activate = Activate {
            env: record
                .env
                .iter()
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect(),
        };
        if let Some(mut w) = warm {
            match w.claim(record, dir, socket) {
                Ok(()) => return w.into_spawned().activate(&activate),
                Err(e) => {
                    tracing::warn!("warm init unusable, starting a new one: {e}");
                    w.discard();
                }
            }
        }
        let s = self.spawn_guest(rootfs, cgroup, Some(&record.resources), socket, dir)?;
        s.activate(&activate)
    }
}

/// A started init.
pub(crate) struct Started {
    pub pid: i32,
    pub start_time: u64,
    pub pidfd: std::os::fd::OwnedFd,
}

/// An init that builds its root and then waits for [`Activate`].
pub(crate) struct Spawned {
    pub pid: i32,
    pub start_time: u64,
    pub pidfd: std::os::fd::OwnedFd,
    /// Its configuration channel (fd 4 in the init): config and activation go down, "ready"
    /// comes back once the root is built.
    pub config: std::os::unix::net::UnixStream,
}

impl Spawned {
    /// Waits (up to `timeout`) until the init reports its root built.
    pub fn wait_built(&self, timeout: Duration) -> std::io::Result<()> {
        use std::io::BufRead;
        self.config.set_read_timeout(Some(timeout))?;
        let mut line = String::new();
        std::io::BufReader::new(&self.config).read_line(&mut line)?;
        self.config.set_read_timeout(None)?;
        if line == "ready\n" {
            Ok(())
        } else {
            Err(std::io::Error::other(
                "the init exited while building its root",
            ))
        }
    }

    /// Sends the activation: the init starts answering.
    pub fn activate(mut self, a: &Activate) -> std::io::Result<Started> {
        let mut line = serde_json::to_vec(a).map_err(std::io::Error::other)?;
        line.push(b'\n');
        if let Err(e) = self.config.write_all(&line) {
            let _ = warren_sys::process::pidfd_kill(&self.pidfd);
            return Err(e);
        }
        Ok(Started {
            pid: self.pid,
            start_time: self.start_time,
            pidfd: self.pidfd,
        })
    }
}

/// `n` random lower-case letters and digits.
pub(crate) fn random_name(n: usize) -> String {
    const ALPHABET: &[u8] = b"abcdefghijklmnopqrstuvwxyz0123456789";
    (0..n)
        .map(|_| ALPHABET[rand::random_range(0..ALPHABET.len())] as char)
        .collect()
}

/// Makes an init's directory (writable layer, links to the read-only layers) and returns the
/// configuration that builds its root from it.
fn prepare_dir(
    rootfs: &Rootfs,
    dir: &Path,
    limits: warren_types::guest::GuestLimits,
    grader: &warren_types::guest::GraderSpec,
    disk: Option<(&crate::disk::DiskPool, Option<u64>)>,
) -> std::io::Result<InitConfig> {
    std::fs::DirBuilder::new().mode(0o700).create(dir)?;
    match disk {
        // The writable layer in a volume of the disk pool, under its quota.
        Some((pool, limit)) => {
            pool.attach(dir, limit)?;
        }
        None => {
            for sub in ["upper", "work"] {
                std::fs::DirBuilder::new()
                    .mode(0o755)
                    .create(dir.join(sub))?;
            }
        }
    }
    let mut lowers = Vec::new();
    for (i, layer) in rootfs.layers.iter().enumerate() {
        let name = format!("l{i}");
        std::os::unix::fs::symlink(layer, dir.join(&name))?;
        lowers.push(name);
    }
    Ok(InitConfig {
        sandbox_dir: dir.to_string_lossy().into_owned(),
        hostname: "sandbox".into(),
        rootfs: RootfsSpec {
            lowers,
            upper: "upper".into(),
            work: "work".into(),
            binds: rootfs.binds.clone(),
        },
        limits,
        grader: grader.clone(),
    })
}

impl Node {
    /// Prepares `dir`, creates the cgroup (with `limits`), binds the control socket, clones the
    /// guest agent into new namespaces and sends it its root's configuration. Blocking.
    pub(crate) fn spawn_guest(
        &self,
        rootfs: &Rootfs,
        cgroup: &SandboxCgroup,
        limits: Option<&Resources>,
        socket: &Path,
        dir: &Path,
    ) -> std::io::Result<Spawned> {
        let disk = self
            .dirs
            .disk
            .as_deref()
            .map(|p| (p, limits.and_then(|r| r.disk).map(|d| d.bytes())));
        let config = prepare_dir(
            rootfs,
            dir,
            self.cfg.guest_limits(),
            &self.cfg.grader(),
            disk,
        )?;
        let join = cgroup.create(limits)?;
        let _ = std::fs::remove_file(socket);
        let listener = std::os::unix::net::UnixListener::bind(socket)?;
        std::fs::set_permissions(socket, std::fs::Permissions::from_mode(0o600))?;
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(dir.join("guest.log"))?;
        let null = std::fs::File::open("/dev/null")?;
        let (mut cfg_w, cfg_r) = std::os::unix::net::UnixStream::pair()?;
        let program: PathBuf = self.guest_bin.clone();
        let (procs, dirfd) = match &join {
            JoinFds::Procs(v) => (v.iter().map(|f| f.as_fd()).collect::<Vec<_>>(), None),
            JoinFds::Dir(d) => (Vec::new(), Some(d.as_fd())),
        };
        let fds = [
            (null.as_fd(), 0),
            (log.as_fd(), 1),
            (log.as_fd(), 2),
            (listener.as_fd(), 3),
            (cfg_r.as_fd(), 4),
        ];
        let spawned = warren_sys::spawn::spawn(&warren_sys::spawn::SpawnSpec {
            program: &program,
            args: &["warren-guest", "init"],
            env: &[(
                "PATH",
                "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
            )],
            namespaces: warren_sys::spawn::Namespaces::container(),
            join_cgroups: &procs,
            into_cgroup: dirfd,
            fds: &fds,
            ..warren_sys::spawn::SpawnSpec::new(&program, &[], &[])
        })?;
        let start_time = warren_sys::process::start_time(spawned.pid).unwrap_or(0);
        let mut line = serde_json::to_vec(&config).map_err(std::io::Error::other)?;
        line.push(b'\n');
        if let Err(e) = cfg_w.write_all(&line) {
            let _ = warren_sys::process::pidfd_kill(&spawned.pidfd);
            return Err(e);
        }
        Ok(Spawned {
            pid: spawned.pid,
            start_time,
            pidfd: spawned.pidfd,
            config: cfg_w,
        })
    }
}

/// Waits for the guest's answer on its control socket, or for its init to die.
async fn wait_ready(sb: &Sandbox) -> Result<(), NodeError> {
    let exited = async {
        if let Ok(fd) = sb.pidfd.try_clone() {
            let _ = warren_sys::process::exited(fd).await;
        } else {
            std::future::pending::<()>().await;
        }
    };
    let ping = async {
        let mut conn = GuestConn::open(&sb.socket, Op::Ping).await?;
        conn.reply().await
    };
    // A guest that does not answer in time is a node too busy to start it now, not a fault:
    // a retryable 503 (the create is undone), never a 500.
    let busy = |what: &str| NodeError::Busy {
        message: format!(
            "the new sandbox's guest agent did not answer in time ({what}): the node is busy; retry shortly"
        ),
        retry_after: 2,
    };
    tokio::select! {
        r = tokio::time::timeout(READY_TIMEOUT, ping) => match r {
            Ok(Ok(Reply::Pong { .. })) => Ok(()),
            Ok(Ok(other)) => Err(NodeError::host("guest hello", std::io::Error::other(format!("unexpected reply {other:?}")))),
            Ok(Err(e @ crate::guest_client::GuestError::Protocol(_))) if e.to_string().contains("no hello") => Err(busy(&e.to_string())),
            Ok(Err(e)) => Err(NodeError::host("guest hello", std::io::Error::other(e.to_string()))),
            Err(_) => Err(busy("no answer within 20 s")),
        },
        _ = exited => Err(NodeError::host("guest hello", std::io::Error::other("the sandbox's init exited during set-up"))),
    }
}
