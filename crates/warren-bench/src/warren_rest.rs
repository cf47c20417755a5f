//! Warren as users see it: `warren up` started by the bench, driven through the Rust SDK.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use warren_sdk::{ByteSize, Client, CreateSandbox};

use crate::host;
use crate::stats::{CycleStats, Phases, Samples, run_cycles};
use crate::{Plan, cycle_result};

/// The cgroup parent `warren up` is told to use.
pub const CGROUP_PARENT: &str = "warren-bench";

/// What the REST measurements found; each part may have failed on its own.
pub struct RestResults {
    pub c1: Result<CycleStats, String>,
    pub cn: Result<CycleStats, String>,
    pub exec: Result<CycleStats, String>,
    pub idle: Result<IdleMemory, String>,
    /// Creates of the built-in `host` image and of a small layered image, alternating.
    pub layered: Result<LayeredCreates, String>,
    /// Warm-pool inits `warren up` held once it had settled after its start.
    pub warm_pool: usize,
    /// Problems cleaning up, and the tail of `warren up`'s log when something failed.
    pub notes: Vec<String>,
}

/// Create latency of a layered image beside the built-in one, measured alternately.
pub struct LayeredCreates {
    pub host: crate::stats::Samples,
    pub layered: crate::stats::Samples,
}

/// Idle sandboxes: how much memory each costs, and how fast they come and go in bulk.
pub struct IdleMemory {
    pub wanted: usize,
    pub made: usize,
    pub create_errors: usize,
    pub first_error: Option<String>,
    pub create_wall: Duration,
    pub create_lat: Samples,
    /// Host MemAvailable drop per sandbox, bytes.
    pub mem_available_drop: Option<f64>,
    /// Mean of the sandboxes' cgroup memory usage, bytes, and how many cgroups were read.
    pub cgroup_usage: Option<(u64, usize)>,
    /// Mean VmRSS of the guest agents (PID 1 of each sandbox), bytes, and how many.
    pub guest_rss: Option<(u64, usize)>,
    /// Growth of `warren up`'s own RSS per sandbox, bytes.
    pub daemon_rss_growth: Option<f64>,
    pub kill_wall: Duration,
    pub killed: usize,
    pub kill_errors: usize,
    /// Sandbox cgroups under the parent that are not among the sandboxes this phase made.
    pub stray_cgroups: usize,
    /// Warm-pool inits (not sandboxes yet) under the parent at the time of measuring.
    pub warm_inits: usize,
}

fn create_req() -> CreateSandbox {
    CreateSandbox {
        image: "host".into(),
        memory: Some(ByteSize(64 << 20)),
        ..Default::default()
    }
}

/// A running `warren up`, stopped with SIGTERM when dropped if not before.
pub(crate) struct WarrenUp {
    child: Option<Child>,
    log: PathBuf,
}

impl WarrenUp {
    pub(crate) fn start(
        exe_dir: &Path,
        work: &Path,
    ) -> anyhow::Result<(WarrenUp, String, PathBuf)> {
        Self::start_in(exe_dir, work, CGROUP_PARENT)
    }

