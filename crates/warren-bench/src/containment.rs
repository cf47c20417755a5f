//! `warren-bench containment`: what containment costs, each defence against the same node
//! without it, in one run (node library, in this process):
//!
//! - create → ready, with the warm pool and without, with and without the disk quota and the
//!   system-call filter;
//! - the exec round trip of `true`, with and without the filter (the guest's spawner installs
//!   it once on itself and every command inherits it, so an exec should cost the same either
//!   way), against the same sandbox once its spawner is killed, when the guest confines each
//!   command in its own child (the design before the spawner);
//! - the idle sandbox's processes' memory (guest and spawner);
//! - the disk-quota mechanisms considered, measured here: a btrfs subvolume with a quota
//!   group limit (what Warren does) against a size-limited ext4 file system per sandbox
//!   (mkfs, loop device, mount), the other real choice on a kernel without ext4/XFS project
//!   quotas.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use warren_node::{Node, NodeConfig};
use warren_types::ByteSize;
use warren_types::api::{CreateSandbox, ExecRequest};

use crate::host;
use crate::stats::Samples;

const CGROUP_PARENT: &str = "warren-bench-contain";

struct Variant {
    name: &'static str,
    warm: bool,
    quota: bool,
    seccomp: bool,
}

fn config(state: &Path, guest: &Path, v: &Variant) -> anyhow::Result<NodeConfig> {
    Ok(serde_json::from_value(serde_json::json!({
        "state_dir": state,
        "cgroup_parent": CGROUP_PARENT,
        "guest_binary": guest,
        "warm_pool": if v.warm { 16 } else { 0 },
        "disk_quota": if v.quota { "auto" } else { "off" },
        "seccomp": v.seccomp,
    }))?)
}

fn req() -> CreateSandbox {
    CreateSandbox {
        image: "host".into(),
        memory: Some(ByteSize(64 << 20)),
        ..Default::default()
    }
}

fn true_cmd() -> anyhow::Result<warren_node::exec::Prepared> {
    Ok(warren_node::exec::prepare(
        &ExecRequest {
            argv: Some(vec!["true".into()]),
            ..Default::default()
        },
        None,
    )?)
}

/// Create → ready times (one at a time, the pool refilled between creates when warm) and exec
/// round trips on one sandbox.
/// The resident and private memory (KiB) of each process of a sandbox, by command name, read
/// from `/proc/<pid>/smaps_rollup` of every process in its cgroup.
fn footprint(id: &str) -> Vec<(String, u64, u64)> {
    let mut out = Vec::new();
    for e in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else {
            continue;
        };
        let cg = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap_or_default();
        if !cg.contains(CGROUP_PARENT) || !cg.contains(id) {
            continue;
        }
        let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
        let rollup =
            std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup")).unwrap_or_default();
        let field = |name: &str| -> u64 {
            rollup
                .lines()
                .filter_map(|l| l.strip_prefix(name))
                .filter_map(|v| v.split_whitespace().next()?.parse::<u64>().ok())
                .sum()
        };
        let private = field("Private_Clean:") + field("Private_Dirty:");
        out.push((comm.trim().to_string(), field("Rss:"), private));
    }
    out.sort();
    out
}

/// Kills the sandbox's spawner (a process this benchmark started, found by name in the
/// sandbox's cgroup).
fn kill_spawner(id: &str) -> anyhow::Result<()> {
    for e in std::fs::read_dir("/proc")?.flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|n| n.parse::<i32>().ok()) else {
            continue;
        };
        let cg = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap_or_default();
        let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
        if cg.contains(CGROUP_PARENT) && cg.contains(id) && comm.trim() == "warren-spawner" {
            warren_sys::process::kill(pid, 9)?;
            return Ok(());
        }
    }
    anyhow::bail!("the spawner of {id} was not found")
}

/// What [`measure`] found.
struct Measured {
    creates: Vec<Duration>,
    execs: Vec<Duration>,
    /// Exec round trips once the spawner is gone (empty without the filter).
    direct: Vec<Duration>,
    /// The idle sandbox's processes: (name, resident KiB, private KiB).
    memory: Vec<(String, u64, u64)>,
}

