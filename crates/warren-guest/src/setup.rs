//! Turning a freshly cloned process into a sandbox's PID 1: root file system, /proc, /dev,
//! host name, loopback, and the capability lock-down.
//!
//! Runs before the guest serves anything, in the new mount, pid, uts, ipc and network
//! namespaces the node cloned it into.

use std::fs;
use std::io;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, symlink};
use std::path::Path;

use warren_sys::mount::{self, flags};
use warren_types::guest::InitConfig;

/// Files hidden behind an empty file of mode 0 (see [`mask`]): kernel internals a sandbox has
/// no business reading (the list the usual OCI runtimes mask). Every other file at the top of /proc and of
/// /sys/kernel that only root may read is masked too ([`root_only_files`]): uid 0 in a
/// sandbox has no capabilities, but it owns those files, so their mode bits alone would let
/// it read /proc/kpageflags, /proc/kpagecgroup (the paper's side channel), /proc/slabinfo.
const MASKED_FILES: &[&str] = &[
    "proc/kcore",
    "proc/keys",
    "proc/latency_stats",
    "proc/timer_list",
    "proc/timer_stats",
    "proc/sched_debug",
    // The physical address of the kernel's crash-dump notes: a KASLR leak.
    "sys/kernel/vmcoreinfo",
];

/// Directories hidden behind an empty read-only tmpfs: firmware and DMI tables (serial
/// numbers), page-level memory state (page_idle, DAMON), per-slab statistics, debug,
/// tracing and security file systems, module parameters, and control files whose read has
/// an effect. `containment::root_only_host_information_is_hidden` lists every root-only
/// file of /sys that root in a sandbox can still read, so a kernel with new ones fails it.
const MASKED_DIRS: &[&str] = &[
    "proc/acpi",
    "proc/asound",
    "proc/scsi",
    "sys/firmware",
    "sys/devices/virtual/powercap",
    "sys/devices/virtual/dmi",
    "sys/kernel/slab",
    "sys/kernel/mm/page_idle",
    "sys/kernel/mm/damon",
    "sys/kernel/debug",
    "sys/kernel/tracing",
    "sys/kernel/security",
    "sys/module",
    "sys/fs/pstore",
    "sys/fs/bpf",
    // Reading `hot_add` makes a new zram device on the host.
    "sys/class/zram-control",
];

/// Directories whose root-only files are masked (see [`MASKED_FILES`]).
const SCAN_FOR_ROOT_ONLY: &[&str] = &["proc", "sys/kernel"];

/// Paths made read-only. Every other entry at the top of /proc (but the processes' own
/// directories) that holds a file with a write bit is made read-only too
/// ([`writable_entries`]): uid 0 in a sandbox owns those files, and some need no capability
/// to act on the whole host (`/proc/dynamic_debug/control` floods the kernel's log,
/// `/proc/pressure/*` triggers cost the kernel work for every task).
const READONLY: &[&str] = &[
    "proc/bus",
    "proc/fs",
    "proc/irq",
    "proc/sys",
    "proc/sysrq-trigger",
];

/// Character devices in the sandbox's /dev: (name, major, minor).
const DEVICES: &[(&str, u32, u32)] = &[
    ("null", 1, 3),
    ("zero", 1, 5),
    ("full", 1, 7),
    ("random", 1, 8),
    ("urandom", 1, 9),
    ("tty", 5, 0),
];

fn ctx(e: io::Error, what: &str) -> io::Error {
    io::Error::new(e.kind(), format!("{what}: {e}"))
}

/// Builds the sandbox's root and moves into it.
pub fn rootfs(cfg: &InitConfig) -> io::Result<()> {
    mount::unshare_cgroup_namespace().map_err(|e| ctx(e, "new cgroup namespace"))?;
    std::env::set_current_dir(&cfg.sandbox_dir)
        .map_err(|e| ctx(e, "entering the sandbox directory"))?;
    mount::make_all_private()?;

    let fs = &cfg.rootfs;
    std::fs::create_dir_all("rootfs")?;
    let lowers: Vec<&str> = fs.lowers.iter().map(String::as_str).collect();
    mount::mount_overlay(Path::new("rootfs"), &lowers, &fs.upper, &fs.work)?;
    std::env::set_current_dir("rootfs")?;

    for b in &fs.binds {
        let target = Path::new(b.target.trim_start_matches('/'));
        let f = if b.readonly {
            flags::RDONLY | flags::NOSUID | flags::NODEV
        } else {
            0
        };
        mount::bind(Path::new(&b.source), target, true, f)?;
    }

    mount::mount_fs(
        "proc",
        Path::new("proc"),
        flags::NOSUID | flags::NODEV | flags::NOEXEC,
        None,
    )?;
    mount::mount_fs(
        "sysfs",
        Path::new("sys"),
        flags::RDONLY | flags::NOSUID | flags::NODEV | flags::NOEXEC,
        None,
    )?;
    dev()?;
    pristine(cfg)?;
    mask()?;

    // The node's resolver file, opened while the host's paths are still reachable.
    let resolv = match &cfg.resolv_conf {
        Some(p) => {
            Some(mount::clone_tree(Path::new(p)).map_err(|e| ctx(e, "the node's resolv.conf"))?)
        }
        None => None,
    };
    mount::pivot_root_here()?;
    if let Some(f) = resolv {
        bind_resolv_conf(f);
    }
    // Still root with every capability: the last change to the sandbox's own files.
    crate::default_user::provide(Path::new("/"));
    mount::set_hostname(&cfg.hostname).map_err(|e| ctx(e, "sethostname"))?;
    warren_sys::net::loopback_up().map_err(|e| ctx(e, "bringing up lo"))?;
    Ok(())
}