    /// As `start`, under the cgroup parent `cgroup_parent` (a benchmark of its own, so that it
    /// may run beside the others).
    pub(crate) fn start_in(
        exe_dir: &Path,
        work: &Path,
        cgroup_parent: &str,
    ) -> anyhow::Result<(WarrenUp, String, PathBuf)> {
        let warren = exe_dir.join("warren");
        if !warren.is_file() {
            bail!(
                "{} not found: build it (cargo build --release -p warren)",
                warren.display()
            );
        }
        let port = std::net::TcpListener::bind("127.0.0.1:0")?
            .local_addr()?
            .port();
        let data = work.join("data");
        let log = work.join("warren-up.log");
        let logf = std::fs::File::create(&log)?;
        let child = Command::new(&warren)
            .arg("up")
            .arg("--data-dir")
            .arg(&data)
            .arg("--listen")
            .arg(format!("127.0.0.1:{port}"))
            .arg("--cgroup-parent")
            .arg(cgroup_parent)
            .arg("--kill-sandboxes-on-exit")
            .arg("--e2b-listen")
            .arg("off")
            .env("WARREN_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(logf.try_clone()?)
            .stderr(logf)
            .spawn()
            .with_context(|| format!("starting {}", warren.display()))?;
        Ok((
            WarrenUp {
                child: Some(child),
                log,
            },
            format!("http://127.0.0.1:{port}"),
            data,
        ))
    }

    fn pid(&self) -> Option<i32> {
        self.child.as_ref().map(|c| c.id() as i32)
    }

    pub(crate) fn log_tail(&self, lines: usize) -> String {
        let s = std::fs::read_to_string(&self.log).unwrap_or_default();
        let v: Vec<&str> = s.lines().collect();
        v[v.len().saturating_sub(lines)..].join("\n")
    }

    /// SIGTERM, then waits up to 60 s (it kills its sandboxes on the way out); SIGKILL after
    /// that. Returns whether it exited on its own with status 0.
    pub(crate) fn stop(&mut self) -> bool {
        let Some(mut child) = self.child.take() else {
            return true;
        };
        if let Ok(Some(st)) = child.try_wait() {
            return st.success();
        }
        let _ = warren_sys::process::kill(child.id() as i32, host::SIGTERM);
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            match child.try_wait() {
                Ok(Some(st)) => return st.success(),
                Ok(None) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(20))
                }
                _ => {
                    let _ = child.kill();
                    let _ = child.wait();
                    return false;
                }
            }
        }
    }
}

impl Drop for WarrenUp {
    fn drop(&mut self) {
        self.stop();
    }
}

pub(crate) async fn wait_healthy(client: &Client, up: &mut WarrenUp) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Some(c) = up.child.as_mut()
            && let Ok(Some(st)) = c.try_wait()
        {
            bail!("warren up exited ({st}): {}", up.log_tail(10));
        }
        match client.health().await {
            Ok(h) if h.status == "ok" && h.nodes_up >= 1 => return Ok(()),
            Ok(_) | Err(_) if Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(50)).await
            }
            Ok(h) => bail!(
                "warren up did not become healthy in 30 s: status {}, {}/{} nodes up",
                h.status,
                h.nodes_up,
                h.nodes
            ),
            Err(e) => bail!("warren up did not answer in 30 s: {e}"),
        }
    }
}

/// One create → first exec → destroy cycle.
async fn cycle(client: Client) -> anyhow::Result<Phases> {
    let t0 = Instant::now();
    let sb = client.create(&create_req()).await.context("create")?;
    let t1 = Instant::now();
    let ex = sb.exec(&warren_sdk::argv(["true"])).await;
    let t2 = Instant::now();
    let killed = sb.kill().await;
    let t3 = Instant::now();
    let ex = ex.context("exec")?;
    if ex.status.exit_code != 0 {
        bail!("`true` exited {}: {}", ex.status.exit_code, ex.stderr);
    }
    killed.context("kill")?;
    Ok(Phases {
        create: Some(t1 - t0),
        exec: Some(t2 - t1),
        destroy: Some(t3 - t2),
    })
}

/// Runs every REST measurement. `warren up` is stopped and its cgroups removed before this
/// returns, whatever failed.
pub async fn run(plan: &Plan, exe_dir: &Path) -> Result<RestResults, String> {
    host::preflight_cgroup_parent(CGROUP_PARENT).map_err(|e| format!("{e:#}"))?;
    let work = tempfile::Builder::new()
        .prefix("warren-bench-rest.")
        .tempdir()
        .map_err(|e| format!("temp dir: {e}"))?;
    let (mut up, url, data) =
        WarrenUp::start(exe_dir, work.path()).map_err(|e| format!("{e:#}"))?;
    crate::stats::DAEMON_PID.store(up.pid().unwrap_or(0), std::sync::atomic::Ordering::Relaxed);
    let res = measure(plan, &mut up, &url, &data, exe_dir, work.path()).await;
    crate::stats::DAEMON_PID.store(0, std::sync::atomic::Ordering::Relaxed);
    let clean = up.stop();
    let mut notes = Vec::new();
    if !clean {
        notes.push(format!(
            "warren up did not exit cleanly on SIGTERM; its log ends: {}",
            up.log_tail(10)
        ));
    }
    for p in host::remove_cgroup_parent(CGROUP_PARENT, !clean) {
        notes.push(format!("cgroup left behind: {p}"));
    }
    match res {
        Ok(mut r) => {
            let failed = r.c1.is_err() || r.cn.is_err() || r.exec.is_err() || r.idle.is_err();
            if failed {
                notes.push(format!("warren up's log ends: {}", up.log_tail(10)));
            }
            r.notes.extend(notes);
            Ok(r)
        }
        Err(e) => Err(format!("{e}; warren up's log ends: {}", up.log_tail(10))),
    }
}

