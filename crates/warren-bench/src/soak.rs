//! `warren-bench soak`: create → exec → destroy cycles through the node library, with what
//! the host holds read at the start, every `every` cycles and at the end. Everything a
//! sandbox had must be given back: mounts, cgroups (the kernel's count, which also holds dead
//! memory cgroups an `rmdir` left pinned by page cache), network namespaces, processes, the
//! daemon's descriptors and memory, unreclaimable slab, available memory.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use warren_node::{Node, NodeConfig};
use warren_types::ByteSize;
use warren_types::api::{CreateSandbox, ExecRequest};

use crate::host;

const CGROUP_PARENT: &str = "warren-bench-soak";

/// One reading of the host.
#[derive(Debug, Clone)]
struct Reading {
    cycles: u64,
    secs: f64,
    mounts: usize,
    warren_cgroups: usize,
    kernel_cgroups: String,
    netns: usize,
    processes: usize,
    fds: usize,
    rss_kib: u64,
    sunreclaim_kib: u64,
    available_kib: u64,
}

fn meminfo(field: &str) -> u64 {
    std::fs::read_to_string("/proc/meminfo")
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

fn count(dir: &str) -> usize {
    std::fs::read_dir(dir).map(|d| d.count()).unwrap_or(0)
}

/// `num_cgroups` of the memory, pids, cpu and freezer controllers in `/proc/cgroups`.
fn kernel_cgroups() -> String {
    let t = std::fs::read_to_string("/proc/cgroups").unwrap_or_default();
    ["memory", "pids", "cpu", "freezer"]
        .iter()
        .filter_map(|c| {
            t.lines()
                .find(|l| l.split_whitespace().next() == Some(c))
                .and_then(|l| l.split_whitespace().nth(2))
                .map(|n| format!("{c} {n}"))
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// Distinct network namespaces of the processes on the host.
fn netns() -> usize {
    let mut seen = std::collections::HashSet::new();
    for e in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        if let Ok(l) = std::fs::read_link(e.path().join("ns/net")) {
            seen.insert(l);
        }
    }
    seen.len()
}

fn read(cycles: u64, started: Instant) -> Reading {
    let processes = std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| {
            e.file_name()
                .to_string_lossy()
                .bytes()
                .all(|b| b.is_ascii_digit())
        })
        .count();
    let rss_kib = std::fs::read_to_string("/proc/self/status")
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    let (warren_cgroups, _) = host::count_sandbox_cgroups(CGROUP_PARENT);
    Reading {
        cycles,
        secs: started.elapsed().as_secs_f64(),
        mounts: std::fs::read_to_string("/proc/self/mountinfo")
            .map(|s| s.lines().count())
            .unwrap_or(0),
        warren_cgroups,
        kernel_cgroups: kernel_cgroups(),
        netns: netns(),
        processes,
        fds: count("/proc/self/fd"),
        rss_kib,
        sunreclaim_kib: meminfo("SUnreclaim:"),
        available_kib: meminfo("MemAvailable:"),
    }
}

fn print_header() {
    println!(
        "| cycles | s | mounts | warren cgroups | kernel num_cgroups | netns | processes | daemon fds | daemon RSS | SUnreclaim | MemAvailable |"
    );
    println!("|---:|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|");
}

fn print(r: &Reading) {
    println!(
        "| {} | {:.0} | {} | {} | {} | {} | {} | {} | {} MiB | {} MiB | {} MiB |",
        r.cycles,
        r.secs,
        r.mounts,
        r.warren_cgroups,
        r.kernel_cgroups,
        r.netns,
        r.processes,
        r.fds,
        r.rss_kib / 1024,
        r.sunreclaim_kib / 1024,
        r.available_kib / 1024
    );
}

async fn one(node: Arc<Node>) -> anyhow::Result<()> {
    let (view, _) = node
        .create(
            CreateSandbox {
                image: "host".into(),
                memory: Some(ByteSize(64 << 20)),
                ..Default::default()
            },
            None,
        )
        .await?;
    // A command that touches files (page cache and slab charged to the sandbox's cgroup).
    let p = warren_node::exec::prepare(
        &ExecRequest {
            cmd: Some(
                "ls -R /usr/lib/python3* >/dev/null 2>&1; echo x > /tmp/f; cat /tmp/f".into(),
            ),
            ..Default::default()
        },
        None,
    )?;
    let r = node.exec(&view.id, p).await;
    node.kill(&view.id).await?;
    anyhow::ensure!(r?.stdout == "x\n", "unexpected output");
    Ok(())
}

/// Runs `cycles` cycles, `conc` at a time, reading the host every `every`.
pub async fn run(exe_dir: &Path, cycles: u64, every: u64, conc: usize) -> anyhow::Result<()> {
    host::preflight_cgroup_parent(CGROUP_PARENT)?;
    let work = tempfile::Builder::new().prefix("warren-soak.").tempdir()?;
    let cfg = NodeConfig {
        state_dir: work.path().join("node"),
        cgroup_parent: CGROUP_PARENT.into(),
        guest_binary: Some(exe_dir.join("warren-guest")),
        ..Default::default()
    };
    let (node, _) = Node::start(cfg).await?;
    host::settle_warm_pool(CGROUP_PARENT, Duration::from_secs(10)).await;
    let started = Instant::now();
    println!(
        "Soak: {cycles} create → exec → destroy cycles through the node library, {conc} at a time (the warm pool of 16 inits counts in the cgroups, processes and mounts)."
    );
    println!();
    print_header();
    let first = read(0, started);
    print(&first);
    let done = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let mut failures = 0u64;
    let mut next_report = every;
    while done.load(std::sync::atomic::Ordering::Relaxed) < cycles {
        let batch = conc.min((cycles - done.load(std::sync::atomic::Ordering::Relaxed)) as usize);
        let runs = (0..batch).map(|_| one(node.clone()));
        for r in futures_util::future::join_all(runs).await {
            if let Err(e) = r {
                failures += 1;
                if failures <= 5 {
                    eprintln!("warren-bench soak: a cycle failed: {e:#}");
                }
            }
        }
        let n = done.fetch_add(batch as u64, std::sync::atomic::Ordering::Relaxed) + batch as u64;
        if n >= next_report {
            // Give background deletions a moment, as a steady state would.
            tokio::time::sleep(Duration::from_millis(500)).await;
            print(&read(n, started));
            next_report += every;
        }
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    let last = read(cycles, started);
    if !last.cycles.is_multiple_of(every) {
        print(&last);
    }
    println!();
    println!(
        "{failures} cycles failed; {:.0} cycles/s. Change start → end: kernel cgroups {} → {}, SUnreclaim {:+} MiB, MemAvailable {:+} MiB, daemon RSS {:+} MiB, fds {:+}.",
        cycles as f64 / last.secs.max(0.001),
        first.kernel_cgroups,
        last.kernel_cgroups,
        (last.sunreclaim_kib as i64 - first.sunreclaim_kib as i64) / 1024,
        (last.available_kib as i64 - first.available_kib as i64) / 1024,
        (last.rss_kib as i64 - first.rss_kib as i64) / 1024,
        last.fds as i64 - first.fds as i64
    );
    let _ = node.kill_all().await;
    node.shutdown().await;
    node.unmount_disk_pool_if_unused();
    drop(node);
    tokio::time::sleep(Duration::from_millis(500)).await;
    host::remove_cgroup_parent(CGROUP_PARENT, true);
    Ok(())
}