async fn measure(exe_dir: &Path, v: &Variant, n: usize) -> anyhow::Result<Measured> {
    host::preflight_cgroup_parent(CGROUP_PARENT)?;
    let work = tempfile::Builder::new()
        .prefix("warren-contain.")
        .tempdir()?;
    let cfg = config(&work.path().join("node"), &exe_dir.join("warren-guest"), v)?;
    let (node, _) = Node::start(cfg).await?;
    let mut creates = Vec::with_capacity(n);
    for _ in 0..n {
        if v.warm {
            host::settle_warm_pool(CGROUP_PARENT, Duration::from_secs(10)).await;
        }
        let t = Instant::now();
        let (view, _) = node.create(req(), None).await?;
        creates.push(t.elapsed());
        node.kill(&view.id).await?;
    }
    let (view, _) = node.create(req(), None).await?;
    // Idle, after one command (the spawner has started something).
    let p = true_cmd()?;
    node.exec(&view.id, p).await?;
    tokio::time::sleep(Duration::from_millis(200)).await;
    let memory = footprint(view.id.as_str());
    let mut execs = Vec::with_capacity(n * 4);
    for _ in 0..n * 4 {
        let p = true_cmd()?;
        let t = Instant::now();
        let r = node.exec(&view.id, p).await?;
        execs.push(t.elapsed());
        anyhow::ensure!(r.status.exit_code == 0, "`true` failed: {}", r.stderr);
    }
    // The peer: the same sandbox with its spawner gone, so that the guest confines each
    // command in its own child (how every exec ran before the spawner).
    let mut direct = Vec::new();
    if v.seccomp {
        kill_spawner(view.id.as_str())?;
        tokio::time::sleep(Duration::from_millis(200)).await;
        for _ in 0..n * 4 {
            let p = true_cmd()?;
            let t = Instant::now();
            let r = node.exec(&view.id, p).await?;
            direct.push(t.elapsed());
            anyhow::ensure!(r.status.exit_code == 0, "`true` failed: {}", r.stderr);
        }
    }
    node.kill(&view.id).await?;
    shut(node).await;
    Ok(Measured {
        creates,
        execs,
        direct,
        memory,
    })
}

async fn shut(node: Arc<Node>) {
    let _ = node.kill_all().await;
    node.shutdown().await;
    node.unmount_disk_pool_if_unused();
    drop(node);
    tokio::time::sleep(Duration::from_millis(300)).await;
    host::remove_cgroup_parent(CGROUP_PARENT, true);
}

fn samples(v: &[Duration]) -> Samples {
    let mut s = Samples::default();
    for d in v {
        s.push(*d);
    }
    s
}

/// A mechanism's name, make times and remove times.
type MechanismTimes = (String, Vec<Duration>, Vec<Duration>);

/// The disk-quota mechanisms, each `n` times: create, limit, delete.
fn disk_mechanisms(n: usize) -> anyhow::Result<Vec<MechanismTimes>> {
    use std::os::fd::AsFd;
    let work = tempfile::Builder::new().prefix("warren-disk.").tempdir()?;
    let mut out = Vec::new();
    // A btrfs pool, as the node makes it; then subvolume + limit, and delete.
    let img = work.path().join("pool.img");
    std::fs::File::create(&img)?.set_len(8 << 30)?;
    let mk = std::process::Command::new("mkfs.btrfs")
        .args(["-q", "-f", "-m", "single", "-d", "single"])
        .arg(&img)
        .output()?;
    anyhow::ensure!(mk.status.success(), "mkfs.btrfs failed");
    let root = work.path().join("pool");
    std::fs::create_dir(&root)?;
    let (dev, hold) = warren_sys::blockdev::attach_loop_rw(&img)?;
    warren_sys::blockdev::mount_btrfs(&dev.path, &root)?;
    drop(hold);
    let dir = std::fs::File::open(&root)?;
    warren_sys::btrfs::enable_quota(dir.as_fd())?;
    let (mut make, mut del) = (Vec::new(), Vec::new());
    for i in 0..n {
        let name = std::ffi::CString::new(format!("v{i}"))?;
        let t = Instant::now();
        warren_sys::btrfs::create_subvolume(dir.as_fd(), &name)?;
        let v = std::fs::File::open(root.join(format!("v{i}")))?;
        warren_sys::btrfs::set_limit(v.as_fd(), 256 << 20)?;
        make.push(t.elapsed());
        drop(v);
        let t = Instant::now();
        warren_sys::btrfs::delete_subvolume(dir.as_fd(), &name)?;
        del.push(t.elapsed());
    }
    out.push((
        "btrfs subvolume + quota-group limit (Warren)".to_string(),
        make,
        del,
    ));
    drop(dir);
    warren_sys::mount::unmount_detach(&root)?;
    // A size-limited ext4 per sandbox: sparse file, mkfs (no journal), loop device, mount.
    let (mut make, mut del) = (Vec::new(), Vec::new());
    let mnt = work.path().join("mnt");
    std::fs::create_dir(&mnt)?;
    for i in 0..n {
        let f = work.path().join(format!("s{i}.img"));
        let t = Instant::now();
        std::fs::File::create(&f)?.set_len(256 << 20)?;
        let mk = std::process::Command::new("mkfs.ext4")
            .args([
                "-q",
                "-F",
                "-O",
                "^has_journal",
                "-E",
                "lazy_itable_init=1,nodiscard",
            ])
            .arg(&f)
            .output()?;
        anyhow::ensure!(mk.status.success(), "mkfs.ext4 failed");
        let (dev, hold) = warren_sys::blockdev::attach_loop_rw(&f)?;
        rustix_mount_ext4(&dev.path, &mnt)?;
        drop(hold);
        make.push(t.elapsed());
        let t = Instant::now();
        warren_sys::mount::unmount_detach(&mnt)?;
        std::fs::remove_file(&f)?;
        del.push(t.elapsed());
    }
    out.push((
        "ext4 file system per sandbox (mkfs, loop, mount)".to_string(),
        make,
        del,
    ));
    Ok(out)
}