async fn measure(
    plan: &Plan,
    up: &mut WarrenUp,
    url: &str,
    data: &Path,
    exe_dir: &Path,
    work: &Path,
) -> Result<RestResults, String> {
    let probe = Client::new(url, None).map_err(|e| e.to_string())?;
    wait_healthy(&probe, up)
        .await
        .map_err(|e| format!("{e:#}"))?;
    let key = std::fs::read_to_string(data.join("admin.key"))
        .map_err(|e| format!("reading {}/admin.key: {e}", data.display()))?;
    let client = Client::new(url, Some(key.trim())).map_err(|e| e.to_string())?;

    let warm = host::settle_warm_pool(CGROUP_PARENT, Duration::from_secs(10)).await;
    eprintln!("warren-bench: REST: warren up is healthy; {warm} warm-pool inits");
    eprintln!("warren-bench: REST, create→exec→destroy at concurrency 1");
    let c = client.clone();
    let c1 = run_cycles(plan.warmup, plan.n_c1, 1, move |_, _| cycle(c.clone())).await;
    eprintln!("  {}", cycle_result(&c1));
    let mut notes = Vec::new();
    leftovers(&client, "after the concurrency-1 cycles", &mut notes).await;

    host::settle_warm_pool(CGROUP_PARENT, Duration::from_secs(10)).await;
    eprintln!(
        "warren-bench: REST, create→exec→destroy at concurrency {}",
        plan.conc
    );
    let c = client.clone();
    let cn = run_cycles(plan.warmup, plan.n_cn, plan.conc, move |_, _| {
        cycle(c.clone())
    })
    .await;
    eprintln!("  {}", cycle_result(&cn));
    leftovers(
        &client,
        &format!("after the concurrency-{} cycles", plan.conc),
        &mut notes,
    )
    .await;

    host::settle_warm_pool(CGROUP_PARENT, Duration::from_secs(10)).await;
    eprintln!("warren-bench: REST, exec round trip on one warm sandbox");
    let exec = exec_round_trip(plan, &client).await;
    eprintln!("  {}", cycle_result(&exec));
    leftovers(&client, "after the exec round trips", &mut notes).await;

    host::settle_warm_pool(CGROUP_PARENT, Duration::from_secs(10)).await;
    eprintln!("warren-bench: REST, creates of a layered image beside `host`, alternating");
    let layered = layered_creates(plan, &client, exe_dir, url, key.trim(), work).await;
    match &layered {
        Ok(l) => eprintln!(
            "  host {} · layered {}",
            l.host.p50_p99(),
            l.layered.p50_p99()
        ),
        Err(e) => eprintln!("  {e}"),
    }
    leftovers(&client, "after the layered creates", &mut notes).await;

    host::settle_warm_pool(CGROUP_PARENT, Duration::from_secs(10)).await;
    eprintln!(
        "warren-bench: REST, {} idle sandboxes (memory, bulk create and kill)",
        plan.n_idle
    );
    let idle = idle_memory(plan, &client, up.pid()).await;
    if let Ok(i) = &idle
        && let Some(e) = &i.first_error
    {
        notes.push(format!(
            "REST: {} of {} idle sandboxes failed to start; the first: {e}",
            i.create_errors, i.wanted
        ));
    }
    if let Ok(i) = &idle
        && i.stray_cgroups > 0
    {
        notes.push(format!(
            "REST: while the {} idle sandboxes ran, {} other sandbox cgroups (not the warm pool's) existed under {CGROUP_PARENT}: left from earlier phases; not counted",
            i.made, i.stray_cgroups
        ));
    }
    leftovers(&client, "after the idle sandboxes were killed", &mut notes).await;

    Ok(RestResults {
        c1,
        cn,
        exec,
        idle,
        layered,
        warm_pool: warm,
        notes,
    })
}