/// Binds the node's resolver file read-only over `/etc/resolv.conf`, which is resolved inside
/// the sandbox's root (a link there points into the sandbox, never the host). An image without
/// a regular file there keeps what it has (and its names do not resolve).
fn bind_resolv_conf(source: std::os::fd::OwnedFd) {
    // Where a link there leads, inside the sandbox; never onto the platform's own files.
    let target = match std::fs::canonicalize("/etc/resolv.conf") {
        Ok(t) if !["/proc", "/sys", "/dev"].iter().any(|d| t.starts_with(d)) => t,
        _ => {
            eprintln!(
                "warren-guest: /etc/resolv.conf leads nowhere or into /proc, /sys or /dev: left as the image has it"
            );
            return;
        }
    };
    let target = target.as_path();
    match std::fs::metadata(target) {
        Ok(m) if m.is_file() => {}
        _ => {
            eprintln!(
                "warren-guest: /etc/resolv.conf is no regular file: left as the image has it"
            );
            return;
        }
    }
    if let Err(e) = mount::attach_tree(
        source,
        target,
        flags::RDONLY | flags::NOSUID | flags::NODEV | flags::NOEXEC,
    ) {
        eprintln!("warren-guest: binding the node's resolv.conf: {e}");
    }
}

/// A minimal /dev: a few character devices, a private devpts, /dev/shm.
fn dev() -> io::Result<()> {
    let dev = Path::new("dev");
    mount::mount_fs(
        "tmpfs",
        dev,
        flags::NOSUID | flags::NOEXEC,
        Some("mode=755,size=65536"),
    )?;
    for (name, major, minor) in DEVICES {
        mount::mknod_char(&dev.join(name), 0o666, *major, *minor)?;
    }
    // mknod applies the umask; make the modes exact.
    for (name, _, _) in DEVICES {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(dev.join(name), std::fs::Permissions::from_mode(0o666))?;
    }
    for (link, target) in [
        ("fd", "/proc/self/fd"),
        ("stdin", "/proc/self/fd/0"),
        ("stdout", "/proc/self/fd/1"),
        ("stderr", "/proc/self/fd/2"),
        ("ptmx", "pts/ptmx"),
        ("core", "/proc/kcore"),
    ] {
        symlink(target, dev.join(link))?;
    }
    let mut db = std::fs::DirBuilder::new();
    db.mode(0o755);
    db.create(dev.join("pts"))?;
    db.mode(0o1777);
    db.create(dev.join("shm"))?;
    mount::mount_fs(
        "devpts",
        &dev.join("pts"),
        flags::NOSUID | flags::NOEXEC,
        // At most 256 terminals per sandbox: the kernel's limit (kernel.pty.max) is shared by
        // every devpts instance of the host.
        Some("newinstance,ptmxmode=0666,mode=0620,gid=5,max=256"),
    )?;
    mount::mount_fs(
        "tmpfs",
        &dev.join("shm"),
        flags::NOSUID | flags::NODEV,
        Some("mode=1777,size=67108864"),
    )?;
    Ok(())
}

/// The entries of `dir` (/proc) that hold a file with a write bit, at the top or below it:
/// every entry but the processes' own directories (`[0-9]+`, `self`, `thread-self`: a
/// sandbox's processes write their own `oom_score_adj`, `comm`, ...), links (`net`, `mounts`
/// lead into `self`), and the names in `skip` (made read-only or hidden already). A directory
/// too large to walk in [`SCAN_BUDGET`] entries, or that cannot be listed, counts as writable.
fn writable_entries(dir: &Path, skip: &[&str]) -> Vec<std::path::PathBuf> {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut budget = SCAN_BUDGET;
    let mut found = Vec::new();
    for e in rd.flatten() {
        let name = e.file_name();
        let name = name.to_string_lossy();
        if name.bytes().all(|b| b.is_ascii_digit())
            || name == "self"
            || name == "thread-self"
            || skip.contains(&name.as_ref())
        {
            continue;
        }
        let Ok(m) = e.path().symlink_metadata() else {
            continue;
        };
        let writable = if m.is_dir() {
            holds_writable(&e.path(), 0, &mut budget)
        } else {
            m.is_file() && mode_writable(&m)
        };
        if writable {
            found.push(e.path());
        }
    }
    found.sort();
    found
}

