//! Image layers mounted on this node: each layer (an EROFS file in the store) is mounted once,
//! read-only, and shared by every sandbox that uses it; the overlay of each sandbox stacks on
//! these mounts. A mount is reference counted by the sandboxes using it and unmounted after it
//! has been unused for `layer_idle_unmount` seconds.
//!
//! Two ways to mount (`layer_mount` in the configuration):
//!
//! - `file` (default): EROFS mounted straight from the file: no loop device, cheaper to set
//!   up, and in `make bench-images` (a layer on sshfs over a shaped link) the faster to first
//!   exec and the fewer bytes over the link. Reads go through the backing file's page cache and
//!   its readahead; its read counter is the file's pages that entered that cache. Where the
//!   kernel cannot mount EROFS from a file (before 6.12), a loop device is used instead.
//! - `loop`: a loop device with direct I/O. Reads bypass the backing file's page cache, so on
//!   a local disk it reads fewer bytes (2–7× fewer here for a Python import, see
//!   shared/MACHINE.md) and caches the image once; its counter is the device's reads, repeats
//!   included.

use std::collections::HashMap;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

/// How layers are mounted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LayerMount {
    /// A loop device with direct I/O.
    Loop,
    /// EROFS straight from the file (a loop device where the kernel cannot).
    #[default]
    File,
}

impl LayerMount {
    /// Its configuration name.
    pub fn name(self) -> &'static str {
        match self {
            LayerMount::Loop => "loop",
            LayerMount::File => "file",
        }
    }
}

#[derive(Debug)]
struct Mounted {
    path: PathBuf,
    size: u64,
    mode: LayerMount,
    /// The loop device's number.
    device: Option<u32>,
    /// (`file` mode) The layer file, opened before the mount and kept open for `cachestat`: a
    /// new open would, on FUSE file systems such as sshfs, drop the file's page cache.
    held: Option<std::fs::File>,
    /// Sandboxes using it.
    refs: u32,
    /// Warm inits holding it (not sandboxes yet; they keep it mounted but are not counted as
    /// its users).
    warm: u32,
    idle_since: Option<Instant>,
}

impl Mounted {
    fn new(
        path: PathBuf,
        size: u64,
        device: Option<u32>,
        held: Option<std::fs::File>,
        refs: u32,
    ) -> Mounted {
        Mounted {
            path,
            size,
            mode: if device.is_some() {
                LayerMount::Loop
            } else {
                LayerMount::File
            },
            device,
            held,
            refs,
            warm: 0,
            idle_since: (refs == 0).then(Instant::now),
        }
    }
}

/// Who holds a reference on a layer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Holder {
    /// A sandbox: counted as a user of the layer.
    Sandbox,
    /// A warm init: keeps it mounted, not counted as a user.
    Warm,
}

impl Holder {
    fn count(self, m: &mut Mounted) -> &mut u32 {
        match self {
            Holder::Sandbox => &mut m.refs,
            Holder::Warm => &mut m.warm,
        }
    }
}

/// What [`LayerMounts::stats`] reports per mounted layer.
#[derive(Debug, Clone)]
pub struct MountStats {
    pub digest: String,
    pub size: u64,
    pub mode: LayerMount,
    pub read_bytes: u64,
    pub refs: u32,
}

/// The layers mounted on this node.
#[derive(Debug)]
pub struct LayerMounts {
    dir: PathBuf,
    mode: LayerMount,
    idle: Duration,
    /// Readahead of each loop device, KiB.
    readahead_kb: u32,
    mounted: Mutex<HashMap<String, Mounted>>,
}

fn hex_of(digest: &str) -> &str {
    digest.strip_prefix("sha256:").unwrap_or(digest)
}

/// Mounts under `dir` in this mount namespace: (mount point, source).
fn mounts_under(dir: &Path) -> Vec<(PathBuf, String)> {
    let text = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let mut out = Vec::new();
    for line in text.lines() {
        let f: Vec<&str> = line.split(' ').collect();
        let Some(dash) = f.iter().position(|x| *x == "-") else {
            continue;
        };
        if f.len() < dash + 3 || f.len() < 5 {
            continue;
        }
        let point = PathBuf::from(unescape(f[4]));
        if point.parent() == Some(dir) {
            out.push((point, unescape(f[dash + 2])));
        }
    }
    out
}