/// Imports a small layered image (busybox) with the CLI, then times creates of it and of
/// `host`, one after the other, `n_c1` of each (after a few of the layered image, so a node
/// that prepares inits per image has seen it).
async fn layered_creates(
    plan: &Plan,
    client: &Client,
    exe_dir: &Path,
    url: &str,
    key: &str,
    work: &Path,
) -> Result<LayeredCreates, String> {
    let busybox = ["/bin/busybox", "/usr/bin/busybox"]
        .iter()
        .map(Path::new)
        .find(|p| p.is_file())
        .ok_or("busybox is needed for the layered image (apt-get install busybox-static)")?;
    let root = work.join("layered-root");
    for d in ["bin", "etc", "tmp", "home/user"] {
        std::fs::create_dir_all(root.join(d)).map_err(|e| e.to_string())?;
    }
    std::fs::copy(busybox, root.join("bin/busybox")).map_err(|e| e.to_string())?;
    for tool in ["sh", "true"] {
        std::os::unix::fs::symlink("busybox", root.join("bin").join(tool))
            .map_err(|e| e.to_string())?;
    }
    let name = "bench/busybox:1";
    let out = std::process::Command::new(exe_dir.join("warren"))
        .args(["image", "import"])
        .arg(&root)
        .args(["--name", name])
        .env("WARREN_URL", url)
        .env("WARREN_API_KEY", key)
        .output()
        .map_err(|e| format!("running warren image import: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "warren image import failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    let once = |image: &'static str| {
        let client = client.clone();
        async move {
            let t = Instant::now();
            let sb = client
                .create(&CreateSandbox {
                    image: image.into(),
                    memory: Some(ByteSize(64 << 20)),
                    ..Default::default()
                })
                .await
                .map_err(|e| format!("create of {image}: {e}"))?;
            let d = t.elapsed();
            sb.kill().await.map_err(|e| format!("kill: {e}"))?;
            Ok::<_, String>(d)
        }
    };
    for _ in 0..plan.warmup.max(3) {
        once(name).await?;
    }
    let mut r = LayeredCreates {
        host: Default::default(),
        layered: Default::default(),
    };
    for _ in 0..plan.n_c1 {
        r.host.push(once("host").await?);
        r.layered.push(once(name).await?);
        // As a caller between rollouts would, let the node catch its breath.
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Ok(r)
}

/// Notes sandboxes that should be gone: listed by the API, or with a cgroup under our parent.
async fn leftovers(client: &Client, when: &str, notes: &mut Vec<String>) {
    let listed = client
        .list(&warren_sdk::ListFilter::default())
        .await
        .map(|l| l.len());
    let (cgroups, _) = host::count_sandbox_cgroups(CGROUP_PARENT);
    match listed {
        Ok(0) if cgroups == 0 => {}
        Ok(n) => {
            let msg = format!(
                "REST: {when}: {n} sandboxes still listed by the API and {cgroups} sandbox cgroups still present (expected none)"
            );
            eprintln!("  {msg}");
            notes.push(msg);
        }
        Err(e) => notes.push(format!("REST: {when}: listing sandboxes failed: {e}")),
    }
}

async fn exec_round_trip(plan: &Plan, client: &Client) -> Result<CycleStats, String> {
    let sb = crate::stats::bounded(async { Ok(client.create(&create_req()).await?) })
        .await
        .map_err(|e| format!("create: {e:#}"))?;
    let s = sb.clone();
    let r = run_cycles(plan.warmup, plan.n_exec, 1, move |_, _| {
        let s = s.clone();
        async move {
            let t = Instant::now();
            let ex = s.exec(&warren_sdk::argv(["true"])).await?;
            let took = t.elapsed();
            if ex.status.exit_code != 0 {
                bail!("`true` exited {}", ex.status.exit_code);
            }
            Ok(Phases {
                exec: Some(took),
                ..Default::default()
            })
        }
    })
    .await;
    let killed = crate::stats::bounded(async { Ok(sb.kill().await?) }).await;
    match (r, killed) {
        (Ok(r), Ok(())) => Ok(r),
        (Err(e), _) => Err(e),
        (Ok(_), Err(e)) => Err(format!("kill: {e:#}")),
    }
}

async fn idle_memory(
    plan: &Plan,
    client: &Client,
    up_pid: Option<i32>,
) -> Result<IdleMemory, String> {
    let n = plan.n_idle;
    // Let the trash of the earlier phases go and the page cache settle.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let avail0 = host::mem_available();
    let rss0 = up_pid.and_then(host::vm_rss);

    let made = Arc::new(Mutex::new(Vec::with_capacity(n)));
    let m = made.clone();
    let c = client.clone();
    let created = run_cycles(0, n, plan.idle_conc, move |_, _| {
        let (c, m) = (c.clone(), m.clone());
        async move {
            let t = Instant::now();
            let sb = c.create(&create_req()).await.context("create")?;
            let took = t.elapsed();
            m.lock().unwrap_or_else(|p| p.into_inner()).push(sb);
            Ok(Phases {
                create: Some(took),
                ..Default::default()
            })
        }
    })
    .await;
    let sandboxes: Vec<warren_sdk::Sandbox> =
        std::mem::take(&mut *made.lock().unwrap_or_else(|p| p.into_inner()));
    let (create_wall, create_lat, create_errors, first_error) = match &created {
        Ok(s) => (s.wall, s.create.clone(), s.errors, s.first_error.clone()),
        Err(e) => (Duration::ZERO, Samples::default(), n, Some(e.clone())),
    };

    let mut out = IdleMemory {
        wanted: n,
        made: sandboxes.len(),
        create_errors,
        first_error,
        create_wall,
        create_lat,
        mem_available_drop: None,
        cgroup_usage: None,
        guest_rss: None,
        daemon_rss_growth: None,
        kill_wall: Duration::ZERO,
        killed: 0,
        kill_errors: 0,
        stray_cgroups: 0,
        warm_inits: 0,
    };
    if !sandboxes.is_empty() {
        tokio::time::sleep(Duration::from_secs(3)).await;
        let k = sandboxes.len() as f64;
        if let (Some(a0), Some(a1)) = (avail0, host::mem_available()) {
            out.mem_available_drop = Some((a0 as f64 - a1 as f64) / k);
        }
        if let (Some(r0), Some(r1)) = (rss0, up_pid.and_then(host::vm_rss)) {
            out.daemon_rss_growth = Some((r1 as f64 - r0 as f64) / k);
        }
        let ours: std::collections::HashSet<String> =
            sandboxes.iter().map(|s| s.id().to_string()).collect();
        let keep = |n: &str| ours.contains(n);
        if let Some((mem_dir, usage_file, pids_dir)) = host::sandbox_cgroup_dirs(CGROUP_PARENT) {
            for n in host::child_names(&pids_dir) {
                if n.starts_with(host::WARM_PREFIX) {
                    out.warm_inits += 1;
                } else if !keep(&n) {
                    out.stray_cgroups += 1;
                }
            }
            out.cgroup_usage = host::mean_of_children(&mem_dir, usage_file, keep);
            let rss: Vec<u64> = host::procs_of_children(&pids_dir, keep)
                .into_iter()
                .filter(|&p| host::comm(p).as_deref() == Some("warren-guest"))
                .filter_map(host::vm_rss)
                .collect();
            if !rss.is_empty() {
                out.guest_rss = Some((rss.iter().sum::<u64>() / rss.len() as u64, rss.len()));
            }
        }
    }

    // Kill them all, 'idle_conc' at a time, timing the whole.
    let queue = Arc::new(Mutex::new(sandboxes));
    let t = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..plan.idle_conc {
        let q = queue.clone();
        tasks.push(tokio::spawn(async move {
            let (mut ok, mut err) = (0, 0);
            loop {
                let next = q.lock().unwrap_or_else(|p| p.into_inner()).pop();
                let Some(sb) = next else { break };
                match crate::stats::bounded(async { Ok(sb.kill().await?) }).await {
                    Ok(()) => ok += 1,
                    Err(_) => err += 1,
                }
            }
            (ok, err)
        }));
    }
    for task in tasks {
        if let Ok((ok, err)) = task.await {
            out.killed += ok;
            out.kill_errors += err;
        }
    }
    out.kill_wall = t.elapsed();
    if out.made == 0 {
        return Err(out
            .first_error
            .unwrap_or_else(|| "no sandbox was created".into()));
    }
    Ok(out)
}
