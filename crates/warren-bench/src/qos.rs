//! `warren-bench qos | density | reclaim | prefetch`: plan-by-use measured on this machine, with the node
//! library in this process (each run in a network namespace of its own).
//!
//! - `qos`: the DSec paper's interference experiment. A latency-sensitive sandbox runs a
//!   fixed compute step (a Python loop of known length, 10 ms of think time between steps)
//!   and records each step's latency; best-effort sandboxes run busy loops at 0 %, 50 % and
//!   100 % of every core. Configurations: unprotected (the interferers in the same class and
//!   weight as the latency-sensitive sandbox), `SCHED_IDLE` for the interferers' processes,
//!   `cpu.idle` for their cgroups (Warren's default), and core scheduling where the kernel
//!   and CPUs have it. Mean and p99 rise against the 0 % baseline, beside the paper's figures.
//! - `density [N]`: idle sandboxes created 32 at a time up to N (default 20,000), with, at
//!   every 2,000: creates/s of that step, exec p50/p99, host memory per sandbox, kernel slab;
//!   then all killed.
//! - `reclaim [N]`: N sandboxes (default 500) each holding 20 MiB of swap-backed memory
//!   (`/dev/shm`, compressible text); their task paused and resumed, without swap and with a
//!   zram swap device made for the run (removed after).
//! - `prefetch [N]`: N sandboxes (default 200) each with a process holding 20 MiB of
//!   anonymous memory, paused to swap and resumed, with `prefetch_on_resume` off and on: how
//!   much memory is back before the agent's next step, and how long that step's first touch
//!   of every page takes.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use warren_node::{Node, NodeConfig};
use warren_types::ByteSize;
use warren_types::api::{CreateSandbox, ExecRequest, QosClass, TaskAction};
use warren_types::id::SandboxId;

use crate::host;
use crate::stats::Samples;

const CGROUP_PARENT: &str = "warren-bench-qos";

/// A node on a state directory of its own (a temporary one, kept with it) with `extra`
/// settings.
async fn start(
    prefix: &str,
    exe_dir: &Path,
    extra: serde_json::Value,
) -> anyhow::Result<(tempfile::TempDir, Arc<Node>)> {
    let work = tempfile::Builder::new().prefix(prefix).tempdir()?;
    let state = work.path().join("node");
    let guest = exe_dir.join("warren-guest");
    host::preflight_cgroup_parent(CGROUP_PARENT)?;
    let mut cfg = serde_json::json!({
        "state_dir": state,
        "cgroup_parent": CGROUP_PARENT,
        "guest_binary": guest,
        "disk_quota": "off",
        "network": {"enabled": false},
    });
    if let (Some(c), Some(e)) = (cfg.as_object_mut(), extra.as_object()) {
        for (k, v) in e {
            c.insert(k.clone(), v.clone());
        }
    }
    let cfg: NodeConfig = serde_json::from_value(cfg)?;
    let (node, _) = Node::start(cfg).await?;
    Ok((work, node))
}

async fn shut(node: Arc<Node>) {
    let _ = node.kill_all().await;
    node.shutdown().await;
    drop(node);
    tokio::time::sleep(Duration::from_millis(300)).await;
    host::remove_cgroup_parent(CGROUP_PARENT, true);
}

async fn sh(node: &Node, id: &SandboxId, cmd: &str) -> anyhow::Result<String> {
    let p = warren_node::exec::prepare(
        &ExecRequest {
            cmd: Some(cmd.into()),
            timeout: Some(600.0),
            ..Default::default()
        },
        None,
    )?;
    let r = node.exec(id, p).await?;
    anyhow::ensure!(
        r.status.exit_code == 0,
        "`{cmd}` exited {}: {}",
        r.status.exit_code,
        r.stderr
    );
    Ok(r.stdout)
}

fn cores() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

// ---- qos: the interference experiment ----

/// The latency-sensitive step: `W` iterations of a loop, after 10 ms of think time; prints
/// each step's latency in microseconds.
const STEP: &str = r#"
import sys, time
n, w = int(sys.argv[1]), int(sys.argv[2])
def work():
    s = 0
    for i in range(w):
        s += i * i
    return s