/// Most entries [`writable_entries`] looks at below one /proc.
const SCAN_BUDGET: usize = 20_000;
/// Deepest directory it walks into.
const SCAN_DEPTH: usize = 8;

fn mode_writable(m: &std::fs::Metadata) -> bool {
    use std::os::unix::fs::PermissionsExt;
    m.permissions().mode() & 0o222 != 0
}

/// Whether `dir` holds a regular file with a write bit (links not followed); `true` when
/// the walk is too deep or too long to tell, or the directory cannot be listed.
fn holds_writable(dir: &Path, depth: usize, budget: &mut usize) -> bool {
    if depth >= SCAN_DEPTH {
        return true;
    }
    let Ok(rd) = std::fs::read_dir(dir) else {
        return true;
    };
    for e in rd.flatten() {
        if *budget == 0 {
            return true;
        }
        *budget -= 1;
        let Ok(m) = e.path().symlink_metadata() else {
            continue;
        };
        if (m.is_file() && mode_writable(&m))
            || (m.is_dir() && holds_writable(&e.path(), depth + 1, budget))
        {
            return true;
        }
    }
    false
}

/// Regular files directly in `dir` that only their owner may read (no read bit for others):
/// on /proc and /sys those are root's.
fn root_only_files(dir: &Path) -> Vec<std::path::PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    let Ok(rd) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    rd.flatten()
        .filter(|e| {
            e.metadata().is_ok_and(|m| {
                m.is_file()
                    && m.permissions().mode() & 0o444 != 0
                    && m.permissions().mode() & 0o004 == 0
            })
        })
        .map(|e| e.path())
        .collect()
}

/// Where the grader's pristine sources are, inside the sandbox: a directory that only the
/// grader's uid owns (mode 0700), so agent processes, root included, cannot enter it.
pub const PRISTINE: &str = "/dev/.warren";

/// Binds the image's read-only layers and host paths again under [`PRISTINE`], before the
/// agent's writable layer exists for anything: the grader builds its view of the system from
/// these (see [`crate::grader`]), never from what the agent changed.
fn pristine(cfg: &InitConfig) -> io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    let base = Path::new(PRISTINE.trim_start_matches('/'));
    std::fs::DirBuilder::new().mode(0o700).create(base)?;
    let uid = cfg.grader.uid;
    std::os::unix::fs::chown(base, Some(uid), Some(uid))?;
    std::fs::set_permissions(base, std::fs::Permissions::from_mode(0o700))?;
    let ro = flags::RDONLY | flags::NOSUID | flags::NODEV;
    let empty = base.join("e");
    std::fs::DirBuilder::new().mode(0o555).create(&empty)?;
    for (i, lower) in cfg.rootfs.lowers.iter().enumerate() {
        let target = base.join(format!("l{i}"));
        std::fs::DirBuilder::new().mode(0o755).create(&target)?;
        // The sandbox directory's link to the layer (`../<lower>`: cwd is `rootfs`).
        let source = Path::new("..").join(lower);
        if mount::is_mount_root(&source) {
            // A layer mount (EROFS): bound as it is; mountinfo shows its root as `/`.
            mount::bind(&source, &target, false, ro)?;
        } else {
            // A directory (the host image's skeleton): a bind would show its host path in
            // mountinfo; a read-only overlay of it (over an empty directory, as one needs two
            // layers) shows only the relative option.
            let (src, e) = (source.display().to_string(), empty.display().to_string());
            mount::mount_overlay_readonly(&target, &[&src, &e])?;
        }
    }
    for (i, b) in cfg.rootfs.binds.iter().enumerate() {
        let target = base.join(format!("b{i}"));
        if Path::new(&b.source).is_dir() {
            std::fs::DirBuilder::new().mode(0o755).create(&target)?;
        } else {
            std::fs::write(&target, b"")?;
        }
        mount::bind(Path::new(&b.source), &target, true, ro)?;
    }
    // Where each grader command's own writable layer is mounted (in its private namespace).
    std::fs::DirBuilder::new()
        .mode(0o755)
        .create(base.join("g"))?;
    Ok(())
}

