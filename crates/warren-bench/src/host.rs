//! The machine: what it is, its memory, processes, and the bench's own cgroups.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

pub const SIGTERM: i32 = 15;
pub const SIGKILL: i32 = 9;

/// `MemAvailable` from /proc/meminfo, bytes.
pub fn mem_available() -> Option<u64> {
    meminfo_field("MemAvailable:")
}

pub fn meminfo_field(name: &str) -> Option<u64> {
    let s = std::fs::read_to_string("/proc/meminfo").ok()?;
    s.lines()
        .find(|l| l.starts_with(name))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|kb| kb.parse::<u64>().ok())
        .map(|kb| kb * 1024)
}

/// VmRSS of a process, bytes.
pub fn vm_rss(pid: i32) -> Option<u64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    s.lines()
        .find(|l| l.starts_with("VmRSS:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|kb| kb.parse::<u64>().ok())
        .map(|kb| kb * 1024)
}

pub fn comm(pid: i32) -> Option<String> {
    std::fs::read_to_string(format!("/proc/{pid}/comm"))
        .ok()
        .map(|s| s.trim().to_string())
}

/// Parent of every process on the host (pid → ppid).
pub fn parents() -> HashMap<i32, i32> {
    let mut m = HashMap::new();
    let Ok(rd) = std::fs::read_dir("/proc") else {
        return m;
    };
    for e in rd.flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<i32>().ok()) else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue;
        };
        // "pid (comm) state ppid ...": comm may hold spaces and parentheses.
        if let Some(rest) = stat.rsplit_once(')').map(|(_, r)| r)
            && let Some(ppid) = rest.split_whitespace().nth(1).and_then(|s| s.parse().ok())
        {
            m.insert(pid, ppid);
        }
    }
    m
}

/// Every descendant of `root` (not `root` itself), given a pid → ppid map.
pub fn descendants(map: &HashMap<i32, i32>, root: i32) -> Vec<i32> {
    let mut out = Vec::new();
    let mut frontier = vec![root];
    while let Some(p) = frontier.pop() {
        for (&c, &pp) in map {
            if pp == p {
                out.push(c);
                frontier.push(c);
            }
        }
    }
    out
}

/// One line about the machine: cores, kernel, memory, cgroup layout, load.
pub struct Machine {
    pub nproc: usize,
    pub kernel: String,
    pub os: String,
    pub mem_total: u64,
    pub cgroups: String,
    pub loadavg: String,
    pub bwrap: String,
    pub runc: String,
    /// Share of all cores busy during one second before the run (other work on the host).
    pub busy_before: Option<f64>,
}

impl Machine {
    /// The 1-, 5- and 15-minute load averages.
    pub fn loadavg() -> String {
        std::fs::read_to_string("/proc/loadavg")
            .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
            .unwrap_or_default()
    }

    pub fn read() -> Machine {
        let first_line = |prog: &str| {
            std::process::Command::new(prog)
                .arg("--version")
                .output()
                .ok()
                .and_then(|o| {
                    String::from_utf8_lossy(&o.stdout)
                        .lines()
                        .next()
                        .map(str::to_string)
                })
                .unwrap_or_else(|| "not installed".into())
        };
        let os = std::fs::read_to_string("/etc/os-release")
            .ok()
            .and_then(|s| {
                s.lines()
                    .find_map(|l| l.strip_prefix("PRETTY_NAME="))
                    .map(|v| v.trim_matches('"').to_string())
            })
            .unwrap_or_else(|| "unknown".into());
        let cgroups = match warren_node::container::cgroups::Layout::detect() {
            Ok(l) => {
                let detail = match &l {
                    warren_node::container::cgroups::Layout::V2 { root } => {
                        format!("cgroup2 at {}", root.display())
                    }
                    warren_node::container::cgroups::Layout::V1 { hybrid, .. } => format!(
                        "v1 cpu/memory/pids/freezer{}",
                        if *hybrid { " + a cgroup2 mount" } else { "" }
                    ),
                };
                format!("{} ({detail})", l.name())
            }
            Err(e) => format!("unknown ({e})"),
        };
        let nproc = std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1);
        let b0 = crate::stats::cpu_busy();
        std::thread::sleep(Duration::from_secs(1));
        let busy_before = match (b0, crate::stats::cpu_busy()) {
            (Some(a), Some(b)) => Some(b.saturating_sub(a).as_secs_f64() / nproc as f64),
            _ => None,
        };
        Machine {
            nproc,
            busy_before,
            kernel: std::fs::read_to_string("/proc/sys/kernel/osrelease")
                .map(|s| s.trim().to_string())
                .unwrap_or_else(|_| "unknown".into()),
            os,
            mem_total: meminfo_field("MemTotal:").unwrap_or(0),
            cgroups,
            loadavg: Machine::loadavg(),
            bwrap: first_line("bwrap"),
            runc: first_line("runc"),
        }
    }
}

/// Mount points of every cgroup hierarchy (v1 and v2).
pub fn cgroup_mounts() -> Vec<PathBuf> {
    let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let mut v = Vec::new();
    for line in info.lines() {
        let Some((left, right)) = line.split_once(" - ") else {
            continue;
        };
        let fstype = right.split(' ').next().unwrap_or_default();
        if fstype == "cgroup" || fstype == "cgroup2" {
            let mp = PathBuf::from(left.split(' ').nth(4).unwrap_or_default());
            if !v.contains(&mp) {
                v.push(mp);
            }
        }
    }
    v
}