/// Undoes mountinfo's octal escapes (`\040` for a space).
fn unescape(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\'
            && i + 4 <= b.len()
            && let Some(v) = std::str::from_utf8(&b[i + 1..i + 4])
                .ok()
                .and_then(|o| u8::from_str_radix(o, 8).ok())
        {
            out.push(v);
            i += 4;
            continue;
        }
        out.push(b[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn loop_number(source: &str) -> Option<u32> {
    source.strip_prefix("/dev/loop")?.parse().ok()
}

impl LayerMounts {
    /// Takes over the layer mounts a previous daemon left under `dir` (unused until adopted
    /// sandboxes claim them) and removes empty mount points.
    pub fn new(
        dir: &Path,
        mode: LayerMount,
        idle: Duration,
        readahead_kb: u32,
    ) -> io::Result<LayerMounts> {
        std::fs::create_dir_all(dir)?;
        let mut mounted = HashMap::new();
        let found = mounts_under(dir);
        for (point, source) in &found {
            let Some(hex) = point.file_name().map(|n| n.to_string_lossy().into_owned()) else {
                continue;
            };
            let device = loop_number(source);
            let file = match device {
                Some(n) => std::fs::read_to_string(format!("/sys/block/loop{n}/loop/backing_file"))
                    .map(|s| PathBuf::from(s.trim()))
                    .unwrap_or_default(),
                None => PathBuf::from(source),
            };
            let size = std::fs::metadata(&file).map(|m| m.len()).unwrap_or(0);
            mounted.insert(
                format!("sha256:{hex}"),
                Mounted::new(
                    point.clone(),
                    size,
                    device,
                    device
                        .is_none()
                        .then(|| std::fs::File::open(source).ok())
                        .flatten(),
                    0,
                ),
            );
        }
        for e in std::fs::read_dir(dir)?.flatten() {
            let p = e.path();
            if !found.iter().any(|(m, _)| *m == p) {
                let _ = std::fs::remove_dir(&p);
            }
        }
        Ok(LayerMounts {
            dir: dir.to_path_buf(),
            mode,
            idle,
            readahead_kb,
            mounted: Mutex::new(mounted),
        })
    }

    /// Mounts (or finds mounted) each layer and takes a reference on it for a sandbox; returns
    /// the mount points in the order given. Blocking. On failure nothing stays referenced.
    pub fn acquire(
        &self,
        digests: &[String],
        file_of: impl Fn(&str) -> io::Result<PathBuf>,
    ) -> io::Result<Vec<PathBuf>> {
        self.acquire_for(digests, file_of, Holder::Sandbox)
    }

    /// [`LayerMounts::acquire`] for `holder`.
    pub fn acquire_for(
        &self,
        digests: &[String],
        file_of: impl Fn(&str) -> io::Result<PathBuf>,
        holder: Holder,
    ) -> io::Result<Vec<PathBuf>> {
        let mut out = Vec::with_capacity(digests.len());
        let mut map = self.mounted.lock().unwrap_or_else(|p| p.into_inner());
        for (i, d) in digests.iter().enumerate() {
            let r = match map.get_mut(d) {
                Some(m) => {
                    *holder.count(m) += 1;
                    m.idle_since = None;
                    Ok(m.path.clone())
                }
                None => self.mount(d, &file_of).map(|mut m| {
                    if holder == Holder::Warm {
                        (m.refs, m.warm) = (0, 1);
                    }
                    let p = m.path.clone();
                    map.insert(d.clone(), m);
                    p
                }),
            };
            match r {
                Ok(p) => out.push(p),
                Err(e) => {
                    drop(map);
                    self.release_for(&digests[..i], holder);
                    return Err(e);
                }
            }
        }
        Ok(out)
    }

    /// Turns a warm init's references into a sandbox's (the init became one).
    pub fn warm_to_sandbox(&self, digests: &[String]) {
        let mut map = self.mounted.lock().unwrap_or_else(|p| p.into_inner());
        for d in digests {
            if let Some(m) = map.get_mut(d) {
                m.warm = m.warm.saturating_sub(1);
                m.refs += 1;
            }
        }
    }

    fn mount(
        &self,
        digest: &str,
        file_of: &impl Fn(&str) -> io::Result<PathBuf>,
    ) -> io::Result<Mounted> {
        let file = file_of(digest)?;
        let size = std::fs::metadata(&file)
            .map_err(|e| io::Error::new(e.kind(), format!("layer {digest}: {e}")))?
            .len();
        let path = self.dir.join(hex_of(digest));
        match std::fs::create_dir(&path) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(e),
        }
        let t0 = Instant::now();
        let mut held = None;
        let device = match self.mode {
            LayerMount::Loop => Some(mount_loop(&file, &path, self.readahead_kb)?),
            LayerMount::File => {
                held = Some(std::fs::File::open(&file)?);
                match warren_sys::blockdev::mount_erofs(&file, &path) {
                    Ok(()) => None,
                    Err(e) => {
                        // Kernels before 6.12 (or without CONFIG_EROFS_FS_BACKED_BY_FILE) mount
                        // EROFS from block devices only: use a loop device instead.
                        tracing::warn!(
                            digest,
                            "EROFS from a file failed ({e}); using a loop device"
                        );
                        held = None;
                        Some(mount_loop(&file, &path, self.readahead_kb)?)
                    }
                }
            }
        };
        tracing::info!(
            digest,
            mode = self.mode.name(),
            us = t0.elapsed().as_micros() as u64,
            "layer mounted"
        );
        Ok(Mounted::new(path, size, device, held, 1))
    }

    /// Drops a sandbox's reference on each layer.
    pub fn release(&self, digests: &[String]) {
        self.release_for(digests, Holder::Sandbox)
    }

    /// Drops `holder`'s reference on each layer.
    pub fn release_for(&self, digests: &[String], holder: Holder) {
        let mut map = self.mounted.lock().unwrap_or_else(|p| p.into_inner());
        for d in digests {
            if let Some(m) = map.get_mut(d) {
                let c = holder.count(m);
                *c = c.saturating_sub(1);
                if m.refs == 0 && m.warm == 0 {
                    m.idle_since = Some(Instant::now());
                }
            }
        }
    }

    /// Unmounts layers unused for longer than the idle time (all unused ones with `force`).
    /// Blocking.
    pub fn sweep(&self, force: bool) -> usize {
        let mut map = self.mounted.lock().unwrap_or_else(|p| p.into_inner());
        let idle: Vec<String> = map
            .iter()
            .filter(|(_, m)| {
                m.refs == 0
                    && m.warm == 0
                    && m.idle_since
                        .is_some_and(|t| force || t.elapsed() >= self.idle)
            })
            .map(|(d, _)| d.clone())
            .collect();
        for d in &idle {
            if let Some(m) = map.remove(d) {
                match warren_sys::mount::unmount_detach(&m.path) {
                    Ok(()) => {
                        let _ = std::fs::remove_dir(&m.path);
                        tracing::info!(digest = %d, "unused layer unmounted");
                    }
                    Err(e) => tracing::warn!(digest = %d, "unmounting an unused layer: {e}"),
                }
            }
        }
        idle.len()
    }

    /// Read statistics of every mounted layer.
    pub fn stats(&self) -> Vec<MountStats> {
        let map = self.mounted.lock().unwrap_or_else(|p| p.into_inner());
        let mut out: Vec<MountStats> = map
            .iter()
            .map(|(d, m)| MountStats {
                digest: d.clone(),
                size: m.size,
                mode: m.mode,
                read_bytes: read_bytes(m),
                refs: m.refs,
            })
            .collect();
        out.sort_by(|a, b| a.digest.cmp(&b.digest));
        out
    }
}

/// Mounts `file` at `path` through a new loop device with `readahead_kb` of readahead; returns
/// the device's number. The open device is dropped after the mount: auto-clear then ties the
/// device's life to the mount's.
fn mount_loop(file: &Path, path: &Path, readahead_kb: u32) -> io::Result<u32> {
    let (dev, _open) = warren_sys::blockdev::attach_loop(file)?;
    // The device is ours (made for this mount); set before the mount, so its files start
    // with it. Advice: a kernel that refuses it keeps its own.
    let ra = format!("/sys/block/loop{}/queue/read_ahead_kb", dev.number);
    if let Err(e) = std::fs::write(&ra, readahead_kb.to_string()) {
        tracing::warn!("setting {ra}: {e}");
    }
    warren_sys::blockdev::mount_erofs(&dev.path, path).inspect_err(|_| {
        let _ = std::fs::remove_dir(path);
    })?;
    Ok(dev.number)
}

/// Bytes read from a mounted layer's file so far.
fn read_bytes(m: &Mounted) -> u64 {
    match m.device {
        Some(n) => {
            // Field 3 of the block device's stat: sectors (512 bytes) read.
            std::fs::read_to_string(format!("/sys/block/loop{n}/stat"))
                .ok()
                .and_then(|s| {
                    s.split_whitespace()
                        .nth(2)
                        .and_then(|x| x.parse::<u64>().ok())
                })
                .map(|sectors| sectors * 512)
                .unwrap_or(0)
        }
        None => m
            .held
            .as_ref()
            .and_then(|f| warren_sys::blockdev::cachestat(f).ok())
            .map(|c| ((c.cached + c.evicted) * 4096).min(m.size))
            .unwrap_or(0),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mountinfo_escapes() {
        assert_eq!(unescape("/a\\040b"), "/a b");
        assert_eq!(unescape("/plain"), "/plain");
        assert_eq!(loop_number("/dev/loop12"), Some(12));
        assert_eq!(loop_number("/var/x.erofs"), None);
    }
}
