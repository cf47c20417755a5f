//! Disk quotas of sandboxes' writable layers.
//!
//! A sandbox's writable layer (overlay `upper` and `work`) lives in a btrfs subvolume of its
//! own, in one btrfs file system per node (the pool, `<state>/disk`, on a loop device over
//! the sparse file `<state>/disk.img`); the subvolume's quota group caps what the sandbox can
//! write. Past it, writes inside that sandbox fail with `EDQUOT` ("Disk quota exceeded"); the
//! node's own disk, the database and the other sandboxes are untouched, and the pool's file
//! never grows past its size. Asynchronous discard gives freed blocks back to the host.
//!
//! Why btrfs: measured on this machine kind (see `warren-bench disk`), ext4 and XFS project
//! quotas would cost two system calls on the create path but the kernel lacks the quota
//! formats they need (`CONFIG_QFMT_V2`, `CONFIG_XFS_QUOTA`); a size-limited file system per
//! sandbox costs a mkfs, a loop device and a mount (~12 ms, so only through the warm pool)
//! plus a kernel thread and ~170 KiB per sandbox; a subvolume and its limit cost about a
//! millisecond and nothing per sandbox beyond the subvolume. Deleting a subvolume is one call,
//! whatever the sandbox left in it (a tree 100,000 directories deep included).

use std::ffi::CString;
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use warren_types::ByteSize;

use crate::config::{DiskQuota, NodeConfig};

/// A sandbox's writable-layer volume.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Volume {
    /// Its name in the pool.
    pub name: String,
    /// Its subvolume id (its quota group is `0/<id>`).
    pub id: u64,
}

/// The node's disk pool.
#[derive(Debug)]
pub struct DiskPool {
    /// Where it is mounted.
    pub root: PathBuf,
    dir: OwnedFd,
    fsid: String,
    /// Its size, bytes.
    pub capacity: u64,
}

fn ctx(e: io::Error, what: &str) -> io::Error {
    io::Error::new(e.kind(), format!("{what}: {e}"))
}

/// Whether `target` is a btrfs mount point (from mountinfo).
fn mounted_btrfs(target: &Path) -> bool {
    let t = target.to_string_lossy();
    std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap_or_default()
        .lines()
        .any(|l| {
            let mut halves = l.split(" - ");
            let left = halves.next().unwrap_or_default();
            let fstype = halves.next().unwrap_or_default().split(' ').next();
            left.split(' ').nth(4) == Some(&*t) && fstype == Some("btrfs")
        })
}