/// Where per-sandbox memory usage and process lists live for cgroup parent `parent`:
/// (directory holding the sandboxes' memory cgroups, its usage file name, directory holding
/// their process lists).
pub fn sandbox_cgroup_dirs(parent: &str) -> Option<(PathBuf, &'static str, PathBuf)> {
    match warren_node::container::cgroups::Layout::detect().ok()? {
        warren_node::container::cgroups::Layout::V2 { root } => {
            Some((root.join(parent), "memory.current", root.join(parent)))
        }
        warren_node::container::cgroups::Layout::V1 { memory, pids, .. } => Some((
            memory.join(parent),
            "memory.usage_in_bytes",
            pids.join(parent),
        )),
    }
}

fn subdirs(p: &Path) -> Vec<PathBuf> {
    std::fs::read_dir(p)
        .map(|rd| {
            rd.flatten()
                .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
                .map(|e| e.path())
                .collect()
        })
        .unwrap_or_default()
}

fn procs(d: &Path) -> Vec<i32> {
    std::fs::read_to_string(d.join("cgroup.procs"))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.trim().parse().ok())
        .collect()
}

/// Prefix of the cgroups of a Warren node's warm pool (inits started ahead of requests).
pub const WARM_PREFIX: &str = "warm-";

/// Sandbox cgroups and warm-pool cgroups directly below cgroup parent `parent`.
pub fn count_sandbox_cgroups(parent: &str) -> (usize, usize) {
    let names = sandbox_cgroup_dirs(parent)
        .map(|(_, _, pids)| child_names(&pids))
        .unwrap_or_default();
    let warm = names.iter().filter(|n| n.starts_with(WARM_PREFIX)).count();
    (names.len() - warm, warm)
}

/// Waits (at most `max`) until the number of warm-pool cgroups under `parent` has been steady
/// for half a second, so that a phase starts with the pool as full as it gets. Returns it.
pub async fn settle_warm_pool(parent: &str, max: Duration) -> usize {
    let deadline = Instant::now() + max;
    let mut last = count_sandbox_cgroups(parent).1;
    let mut since = Instant::now();
    while Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let now = count_sandbox_cgroups(parent).1;
        if now != last {
            last = now;
            since = Instant::now();
        } else if since.elapsed() >= Duration::from_millis(500) {
            break;
        }
    }
    last
}

/// Names of the cgroups directly below `dir`.
pub fn child_names(dir: &Path) -> Vec<String> {
    subdirs(dir)
        .iter()
        .filter_map(|d| d.file_name().map(|n| n.to_string_lossy().into_owned()))
        .collect()
}

/// Mean of a per-cgroup file over the cgroups directly below `dir` whose names `keep`
/// accepts, and how many there were.
pub fn mean_of_children(
    dir: &Path,
    file: &str,
    keep: impl Fn(&str) -> bool,
) -> Option<(u64, usize)> {
    let vals: Vec<u64> = subdirs(dir)
        .iter()
        .filter(|d| d.file_name().is_some_and(|n| keep(&n.to_string_lossy())))
        .filter_map(|d| std::fs::read_to_string(d.join(file)).ok())
        .filter_map(|s| s.trim().parse().ok())
        .collect();
    if vals.is_empty() {
        None
    } else {
        Some((vals.iter().sum::<u64>() / vals.len() as u64, vals.len()))
    }
}

/// Pids listed in the `cgroup.procs` of the cgroups directly below `dir` whose names `keep`
/// accepts.
pub fn procs_of_children(dir: &Path, keep: impl Fn(&str) -> bool) -> Vec<i32> {
    subdirs(dir)
        .iter()
        .filter(|d| d.file_name().is_some_and(|n| keep(&n.to_string_lossy())))
        .flat_map(|d| procs(d))
        .collect()
}

/// Before a run: makes sure no earlier run left live processes under our cgroup parent (we
/// would not know whose they are, so we refuse to touch them) and removes empty leftovers.
pub fn preflight_cgroup_parent(parent: &str) -> anyhow::Result<()> {
    for mnt in cgroup_mounts() {
        let p = mnt.join(parent);
        for d in subdirs(&p) {
            if !procs(&d).is_empty() {
                anyhow::bail!(
                    "cgroup {} holds processes from an earlier run; stop them (or remove that cgroup) first",
                    d.display()
                );
            }
            let _ = std::fs::remove_dir(&d);
        }
    }
    Ok(())
}

/// After a run: removes the cgroups below `parent` and `parent` itself in every hierarchy.
/// Only with `kill_leftovers` (this run started them and could not stop them otherwise) are
/// processes still in them killed, by pid. Returns what could not be removed.
pub fn remove_cgroup_parent(parent: &str, kill_leftovers: bool) -> Vec<String> {
    let mut problems = Vec::new();
    for mnt in cgroup_mounts() {
        let p = mnt.join(parent);
        if !p.is_dir() {
            continue;
        }
        for d in subdirs(&p) {
            for dd in subdirs(&d) {
                if let Err(e) = rmdir_retry(&dd, kill_leftovers) {
                    problems.push(e);
                }
            }
            if let Err(e) = rmdir_retry(&d, kill_leftovers) {
                problems.push(e);
            }
        }
        if let Err(e) = rmdir_retry(&p, false) {
            problems.push(e);
        }
    }
    problems
}

fn rmdir_retry(d: &Path, kill: bool) -> Result<(), String> {
    let deadline = Instant::now() + Duration::from_secs(3);
    loop {
        match std::fs::remove_dir(d) {
            Ok(()) => return Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
            Err(e) if e.raw_os_error() == Some(16) && Instant::now() < deadline => {
                if kill {
                    for pid in procs(d) {
                        let _ = warren_sys::process::kill(pid, SIGKILL);
                    }
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            Err(e) => return Err(format!("{}: {e}", d.display())),
        }
    }
}
