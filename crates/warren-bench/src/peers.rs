//! The peers, on the same root file system as Warren's `host` image (host /usr read-only,
//! /proc, /dev, a tmpfs /tmp): bubblewrap, runc, and a plain spawn of `true` as the floor.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use serde_json::{Value, json};
use tokio::process::Command;

use crate::host;
use crate::stats::{CycleStats, Phases, run_cycles};
use crate::{Plan, cycle_result};

/// The cgroup parent given to runc (`linux.cgroupsPath`).
pub const RUNC_CGROUP_PARENT: &str = "warren-bench-runc";

/// Top-level directories that are either symlinks into /usr (merged /usr) or real ones.
const TOP_LEVEL_SYSTEM: &[&str] = &["bin", "sbin", "lib", "lib32", "lib64", "libx32"];

/// How the host's top-level system directories look: a symlink (target) or a directory.
enum TopLevel {
    Symlink(String, PathBuf),
    Dir(String),
}

fn top_level() -> Vec<TopLevel> {
    let mut v = Vec::new();
    for d in TOP_LEVEL_SYSTEM {
        let p = Path::new("/").join(d);
        match std::fs::symlink_metadata(&p) {
            Ok(m) if m.file_type().is_symlink() => {
                if let Ok(t) = std::fs::read_link(&p) {
                    v.push(TopLevel::Symlink(d.to_string(), t));
                }
            }
            Ok(m) if m.is_dir() => v.push(TopLevel::Dir(d.to_string())),
            _ => {}
        }
    }
    v
}

/// bwrap's arguments for running `cmd` on the `host`-image-like root.
pub fn bwrap_args(cmd: &[&str]) -> Vec<String> {
    let mut a: Vec<String> = [
        "--unshare-all",
        "--die-with-parent",
        "--ro-bind",
        "/usr",
        "/usr",
    ]
    .map(String::from)
    .to_vec();
    for t in top_level() {
        match t {
            TopLevel::Symlink(d, target) => {
                a.push("--symlink".into());
                a.push(target.to_string_lossy().into_owned());
                a.push(format!("/{d}"));
            }
            TopLevel::Dir(d) => {
                a.push("--ro-bind".into());
                a.push(format!("/{d}"));
                a.push(format!("/{d}"));
            }
        }
    }
    a.extend(
        ["--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp", "--"]
            .map(String::from)
            .to_vec(),
    );
    a.extend(cmd.iter().map(|s| s.to_string()));
    a
}