fn rustix_mount_ext4(dev: &Path, target: &Path) -> anyhow::Result<()> {
    let st = std::process::Command::new("mount")
        .arg("-t")
        .arg("ext4")
        .arg(dev)
        .arg(target)
        .status()?;
    anyhow::ensure!(st.success(), "mount ext4 failed");
    Ok(())
}

/// Runs everything and prints the tables.
pub async fn run(exe_dir: &Path, n: usize) -> anyhow::Result<()> {
    let variants = [
        Variant {
            name: "warm pool, all defences (default)",
            warm: true,
            quota: true,
            seccomp: true,
        },
        Variant {
            name: "warm pool, no disk quota",
            warm: true,
            quota: false,
            seccomp: true,
        },
        Variant {
            name: "warm pool, no system-call filter",
            warm: true,
            quota: true,
            seccomp: false,
        },
        Variant {
            name: "no warm pool, all defences",
            warm: false,
            quota: true,
            seccomp: true,
        },
        Variant {
            name: "no warm pool, no disk quota",
            warm: false,
            quota: false,
            seccomp: true,
        },
        Variant {
            name: "no warm pool, no system-call filter",
            warm: false,
            quota: true,
            seccomp: false,
        },
    ];
    let mut rows = Vec::new();
    for v in &variants {
        eprintln!("warren-bench containment: {}", v.name);
        rows.push((v.name, measure(exe_dir, v, n).await?));
    }
    println!(
        "Containment costs, node library in-process, {n} creates and {} exec round trips of `true` per row (p50 / p99).",
        n * 4
    );
    println!();
    println!(
        "| variant | create → ready | exec round trip | exec, each command confined in its child (spawner killed) |"
    );
    println!("|---|---:|---:|---:|");
    for (name, m) in &rows {
        let direct = if m.direct.is_empty() {
            "—".to_string()
        } else {
            samples(&m.direct).p50_p99()
        };
        println!(
            "| {name} | {} | {} | {direct} |",
            samples(&m.creates).p50_p99(),
            samples(&m.execs).p50_p99()
        );
    }
    println!();
    if let Some((_, m)) = rows.first() {
        println!("An idle sandbox's processes (default variant), from smaps_rollup:");
        println!();
        println!("| process | resident | private |");
        println!("|---|---:|---:|");
        for (comm, rss, private) in &m.memory {
            println!("| {comm} | {rss} KiB | {private} KiB |");
        }
        println!();
    }
    eprintln!("warren-bench containment: disk-quota mechanisms");
    let disk = disk_mechanisms(n)?;
    println!(
        "Disk-quota mechanisms on this machine ({n} each; ext4 and XFS project quotas are not available here: the kernel has no QFMT_V2 and no XFS_QUOTA)."
    );
    println!();
    println!("| mechanism | make (p50 / p99) | remove (p50 / p99) |");
    println!("|---|---:|---:|");
    for (name, make, del) in disk {
        println!(
            "| {name} | {} | {} |",
            samples(&make).p50_p99(),
            samples(&del).p50_p99()
        );
    }
    Ok(())
}