fn mask() -> io::Result<()> {
    let mut files: Vec<std::path::PathBuf> =
        MASKED_FILES.iter().map(std::path::PathBuf::from).collect();
    for d in SCAN_FOR_ROOT_ONLY {
        files.extend(root_only_files(Path::new(d)));
    }
    files.sort();
    files.dedup();
    // The guest's own OOM score: its /proc files belong to uid 0 (it is not dumpable), and
    // raising a score needs no capability, so root in the sandbox could otherwise make the
    // OOM killer take the guest first. (This process is PID 1 of the sandbox's namespace.)
    if std::process::id() == 1 {
        files.extend(["proc/1/oom_score_adj", "proc/1/oom_adj"].map(std::path::PathBuf::from));
    }
    // Each masked file becomes one empty file of mode 0 on a read-only bind: opening it fails
    // with "Permission denied" for root in the sandbox too (uid 0 without capabilities is held
    // to the mode bits), and nobody can chmod it (the only paths to it are read-only; the
    // tmpfs it was made on is detached).
    let staging = Path::new("dev/.mask");
    fs::create_dir(staging)?;
    mount::mount_fs(
        "tmpfs",
        staging,
        flags::NOSUID | flags::NODEV | flags::NOEXEC,
        Some("size=4k,mode=0700"),
    )?;
    let masked = staging.join("masked");
    fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o000)
        .open(&masked)?;
    for p in &files {
        if p.exists() {
            mount::bind(
                &masked,
                p,
                false,
                flags::RDONLY | flags::NOSUID | flags::NODEV | flags::NOEXEC,
            )?;
        }
    }
    mount::unmount_detach(staging)?;
    fs::remove_dir(staging)?;
    // One empty read-only tmpfs, bound over every masked directory.
    let mut empty: Option<&Path> = None;
    for d in MASKED_DIRS {
        let p = Path::new(d);
        if !p.is_dir() {
            continue;
        }
        match empty {
            None => {
                mount::mount_fs(
                    "tmpfs",
                    p,
                    flags::RDONLY | flags::NOSUID | flags::NODEV | flags::NOEXEC,
                    Some("size=0,mode=0555"),
                )?;
                empty = Some(p);
            }
            Some(src) => mount::bind(src, p, false, flags::RDONLY | flags::NOSUID | flags::NODEV)?,
        }
    }
    for r in READONLY {
        let p = Path::new(r);
        if p.exists() {
            mount::remount_readonly(p)?;
        }
    }
    // What is left of /proc that root could write, after the masks (a masked file has mode 0).
    let skip: Vec<&str> = READONLY
        .iter()
        .chain(MASKED_DIRS)
        .filter_map(|r| r.strip_prefix("proc/"))
        .collect();
    for p in writable_entries(Path::new("proc"), &skip) {
        mount::remount_readonly(&p)?;
    }
    Ok(())
}

/// Drops what the guest does not need and locks the sandbox's processes out of privilege:
/// not dumpable (its /proc entries are closed to them), no capabilities for anything it
/// execs (root included), no_new_privs.
pub fn lock_down() -> io::Result<()> {
    warren_sys::creds::set_not_dumpable().map_err(|e| ctx(e, "PR_SET_DUMPABLE"))?;
    warren_sys::creds::lock_out_exec_capabilities()
        .map_err(|e| ctx(e, "securebits/bounding set"))?;
    warren_sys::creds::keep_only_agent_capabilities().map_err(|e| ctx(e, "capset"))?;
    warren_sys::creds::set_no_new_privs().map_err(|e| ctx(e, "no_new_privs"))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn file(root: &Path, rel: &str, mode: u32) {
        let p = root.join(rel);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(&p, b"").unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(mode)).unwrap();
    }

    #[test]
    fn the_proc_scan_finds_every_entry_that_holds_a_writable_file() {
        let d = tempfile::tempdir().unwrap();
        let r = d.path();
        file(r, "12/oom_score_adj", 0o644); // a process's own
        file(r, "readable", 0o444);
        file(r, "mtrr", 0o644);
        file(r, "sysrq-trigger", 0o200);
        file(r, "pressure/cpu", 0o666);
        file(r, "dynamic_debug/deep/er/control", 0o644);
        file(r, "driver/rtc", 0o444);
        file(r, "sys/kernel/x", 0o644); // skipped: made read-only already
        std::os::unix::fs::symlink("12", r.join("self")).unwrap();
        std::os::unix::fs::symlink("mtrr", r.join("link")).unwrap();
        let found: Vec<String> = writable_entries(r, &["sys"])
            .iter()
            .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
            .collect();
        assert_eq!(
            found,
            ["dynamic_debug", "mtrr", "pressure", "sysrq-trigger"]
        );
    }

    #[test]
    fn a_tree_too_deep_to_walk_counts_as_writable() {
        let d = tempfile::tempdir().unwrap();
        let deep = (0..SCAN_DEPTH + 1)
            .map(|i| format!("d{i}"))
            .collect::<Vec<_>>();
        file(d.path(), &format!("{}/ro", deep.join("/")), 0o444);
        let found = writable_entries(d.path(), &[]);
        assert_eq!(found, [d.path().join("d0")]);
    }
}