async fn run_to_end(mut cmd: Command, what: &str) -> anyhow::Result<Phases> {
    let out = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .output()
        .await
        .with_context(|| format!("starting {what}"))?;
    if !out.status.success() {
        bail!(
            "{what} failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(Phases::default())
}

pub struct PeerResults {
    pub c1: Result<CycleStats, String>,
    pub cn: Result<CycleStats, String>,
}

/// A plain spawn of `true` on the host: no isolation at all, the floor.
pub async fn plain(plan: &Plan) -> PeerResults {
    let f = |_, _| run_to_end(Command::new("true"), "true");
    eprintln!(
        "warren-bench: plain spawn of `true`, concurrency 1 and {}",
        plan.conc
    );
    let c1 = run_cycles(plan.warmup, plan.n_c1, 1, f).await;
    let cn = run_cycles(plan.warmup, plan.n_cn, plan.conc, f).await;
    eprintln!("  {}\n  {}", cycle_result(&c1), cycle_result(&cn));
    PeerResults { c1, cn }
}

/// Exec round trip floor: a plain spawn of `true`, N times, one at a time.
pub async fn plain_exec(plan: &Plan) -> Result<CycleStats, String> {
    run_cycles(plan.warmup, plan.n_exec, 1, |_, _| {
        run_to_end(Command::new("true"), "true")
    })
    .await
}

pub async fn bwrap(plan: &Plan) -> PeerResults {
    let args = Arc::new(bwrap_args(&["true"]));
    let f = move |_, _| {
        let mut c = Command::new("bwrap");
        c.args(args.iter());
        run_to_end(c, "bwrap")
    };
    eprintln!("warren-bench: bwrap, concurrency 1 and {}", plan.conc);
    let f = Arc::new(f);
    let g = f.clone();
    let c1 = run_cycles(plan.warmup, plan.n_c1, 1, move |w, i| g(w, i)).await;
    let g = f.clone();
    let cn = run_cycles(plan.warmup, plan.n_cn, plan.conc, move |w, i| g(w, i)).await;
    eprintln!("  {}\n  {}", cycle_result(&c1), cycle_result(&cn));
    PeerResults { c1, cn }
}

/// Prepares runc bundles (one per worker, all on one shared read-only rootfs; each with its
/// own cgroup path so that concurrent containers never share one) under `dir`.
fn runc_bundles(dir: &Path, workers: usize) -> anyhow::Result<Vec<PathBuf>> {
    let rootfs = dir.join("rootfs");
    for d in ["usr", "proc", "dev", "sys", "tmp", "etc"] {
        std::fs::create_dir_all(rootfs.join(d))?;
    }
    let mut extra_mounts = vec![
        json!({"destination": "/usr", "type": "bind", "source": "/usr",
               "options": ["rbind", "ro", "nosuid", "nodev"]}),
        json!({"destination": "/tmp", "type": "tmpfs", "source": "tmpfs",
               "options": ["nosuid", "nodev", "mode=1777"]}),
    ];
    for t in top_level() {
        match t {
            TopLevel::Symlink(d, target) => std::os::unix::fs::symlink(target, rootfs.join(d))?,
            TopLevel::Dir(d) => {
                std::fs::create_dir_all(rootfs.join(&d))?;
                extra_mounts.push(json!({"destination": format!("/{d}"), "type": "bind",
                    "source": format!("/{d}"), "options": ["rbind", "ro", "nosuid", "nodev"]}));
            }
        }
    }
    let tpl = dir.join("template");
    std::fs::create_dir_all(&tpl)?;
    let out = std::process::Command::new("runc")
        .arg("spec")
        .arg("--bundle")
        .arg(&tpl)
        .output()
        .context("running `runc spec`")?;
    if !out.status.success() {
        bail!("runc spec: {}", String::from_utf8_lossy(&out.stderr).trim());
    }
    let base: Value = serde_json::from_slice(&std::fs::read(tpl.join("config.json"))?)?;
    let mut bundles = Vec::new();
    for w in 0..workers {
        let mut c = base.clone();
        c["process"]["args"] = json!(["true"]);
        c["process"]["terminal"] = json!(false);
        c["root"] = json!({"path": rootfs.to_string_lossy(), "readonly": true});
        match c["mounts"].as_array_mut() {
            Some(m) => m.extend(extra_mounts.iter().cloned()),
            None => c["mounts"] = Value::Array(extra_mounts.clone()),
        }
        c["linux"]["cgroupsPath"] = json!(format!("/{RUNC_CGROUP_PARENT}/w{w}"));
        let b = dir.join(format!("b{w}"));
        std::fs::create_dir_all(&b)?;
        std::fs::write(b.join("config.json"), serde_json::to_vec_pretty(&c)?)?;
        bundles.push(b);
    }
    Ok(bundles)
}

pub async fn runc(plan: &Plan) -> Result<PeerResults, String> {
    host::preflight_cgroup_parent(RUNC_CGROUP_PARENT).map_err(|e| format!("{e:#}"))?;
    let work = tempfile::Builder::new()
        .prefix("warren-bench-runc.")
        .tempdir()
        .map_err(|e| format!("temp dir: {e}"))?;
    let state = work.path().join("state");
    let workers = plan.conc.max(1);
    let bundles = runc_bundles(work.path(), workers).map_err(|e| format!("{e:#}"))?;
    let bundles = Arc::new(bundles);
    let me = std::process::id();
    let st = state.clone();
    let f = Arc::new(move |w: usize, i: usize| {
        let mut c = Command::new("runc");
        c.arg("--root")
            .arg(&st)
            .arg("run")
            .arg("--bundle")
            .arg(&bundles[w])
            .arg(format!("wb{me}-{w}-{i}"));
        run_to_end(c, "runc run")
    });
    eprintln!("warren-bench: runc, concurrency 1 and {}", plan.conc);
    let g = f.clone();
    let c1 = run_cycles(plan.warmup, plan.n_c1, 1, move |w, i| g(w, i)).await;
    eprintln!("  {}", cycle_result(&c1));
    let cn = match &c1 {
        Ok(_) => {
            let g = f.clone();
            run_cycles(plan.warmup, plan.n_cn, plan.conc, move |w, i| g(w, i)).await
        }
        Err(e) => Err(e.clone()),
    };
    eprintln!("  {}", cycle_result(&cn));

    // Clean up: containers runc may have left (a failed run), then the cgroups.
    if let Ok(out) = std::process::Command::new("runc")
        .arg("--root")
        .arg(&state)
        .args(["list", "-q"])
        .output()
    {
        for id in String::from_utf8_lossy(&out.stdout).lines() {
            let _ = std::process::Command::new("runc")
                .arg("--root")
                .arg(&state)
                .args(["delete", "--force", id.trim()])
                .output();
        }
    }
    let problems = host::remove_cgroup_parent(RUNC_CGROUP_PARENT, false);
    if !problems.is_empty() {
        eprintln!(
            "warren-bench: runc cgroups left behind: {}",
            problems.join("; ")
        );
    }
    match (c1, cn) {
        (Err(e), _) => Err(e),
        (c1, cn) => Ok(PeerResults { c1, cn }),
    }
}

/// Idle `bwrap … sleep infinity` instances.
pub struct PeerIdle {
    pub wanted: usize,
    pub running: usize,
    pub mem_available_drop: Option<f64>,
    /// Mean summed VmRSS of each instance's processes (bwrap outside, bwrap as PID 1, sleep).
    pub tree_rss: Option<u64>,
    pub procs_per_instance: f64,
    /// Memory cgroup usage per instance (all instances share one cgroup), bytes.
    pub cgroup_usage: Option<u64>,
    pub kill_wall: Duration,
}

/// The memory cgroup the idle bwrap instances are started in, so that their memory can be
/// read the way Warren's sandboxes' is.
pub const BWRAP_CGROUP: &str = "warren-bench-bwrap";

/// Makes the memory cgroup for the idle bwrap instances; its directory and usage file.
fn bwrap_memcg() -> Option<(PathBuf, &'static str)> {
    host::preflight_cgroup_parent(BWRAP_CGROUP).ok()?;
    let (mem_dir, usage, _) = host::sandbox_cgroup_dirs(BWRAP_CGROUP)?;
    match std::fs::create_dir(&mem_dir) {
        Ok(()) => Some((mem_dir, usage)),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Some((mem_dir, usage)),
        Err(_) => None,
    }
}

pub async fn bwrap_idle(n: usize) -> Result<PeerIdle, String> {
    eprintln!("warren-bench: {n} idle bwrap instances");
    let memcg = bwrap_memcg();
    let r = bwrap_idle_in(n, memcg.as_ref()).await;
    if memcg.is_some() {
        for p in host::remove_cgroup_parent(BWRAP_CGROUP, false) {
            eprintln!("warren-bench: cgroup left behind: {p}");
        }
    }
    r
}

async fn bwrap_idle_in(n: usize, memcg: Option<&(PathBuf, &str)>) -> Result<PeerIdle, String> {
    tokio::time::sleep(Duration::from_secs(1)).await;
    let avail0 = host::mem_available();
    let args = bwrap_args(&["sleep", "infinity"]);
    let mut children = Vec::with_capacity(n);
    let mut spawn_err = None;
    for _ in 0..n {
        // With a memory cgroup, a shell joins it and then becomes bwrap (same pid), so that
        // everything bwrap allocates is charged there.
        let mut cmd = match memcg {
            Some((dir, _)) => {
                let mut c = Command::new("/bin/sh");
                c.arg("-c")
                    .arg("echo $$ > \"$0/cgroup.procs\" && exec \"$@\"")
                    .arg(dir)
                    .arg("bwrap");
                c
            }
            None => Command::new("bwrap"),
        };
        match cmd
            .args(&args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
        {
            Ok(c) => children.push(c),
            Err(e) => {
                spawn_err = Some(format!("spawning bwrap: {e}"));
                break;
            }
        }
    }
    let pids: Vec<i32> = children
        .iter()
        .filter_map(|c| c.id().map(|p| p as i32))
        .collect();
    // Wait until every instance has its `sleep` running.
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut trees: Vec<Vec<i32>>;
    loop {
        let map = host::parents();
        trees = pids.iter().map(|&p| host::descendants(&map, p)).collect();
        let ready = trees
            .iter()
            .filter(|t| t.iter().any(|&p| host::comm(p).as_deref() == Some("sleep")))
            .count();
        if ready == pids.len() || Instant::now() > deadline {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let running = trees
        .iter()
        .filter(|t| t.iter().any(|&p| host::comm(p).as_deref() == Some("sleep")))
        .count();
    tokio::time::sleep(Duration::from_secs(3)).await;
    let avail1 = host::mem_available();
    let cgroup_usage = memcg.and_then(|(dir, file)| {
        std::fs::read_to_string(dir.join(file))
            .ok()
            .and_then(|s| s.trim().parse::<u64>().ok())
    });
    let mut rss_sum = 0u64;
    let mut procs = 0usize;
    for (root, tree) in pids.iter().zip(&trees) {
        for p in std::iter::once(root).chain(tree.iter()) {
            if let Some(r) = host::vm_rss(*p) {
                rss_sum += r;
                procs += 1;
            }
        }
    }
    // Remember the inner processes with their start times, to make sure they died.
    let inner: Vec<(i32, Option<u64>)> = trees
        .iter()
        .flatten()
        .map(|&p| (p, warren_sys::process::start_time(p)))
        .collect();
    let t = Instant::now();
    for c in &mut children {
        let _ = c.start_kill();
    }
    for c in &mut children {
        let _ = c.wait().await;
    }
    let kill_wall = t.elapsed();
    let gone_by = Instant::now() + Duration::from_secs(3);
    loop {
        let alive: Vec<i32> = inner
            .iter()
            .filter(|(p, st)| st.is_some() && warren_sys::process::start_time(*p) == *st)
            .map(|(p, _)| *p)
            .collect();
        if alive.is_empty() {
            break;
        }
        if Instant::now() > gone_by {
            for p in alive {
                let _ = warren_sys::process::kill(p, host::SIGKILL);
            }
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    if let Some(e) = spawn_err
        && running == 0
    {
        return Err(e);
    }
    if running == 0 {
        return Err("no bwrap instance got its `sleep` running within 20 s".into());
    }
    let k = pids.len() as f64;
    Ok(PeerIdle {
        wanted: n,
        running,
        mem_available_drop: match (avail0, avail1) {
            (Some(a), Some(b)) => Some((a as f64 - b as f64) / k),
            _ => None,
        },
        tree_rss: Some(rss_sum / pids.len().max(1) as u64),
        cgroup_usage: cgroup_usage.map(|u| u / pids.len().max(1) as u64),
        procs_per_instance: procs as f64 / k,
        kill_wall,
    })
}