out = []
for _ in range(n):
    time.sleep(0.01)
    t = time.perf_counter()
    work()
    out.append(time.perf_counter() - t)
print(" ".join("%d" % (x * 1e6) for x in out))
"#;

/// An interferer: busy for `duty` of every 10 ms, forever.
const BUSY: &str = r#"
import sys, time
d = float(sys.argv[1])
while True:
    t = time.perf_counter()
    while time.perf_counter() - t < 0.01 * d:
        pass
    if d < 1:
        time.sleep(0.01 * (1 - d))
"#;

/// Step latencies (µs) of `steps` steps in the latency-sensitive sandbox `ls`, with
/// interferers at `load` in new sandboxes of class `class` (and CPU request `request`).
async fn run_load(
    node: &Arc<Node>,
    ls: &SandboxId,
    steps: usize,
    w: u64,
    load: f64,
    class: QosClass,
) -> anyhow::Result<Vec<u64>> {
    let mut interferers = Vec::new();
    if load > 0.0 {
        for _ in 0..cores() {
            let (v, _) = node
                .create(
                    CreateSandbox {
                        image: "host".into(),
                        cpu: Some(if class == QosClass::Ls { 1000 } else { 0 }),
                        cpu_limit: Some(1000),
                        qos: Some(class),
                        ..Default::default()
                    },
                    None,
                )
                .await?;
            sh(
                node,
                &v.id,
                &format!(
                    "cat > /tmp/busy.py <<'EOF'\n{BUSY}\nEOF\n\
                     python3 /tmp/busy.py {load} >/dev/null 2>&1 &"
                ),
            )
            .await?;
            interferers.push(v.id);
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let out = sh(node, ls, &format!("python3 /tmp/step.py {steps} {w}")).await;
    for id in interferers {
        let _ = node.kill(&id).await;
    }
    let out = out?;
    Ok(out
        .split_whitespace()
        .filter_map(|v| v.parse().ok())
        .collect())
}

fn mean(v: &[u64]) -> f64 {
    v.iter().sum::<u64>() as f64 / v.len().max(1) as f64
}

fn p99(v: &[u64]) -> f64 {
    let mut s = v.to_vec();
    s.sort_unstable();
    s.get((s.len() * 99 / 100).min(s.len().saturating_sub(1)))
        .copied()
        .unwrap_or(0) as f64
}

/// Rounds each configuration's loads are measured in.
const ROUNDS: usize = 3;

/// One configuration's rows: (load, mean µs, p99 µs).
type Rows = Vec<(f64, f64, f64)>;

async fn configuration(
    exe_dir: &Path,
    cpu_idle: bool,
    class: QosClass,
    steps: usize,
    w: Option<u64>,
) -> anyhow::Result<(Rows, u64, serde_json::Value)> {
    let (_work, node) = start(
        "warren-qos.",
        exe_dir,
        serde_json::json!({"qos_cpu_idle": cpu_idle, "warm_pool": 4}),
    )
    .await?;
    let result = async {
        let support = serde_json::to_value(node.info().qos)?;
        let (ls, _) = node
            .create(
                CreateSandbox {
                    image: "host".into(),
                    cpu: Some(1000),
                    cpu_limit: Some(1000),
                    qos: Some(QosClass::Ls),
                    ..Default::default()
                },
                None,
            )
            .await?;
        sh(
            &node,
            &ls.id,
            &format!("cat > /tmp/step.py <<'EOF'\n{STEP}\nEOF\n"),
        )
        .await?;
        // Calibrate once: about 10 ms per step on an idle machine.
        let w = match w {
            Some(w) => w,
            None => {
                let t = run_load(&node, &ls.id, 20, 100_000, 0.0, class).await?;
                let per = mean(&t[5..]) / 100_000.0;
                (10_000.0 / per) as u64
            }
        };
        // Rounds of the three loads in turn, so drift on the machine (a VM's neighbours)
        // falls on every load alike.
        let loads = [0.0, 0.5, 1.0];
        let mut all: Vec<Vec<u64>> = vec![Vec::new(); loads.len()];
        for _ in 0..ROUNDS {
            for (i, load) in loads.iter().enumerate() {
                let t = run_load(&node, &ls.id, steps / ROUNDS, w, *load, class).await?;
                all[i].extend(t);
            }
        }
        let rows = loads
            .iter()
            .zip(&all)
            .map(|(load, t)| (*load, mean(t), p99(t)))
            .collect();
        anyhow::Ok((rows, w, support))
    }
    .await;
    shut(node).await;
    result
}

pub async fn interference(exe_dir: &Path, steps: usize) -> String {
    let mut out = String::new();
    out.push_str(&format!(
        "## Interference: a latency-sensitive sandbox beside best-effort load\n\n\
         {} cores; {steps} steps of ~10 ms of Python compute each per load, 10 ms apart, in \
         {ROUNDS} rounds of the three loads in turn; interferers: one sandbox per core running \
         a busy loop at the load's duty cycle (10 ms period). Rise = against the same \
         configuration at 0 % load.\n\n",
        cores()
    ));
    out.push_str(
        "| configuration | load | mean step | p99 step | mean rise | p99 rise |\n\
         |---|---|---|---|---|---|\n",
    );
    let configs: [(&str, bool, QosClass); 3] = [
        (
            "unprotected (interferers same class and weight)",
            true,
            QosClass::Ls,
        ),
        ("SCHED_IDLE interferers (cpu.idle off)", false, QosClass::Be),
        (
            "cpu.idle interferers (Warren's default)",
            true,
            QosClass::Be,
        ),
    ];
    let mut w = None;
    let mut support = serde_json::Value::Null;
    for (name, cpu_idle, class) in configs {
        match configuration(exe_dir, cpu_idle, class, steps, w).await {
            Ok((rows, cal, s)) => {
                w = Some(cal);
                if cpu_idle {
                    support = s;
                }
                let (m0, p0) = (rows[0].1, rows[0].2);
                for (load, m, p) in rows {
                    out.push_str(&format!(
                        "| {name} | {:.0} % | {:.2} ms | {:.2} ms | {:+.1} % | {:+.1} % |\n",
                        load * 100.0,
                        m / 1000.0,
                        p / 1000.0,
                        (m / m0 - 1.0) * 100.0,
                        (p / p0 - 1.0) * 100.0
                    ));
                }
            }
            Err(e) => out.push_str(&format!("| {name} | failed: {e} | | | | |\n")),
        }
    }
    let core = support
        .get("core_scheduling_used")
        .and_then(|v| v.as_bool())
        .unwrap_or(false);
    if !core {
        out.push_str(&format!(
            "| core scheduling | not measured: this machine {} | | | | |\n",
            match (
                support.get("core_scheduling").and_then(|v| v.as_bool()),
                support.get("smt").and_then(|v| v.as_str())
            ) {
                (Some(false), Some(smt)) =>
                    format!("has no core scheduling (CONFIG_SCHED_CORE) and SMT {smt}"),
                (_, Some(smt)) => format!("has SMT {smt}: no two tasks share a core"),
                _ => "could not tell".into(),
            }
        ));
    }
    out.push_str(
        "\nThe paper's figures (its production nodes, SMT on), under 50 % interfering load: \
         +45.2 % step latency unprotected, at most 3.4 % better with SCHED_IDLE, +17.3 % with \
         core scheduling; a later implementation: +18.0 % → +2.1 % at 50 %, +81.0 % → +10.0 % \
         at 100 %. Target here: rise ≤ 5 % at 100 % with protection on.\n",
    );
    out
}

// ---- density ----

fn slab_unreclaimable() -> u64 {
    host::meminfo_field("SUnreclaim:").unwrap_or(0)
}

/// CPU time of process `pid` (utime + stime), clock ticks.
fn proc_ticks(pid: i32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let after = stat.rfind(')').map_or("", |i| &stat[i + 1..]);
    let f: Vec<u64> = after
        .split_whitespace()
        .filter_map(|v| v.parse().ok())
        .collect();
    // Fields after the name: state is not a number, so utime and stime are 10th and 11th.
    f.get(10).copied().unwrap_or(0) + f.get(11).copied().unwrap_or(0)
}

pub async fn density(exe_dir: &Path, target: usize) -> String {
    use std::io::Write;
    let budget: u64 = std::env::var("WARREN_BENCH_MINUTES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(10);
    let mut out = String::new();
    let (_work, node) = match start("warren-density.", exe_dir, serde_json::json!({})).await {
        Ok(n) => n,
        Err(e) => return format!("density: the node did not start: {e}\n"),
    };
    let info = node.info();
    out.push_str(&format!(
        "## Density: idle sandboxes on one node\n\n\
         {} cores, {} of memory; max_sandboxes derived at start: {} (kernel.pid_max {}). \
         Sandboxes: the `host` image, network `none`, requests cpu 0 and memory 0 (idle \
         best-effort), created 32 at a time. Memory per sandbox: the drop in MemAvailable \
         over the sandboxes made so far.\n\n\
         `machine PID 1`: the CPU the machine's own init (outside Warren) used during the step, \
         share of one core. Stops at N, at the first refusal, under 1 GiB available, or after \
         {budget} minutes.\n\n\
         | sandboxes | creates/s (this step) | exec p50 | exec p99 | memory/sandbox | SUnreclaim | MemAvailable | machine PID 1 |\n\
         |---|---|---|---|---|---|---|---|\n",
        info.cpu_cores, info.memory_total, info.max_sandboxes, info.pid_max
    ));
    print!("{out}");
    out.clear();
    let req = CreateSandbox {
        image: "host".into(),
        cpu: Some(0),
        memory: Some(ByteSize(0)),
        ..Default::default()
    };
    let avail0 = host::mem_available().unwrap_or(0);
    let mut ids: Vec<SandboxId> = Vec::new();
    let started = Instant::now();
    let mut stop = None;
    let step = 2000;
    while ids.len() < target && stop.is_none() {
        if started.elapsed() > Duration::from_secs(budget * 60) {
            stop = Some(format!(
                "at {}: the {budget}-minute budget ran out",
                ids.len()
            ));
            break;
        }
        let t = Instant::now();
        let before = ids.len();
        let pid1 = proc_ticks(1);
        let goal = (ids.len() + step).min(target);
        while ids.len() < goal {
            let n = 32.min(goal - ids.len());
            let creates = (0..n).map(|_| node.create(req.clone(), None));
            for r in futures_util::future::join_all(creates).await {
                match r {
                    Ok((v, _)) => ids.push(v.id),
                    Err(e) => stop = Some(format!("at {}: {e}", ids.len())),
                }
            }
            if stop.is_some() {
                break;
            }
            if host::mem_available().unwrap_or(0) < 1 << 30 {
                stop = Some(format!("at {}: under 1 GiB of memory available", ids.len()));
                break;
            }
        }
        let rate = (ids.len() - before) as f64 / t.elapsed().as_secs_f64();
        let mut execs = Samples::default();
        for i in 0..100 {
            let id = &ids[(i * 7919) % ids.len()];
            let t = Instant::now();
            if sh(&node, id, "true").await.is_ok() {
                execs.push(t.elapsed());
            }
        }
        let avail = host::mem_available().unwrap_or(0);
        let pid1 = (proc_ticks(1) - pid1) as f64 / 100.0 / t.elapsed().as_secs_f64();
        out.push_str(&format!(
            "| {} | {:.0} | {:.1} ms | {:.1} ms | {:.2} MiB | {} MiB | {} MiB | {:.0} % |\n",
            ids.len(),
            rate,
            execs.pct(50.0).unwrap_or_default().as_secs_f64() * 1000.0,
            execs.pct(99.0).unwrap_or_default().as_secs_f64() * 1000.0,
            avail0.saturating_sub(avail) as f64 / ids.len().max(1) as f64 / 1048576.0,
            slab_unreclaimable() >> 20,
            avail >> 20,
            pid1 * 100.0,
        ));
        print!("{out}");
        out.clear();
        let _ = std::io::stdout().flush();
    }
    let made_in = started.elapsed();
    let t = Instant::now();
    let n = ids.len();
    for chunk in ids.chunks(64) {
        let kills = chunk.iter().map(|id| node.kill(id));
        futures_util::future::join_all(kills).await;
    }
    let killed_in = t.elapsed();
    shut(node).await;
    out.push_str(&format!(
        "\n{n} sandboxes made in {:.0} s ({:.0}/s overall), killed in {:.0} s ({:.0}/s).{}\n",
        made_in.as_secs_f64(),
        n as f64 / made_in.as_secs_f64(),
        killed_in.as_secs_f64(),
        n as f64 / killed_in.as_secs_f64(),
        stop.map(|s| format!(" Stopped {s}.")).unwrap_or_default()
    ));
    out
}

// ---- reclaim ----

/// A zram swap device for the run, removed when dropped.
struct Zram(String);

impl Zram {
    fn make(size: &str) -> anyhow::Result<Zram> {
        let id = std::fs::read_to_string("/sys/class/zram-control/hot_add")?
            .trim()
            .to_string();
        let z = Zram(id);
        std::fs::write(format!("/sys/block/zram{}/disksize", z.0), size)?;
        let dev = format!("/dev/zram{}", z.0);
        for args in [vec!["mkswap", dev.as_str()], vec!["swapon", dev.as_str()]] {
            let o = std::process::Command::new(args[0])
                .args(&args[1..])
                .output()?;
            anyhow::ensure!(o.status.success(), "{args:?} failed");
        }
        Ok(z)
    }
}

impl Drop for Zram {
    fn drop(&mut self) {
        let _ = std::process::Command::new("swapoff")
            .arg(format!("/dev/zram{}", self.0))
            .status();
        let _ = std::fs::write(format!("/sys/block/zram{}/reset", self.0), "1");
        let _ = std::fs::write("/sys/class/zram-control/hot_remove", &self.0);
    }
}

/// Waits (at most two minutes) until memory pressure (PSI `some avg10`) is under 2 %: the
/// node's admission refuses creates under pressure, and a previous run's teardown leaves some.
async fn settle_pressure() {
    for _ in 0..120 {
        match warren_node::capacity::read_pressure() {
            Some(p) if p.memory >= 2.0 => tokio::time::sleep(Duration::from_secs(1)).await,
            _ => return,
        }
    }
}

async fn reclaim_run(exe_dir: &Path, n: usize) -> anyhow::Result<String> {
    settle_pressure().await;
    let (_work, node) = start("warren-reclaim.", exe_dir, serde_json::json!({})).await?;
    let result = async {
        let req = CreateSandbox {
            image: "host".into(),
            task: Some("bench-reclaim".into()),
            cpu: Some(0),
            memory: Some(ByteSize(20 << 20)),
            ..Default::default()
        };
        let mut ids = Vec::new();
        while ids.len() < n {
            let k = 32.min(n - ids.len());
            let creates = (0..k).map(|_| node.create(req.clone(), None));
            for r in futures_util::future::join_all(creates).await {
                ids.push(r?.0.id);
            }
        }
        for chunk in ids.chunks(16) {
            let fills = chunk.iter().map(|id| {
                sh(
                    &node,
                    id,
                    "seq 1 9999999 | head -c 20971520 > /dev/shm/fill",
                )
            });
            for r in futures_util::future::join_all(fills).await {
                r?;
            }
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
        let before = host::mem_available().unwrap_or(0);
        let t = Instant::now();
        let paused = node
            .task_action("bench-reclaim", TaskAction::Pause, None)
            .await;
        let pause_time = t.elapsed();
        let after = host::mem_available().unwrap_or(0);
        let t = Instant::now();
        let resumed = node
            .task_action("bench-reclaim", TaskAction::Resume, None)
            .await;
        let resume_time = t.elapsed();
        // The first touch of every page after resume: each sandbox reads its data back.
        let t = Instant::now();
        for chunk in ids.chunks(16) {
            let reads = chunk
                .iter()
                .map(|id| sh(&node, id, "wc -c < /dev/shm/fill"));
            for r in futures_util::future::join_all(reads).await {
                anyhow::ensure!(r?.trim() == "20971520", "data lost");
            }
        }
        let touch_time = t.elapsed();
        anyhow::ensure!(
            paused.failed.is_empty() && resumed.failed.is_empty(),
            "pause/resume failed: {:?} {:?}",
            paused.failed.first(),
            resumed.failed.first()
        );
        Ok(format!(
            "| {} MiB | {} MiB | {:.2} s | {:.2} s | {:.2} s |",
            paused.memory_freed.unwrap_or(0) >> 20,
            after.saturating_sub(before) >> 20,
            pause_time.as_secs_f64(),
            resume_time.as_secs_f64(),
            touch_time.as_secs_f64()
        ))
    }
    .await;
    shut(node).await;
    result
}

/// Page cache: `n` sandboxes read the same read-only file of the `host` image; how much the
/// page cache grew, and how much the sandboxes' cgroups were charged in all.
async fn shared_pages(exe_dir: &Path, n: usize) -> anyhow::Result<String> {
    // The largest regular file under /usr/lib of a few MiB or more.
    let mut best: Option<(u64, std::path::PathBuf)> = None;
    let mut stack = vec![std::path::PathBuf::from("/usr/lib")];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            let Ok(ft) = e.file_type() else { continue };
            if ft.is_dir() {
                stack.push(e.path());
            } else if ft.is_file() {
                let len = e.metadata().map(|m| m.len()).unwrap_or(0);
                if best.as_ref().is_none_or(|b| len > b.0) {
                    best = Some((len, e.path()));
                }
            }
        }
    }
    let (len, file) = best.ok_or_else(|| anyhow::anyhow!("no file under /usr/lib"))?;
    let (_work, node) = start("warren-shared.", exe_dir, serde_json::json!({})).await?;
    let result = async {
        let mut ids = Vec::new();
        for _ in 0..n {
            ids.push(
                node.create(
                    CreateSandbox {
                        image: "host".into(),
                        ..Default::default()
                    },
                    None,
                )
                .await?
                .0
                .id,
            );
        }
        // Out of the page cache first, so the first reader brings it in.
        let drop = std::process::Command::new("dd")
            .arg(format!("if={}", file.display()))
            .args(["iflag=nocache", "count=0", "status=none"])
            .status();
        let _ = drop;
        let charged = |node: &Node| -> u64 {
            let Some((dir, file, _)) = host::sandbox_cgroup_dirs(CGROUP_PARENT) else {
                return 0;
            };
            node.list(&Default::default())
                .iter()
                .filter_map(|v| {
                    std::fs::read_to_string(dir.join(v.id.as_str()).join(file))
                        .ok()?
                        .trim()
                        .parse::<u64>()
                        .ok()
                })
                .sum()
        };
        let cached0 = host::meminfo_field("Cached:").unwrap_or(0);
        let charged0 = charged(&node);
        for id in &ids {
            sh(&node, id, &format!("cat {} > /dev/null", file.display())).await?;
        }
        let cached = host::meminfo_field("Cached:")
            .unwrap_or(0)
            .saturating_sub(cached0);
        let charged = charged(&node).saturating_sub(charged0);
        anyhow::Ok(format!(
            "{n} sandboxes of the `host` image each read {} ({:.1} MiB, the host's /usr bound \
             read-only): the page cache grew by {:.1} MiB and the sandboxes' cgroups were \
             charged {:.1} MiB in all — the file's pages are held once and charged to the \
             first reader, not {n} times. (Measured for the `host` image; layered images' \
             EROFS files were not measured here.)\n",
            file.display(),
            len as f64 / 1048576.0,
            cached as f64 / 1048576.0,
            charged as f64 / 1048576.0
        ))
    }
    .await;
    shut(node).await;
    result
}

/// The holder of 20 MiB of anonymous memory (text: compressible as real heaps are) that sums
/// it all when told to (SIGUSR1) and writes `/tmp/check`.
const HOLDER: &str = "python3 -c '
import os, signal, time
b = bytearray(b\"warren \" * (3 << 20))
def check(*_):
    open(\"/tmp/check\", \"w\").write(str(sum(b[::4096])))
signal.signal(signal.SIGUSR1, check)
open(\"/tmp/ready\", \"w\").write(str(os.getpid()))
while True: time.sleep(1)
' >/dev/null 2>&1 & while [ ! -s /tmp/ready ]; do sleep 0.05; done; cat /tmp/ready";

/// Sum of the sandboxes' memory charge now.
fn charged(node: &Node, ids: &[SandboxId]) -> u64 {
    ids.iter()
        .filter_map(|id| node.metrics(id).ok())
        .map(|m| m.memory_used)
        .sum()
}

/// `n` sandboxes each holding 20 MiB of anonymous memory in a process; their task paused
/// (with swap) and resumed; then, `wait` later, every process touches every page.
async fn prefetch_run(exe_dir: &Path, n: usize, prefetch: bool) -> anyhow::Result<String> {
    settle_pressure().await;
    let (_work, node) = start(
        "warren-prefetch.",
        exe_dir,
        serde_json::json!({"prefetch_on_resume": prefetch}),
    )
    .await?;
    let result = async {
        let req = CreateSandbox {
            image: "host".into(),
            task: Some("bench-prefetch".into()),
            cpu: Some(0),
            memory: Some(ByteSize(32 << 20)),
            ..Default::default()
        };
        let mut ids = Vec::new();
        while ids.len() < n {
            let k = 32.min(n - ids.len());
            let creates = (0..k).map(|_| node.create(req.clone(), None));
            for r in futures_util::future::join_all(creates).await {
                ids.push(r?.0.id);
            }
        }
        let mut pids = Vec::new();
        for chunk in ids.chunks(16) {
            let holds = chunk.iter().map(|id| sh(&node, id, HOLDER));
            for r in futures_util::future::join_all(holds).await {
                pids.push(r?.trim().to_string());
            }
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
        let held = charged(&node, &ids);
        let t = Instant::now();
        let paused = node.task_action("bench-prefetch", TaskAction::Pause, None).await;
        let pause_time = t.elapsed();
        let t = Instant::now();
        let resumed = node.task_action("bench-prefetch", TaskAction::Resume, None).await;
        let resume_time = t.elapsed();
        anyhow::ensure!(
            paused.failed.is_empty() && resumed.failed.is_empty(),
            "pause/resume failed: {:?} {:?}",
            paused.failed.first(),
            resumed.failed.first()
        );
        // The model thinks: nothing runs in the sandboxes for a while.
        let low = paused.memory_freed.unwrap_or(0);
        let mut back_in = None;
        let wait = Duration::from_secs(10);
        while t.elapsed() < wait {
            tokio::time::sleep(Duration::from_millis(250)).await;
            if back_in.is_none() && charged(&node, &ids) + low / 10 >= held {
                back_in = Some(t.elapsed());
            }
        }
        let back = charged(&node, &ids);
        // The agent's next step touches all of its memory.
        let mut lat = Vec::new();
        let touch = Instant::now();
        let node_ref: &Node = &node;
        for chunk in ids.iter().zip(&pids).collect::<Vec<_>>().chunks(16) {
            let touches = chunk.iter().map(|(id, pid)| async move {
                let t = Instant::now();
                let r = sh(
                    node_ref,
                    id,
                    &format!("rm -f /tmp/check; kill -USR1 {pid}; while [ ! -s /tmp/check ]; do sleep 0.01; done"),
                )
                .await;
                r.map(|_| t.elapsed())
            });
            for r in futures_util::future::join_all(touches).await {
                lat.push(r?.as_secs_f64() * 1000.0);
            }
        }
        let touch_time = touch.elapsed();
        lat.sort_by(f64::total_cmp);
        let pct = |q: f64| lat[((lat.len() as f64 * q) as usize).min(lat.len() - 1)];
        Ok(format!(
            "| {} | {} MiB | {} MiB | {:.2} s | {:.2} s | {} MiB ({}) | {:.2} s | {:.0} ms | {:.0} ms |",
            if prefetch { "on" } else { "off" },
            held >> 20,
            low >> 20,
            pause_time.as_secs_f64(),
            resume_time.as_secs_f64(),
            back >> 20,
            back_in
                .map(|d| format!("90 % in {:.1} s", d.as_secs_f64()))
                .unwrap_or_else(|| "not back in 10 s".into()),
            touch_time.as_secs_f64(),
            pct(0.5),
            pct(0.99),
        ))
    }
    .await;
    shut(node).await;
    result
}

/// Prefetch after resume, off and on, with swap (the host's, or zram made for the run).
pub async fn prefetch(exe_dir: &Path, n: usize) -> String {
    let mut out = format!(
        "## Prefetch after resume: {n} sandboxes × a process holding 20 MiB of anonymous memory\n\n\
         Paused (reclaimed to swap), resumed, left alone 10 s (the model thinking), then every \
         process reads every page (an exec that signals it and waits: p50/p99 per sandbox, 16 \
         at a time).\n\n\
         | prefetch | charged before | freed by pause | pause | resume | charged 10 s after resume | first touch, all | touch p50 | touch p99 |\n\
         |---|---|---|---|---|---|---|---|---|\n"
    );
    let _zram = if host::meminfo_field("SwapTotal:").unwrap_or(0) == 0 {
        match Zram::make(&format!("{}", (n as u64 * 40) << 20)) {
            Ok(z) => Some(z),
            Err(e) => {
                out.push_str(&format!(
                    "| no swap, and zram could not be set up: {e} |
"
                ));
                return out;
            }
        }
    } else {
        None
    };
    for on in [false, true] {
        match prefetch_run(exe_dir, n, on).await {
            Ok(row) => out.push_str(&format!(
                "{row}
"
            )),
            Err(e) => out.push_str(&format!(
                "| {on} | failed: {e} |
"
            )),
        }
    }
    out
}

pub async fn reclaim(exe_dir: &Path, n: usize) -> String {
    let mut out = format!(
        "## Pause reclaim: {n} sandboxes × 20 MiB of /dev/shm (text; swap-backed memory)\n\n\
         | swap | freed (reported) | MemAvailable gained | pause | resume | read back after |\n\
         |---|---|---|---|---|---|\n"
    );
    let swap0 = host::meminfo_field("SwapTotal:").unwrap_or(0);
    let label = if swap0 == 0 { "none" } else { "the host's own" };
    match reclaim_run(exe_dir, n).await {
        Ok(row) => out.push_str(&format!("| {label} {row}\n")),
        Err(e) => out.push_str(&format!("| {label} | failed: {e} | | | | |\n")),
    }
    if swap0 == 0 {
        match Zram::make(&format!("{}", (n as u64 * 24) << 20)) {
            Ok(z) => {
                match reclaim_run(exe_dir, n).await {
                    Ok(row) => out.push_str(&format!("| zram (made for the run) {row}\n")),
                    Err(e) => out.push_str(&format!("| zram | failed: {e} | | | | |\n")),
                }
                drop(z);
            }
            Err(e) => out.push_str(&format!("| zram | could not be set up: {e} | | | | |\n")),
        }
    }
    match shared_pages(exe_dir, 20).await {
        Ok(line) => out.push_str(&format!("\n{line}")),
        Err(e) => out.push_str(&format!("\nshared pages: failed: {e}\n")),
    }
    out.push_str(
        "\nWithout swap only page cache can go (the sandboxes' own files are swap-backed \
         /dev/shm pages): what a pause frees is what the kernel could drop. With zram the pages \
         are compressed into memory, so MemAvailable gains the difference between the data \
         and its compressed size.\n",
    );
    out
}