impl DiskPool {
    /// Opens the pool under `state` (making it on first start). `Ok(None)` when quotas are
    /// off by configuration.
    pub fn open(state: &Path, cfg: &NodeConfig) -> io::Result<Option<DiskPool>> {
        if cfg.disk_quota == DiskQuota::Off {
            return Ok(None);
        }
        let root = state.join("disk");
        let img = state.join("disk.img");
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&root)?;
        if !mounted_btrfs(&root) {
            if !img.exists() {
                make_pool(&img, cfg)?;
            }
            let (dev, _hold) =
                warren_sys::blockdev::attach_loop_rw(&img).map_err(|e| ctx(e, "loop device"))?;
            warren_sys::blockdev::mount_btrfs(&dev.path, &root)?;
        }
        let dir: OwnedFd = std::fs::File::open(&root)?.into();
        let fsid = warren_sys::btrfs::fsid(dir.as_fd()).map_err(|e| ctx(e, "btrfs fsid"))?;
        if !Path::new(&format!("/sys/fs/btrfs/{fsid}/qgroups")).is_dir() {
            warren_sys::btrfs::enable_quota(dir.as_fd()).map_err(|e| ctx(e, "enabling quotas"))?;
        }
        let capacity = warren_sys::blockdev::size_bytes(&root)?;
        Ok(Some(DiskPool {
            root,
            dir,
            fsid,
            capacity,
        }))
    }

    /// A new volume with `upper` and `work` directories, limited to `limit` bytes (none yet
    /// when `None`: a warm init's volume gets its limit when a sandbox takes it).
    pub fn create(&self, limit: Option<u64>) -> io::Result<Volume> {
        let name = format!("v-{}", crate::state::random_name(16));
        let c = CString::new(name.clone()).map_err(io::Error::other)?;
        warren_sys::btrfs::create_subvolume(self.dir.as_fd(), &c)
            .map_err(|e| ctx(e, "creating the sandbox's disk volume"))?;
        let made = (|| {
            let path = self.root.join(&name);
            for sub in ["upper", "work"] {
                std::fs::DirBuilder::new()
                    .mode(0o755)
                    .create(path.join(sub))?;
            }
            let f = std::fs::File::open(&path)?;
            let id = warren_sys::btrfs::subvolume_id(f.as_fd())?;
            if let Some(bytes) = limit {
                warren_sys::btrfs::set_limit(f.as_fd(), bytes)?;
            }
            Ok(Volume {
                name: name.clone(),
                id,
            })
        })();
        if made.is_err() {
            let _ = warren_sys::btrfs::delete_subvolume(self.dir.as_fd(), &c);
        }
        made
    }

    /// Sets a volume's limit, bytes.
    pub fn set_limit(&self, v: &Volume, bytes: u64) -> io::Result<()> {
        let f = std::fs::File::open(self.root.join(&v.name))?;
        warren_sys::btrfs::set_limit(f.as_fd(), bytes).map_err(|e| ctx(e, "setting the disk quota"))
    }

    /// Bytes a volume holds now, and its limit (from `/sys/fs/btrfs/<fsid>/qgroups`).
    pub fn usage(&self, v: &Volume) -> Option<(u64, u64)> {
        let dir = format!("/sys/fs/btrfs/{}/qgroups/0_{}", self.fsid, v.id);
        let read = |f: &str| {
            std::fs::read_to_string(format!("{dir}/{f}"))
                .ok()
                .and_then(|s| s.trim().parse::<u64>().ok())
        };
        Some((read("referenced")?, read("max_referenced").unwrap_or(0)))
    }

    /// Deletes a volume and its contents.
    pub fn delete(&self, name: &str) -> io::Result<()> {
        let c = CString::new(name).map_err(io::Error::other)?;
        match warren_sys::btrfs::delete_subvolume(self.dir.as_fd(), &c) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(ctx(e, &format!("deleting disk volume {name}"))),
        }
    }

    /// Names of every volume in the pool.
    pub fn volumes(&self) -> Vec<String> {
        std::fs::read_dir(&self.root)
            .into_iter()
            .flatten()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| n.starts_with("v-"))
            .collect()
    }

    /// Removes the quota groups that deleted volumes left (once the kernel is done cleaning).
    pub fn collect_quota_groups(&self) {
        let live: std::collections::HashSet<u64> = self
            .volumes()
            .iter()
            .filter_map(|n| std::fs::File::open(self.root.join(n)).ok())
            .filter_map(|f| warren_sys::btrfs::subvolume_id(f.as_fd()).ok())
            .collect();
        let dir = format!("/sys/fs/btrfs/{}/qgroups", self.fsid);
        for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
            let n = e.file_name().to_string_lossy().into_owned();
            if let Some(id) = n.strip_prefix("0_").and_then(|i| i.parse::<u64>().ok())
                && id >= 256
                && !live.contains(&id)
            {
                let _ = warren_sys::btrfs::destroy_qgroup(self.dir.as_fd(), id);
            }
        }
    }

    /// Free bytes in the pool now.
    pub fn free(&self) -> u64 {
        warren_sys::blockdev::free_bytes(&self.root).unwrap_or(0)
    }

    /// Sizes in error messages.
    pub fn describe(&self) -> String {
        format!("{} ({})", self.root.display(), ByteSize(self.capacity))
    }

    /// Puts a new volume under sandbox directory `dir`: `upper` and `work` there are links to
    /// the volume's (the init mounts its overlay through them, once).
    pub fn attach(&self, dir: &Path, limit: Option<u64>) -> io::Result<Volume> {
        let v = self.create(limit)?;
        let vol = self.root.join(&v.name);
        let linked = ["upper", "work"]
            .iter()
            .try_for_each(|sub| std::os::unix::fs::symlink(vol.join(sub), dir.join(sub)));
        if let Err(e) = linked {
            let _ = self.delete(&v.name);
            return Err(e);
        }
        Ok(v)
    }

    /// The volume sandbox directory `dir` uses, if its `upper` links into this pool. The link
    /// is the node's own (the sandbox directory is outside every sandbox's view).
    pub fn volume_of(&self, dir: &Path) -> Option<Volume> {
        let target = std::fs::read_link(dir.join("upper")).ok()?;
        let rest = target.strip_prefix(&self.root).ok()?;
        let name = rest
            .components()
            .next()?
            .as_os_str()
            .to_string_lossy()
            .into_owned();
        if !name.starts_with("v-") {
            return None;
        }
        let f = std::fs::File::open(self.root.join(&name)).ok()?;
        let id = warren_sys::btrfs::subvolume_id(f.as_fd()).ok()?;
        Some(Volume { name, id })
    }

    /// Deletes the volume sandbox directory `dir` uses, if any (teardown).
    pub fn release(&self, dir: &Path) {
        if let Some(v) = self.volume_of(dir)
            && let Err(e) = self.delete(&v.name)
        {
            tracing::error!("{e}");
        }
    }
}

/// Makes the pool's file: sparse, `disk_pool_size` (default: half the free space where the
/// state directory is, at most 1 TiB), formatted btrfs.
fn make_pool(img: &Path, cfg: &NodeConfig) -> io::Result<()> {
    let size = match cfg.disk_pool_size {
        Some(s) => s.bytes(),
        None => {
            let free = warren_sys::blockdev::free_bytes(img.parent().unwrap_or(Path::new("/")))?;
            (free / 2).min(1 << 40)
        }
    };
    if size < 256 << 20 {
        return Err(io::Error::other(format!(
            "the disk pool would be {}: free space where the state directory is, or set disk_pool_size",
            ByteSize(size)
        )));
    }
    let tmp = img.with_extension("img.tmp");
    let f = std::fs::File::create(&tmp)?;
    f.set_len(size)?;
    drop(f);
    let out = std::process::Command::new("mkfs.btrfs")
        .args(["-q", "-f", "-m", "single", "-d", "single"])
        .arg(&tmp)
        .output()
        .map_err(|e| {
            let _ = std::fs::remove_file(&tmp);
            ctx(e, "running mkfs.btrfs (install btrfs-progs)")
        })?;
    if !out.status.success() {
        let _ = std::fs::remove_file(&tmp);
        return Err(io::Error::other(format!(
            "mkfs.btrfs failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    std::fs::rename(&tmp, img)
}
