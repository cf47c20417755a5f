//! Loop devices and page-cache statistics: how the node mounts image layers (EROFS files) and
//! measures how much of each it has read.

use std::fs::File;
use std::io;
use std::os::fd::{AsFd, AsRawFd};
use std::path::{Path, PathBuf};

const LOOP_CTL_GET_FREE: libc::c_ulong = 0x4C82;
const LOOP_CONFIGURE: libc::c_ulong = 0x4C0A;
const LO_FLAGS_READ_ONLY: u32 = 1;
const LO_FLAGS_AUTOCLEAR: u32 = 4;
const LO_FLAGS_DIRECT_IO: u32 = 16;
/// `cachestat(2)`: the same number on every architecture (Linux 6.5+).
const SYS_CACHESTAT: libc::c_long = 451;

/// `struct loop_info64` from `<linux/loop.h>`.
#[repr(C)]
struct LoopInfo64 {
    lo_device: u64,
    lo_inode: u64,
    lo_rdevice: u64,
    lo_offset: u64,
    lo_sizelimit: u64,
    lo_number: u32,
    lo_encrypt_type: u32,
    lo_encrypt_key_size: u32,
    lo_flags: u32,
    lo_file_name: [u8; 64],
    lo_crypt_name: [u8; 64],
    lo_encrypt_key: [u8; 32],
    lo_init: [u64; 2],
}

/// `struct loop_config` from `<linux/loop.h>`.
#[repr(C)]
struct LoopConfig {
    fd: u32,
    block_size: u32,
    info: LoopInfo64,
    reserved: [u64; 8],
}

/// A loop device bound to a file.
#[derive(Debug)]
pub struct Loop {
    /// `/dev/loopN`.
    pub path: PathBuf,
    /// N.
    pub number: u32,
}

/// Binds `file` to a free loop device: read-only, with direct I/O (reads bypass the page cache
/// of the backing file, so the device's read counter is what was really read from it), and
/// auto-clear (the device frees itself once its last user, e.g. a mount, goes away).
///
/// The device stays bound only while something holds it: mount it before the returned value's
/// open descriptor is dropped, which this function does not keep.
pub fn attach_loop(file: &Path) -> io::Result<(Loop, File)> {
    attach(file, true)
}

/// Binds `file` to a free loop device for reading and writing, with direct I/O and auto-clear
/// (as [`attach_loop`]); discards on the device punch holes in the file, so a sparse file gives
/// space back as its file system frees blocks.
pub fn attach_loop_rw(file: &Path) -> io::Result<(Loop, File)> {
    attach(file, false)
}

fn attach(file: &Path, read_only: bool) -> io::Result<(Loop, File)> {
    let backing = File::options().read(true).write(!read_only).open(file)?;
    let ctl = File::options()
        .read(true)
        .write(true)
        .open("/dev/loop-control")?;
    // A free device can be taken by someone else between GET_FREE and CONFIGURE: retry.
    for _ in 0..16 {
        // SAFETY: LOOP_CTL_GET_FREE takes no argument and returns a device number or -1.
        let n = unsafe { libc::ioctl(ctl.as_raw_fd(), LOOP_CTL_GET_FREE) };
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        let path = PathBuf::from(format!("/dev/loop{n}"));
        let dev = File::options().read(true).write(!read_only).open(&path)?;
        // SAFETY: an all-zero loop_config is valid (plain integers and byte arrays).
        let mut cfg: LoopConfig = unsafe { std::mem::zeroed() };
        cfg.fd = backing.as_raw_fd() as u32;
        cfg.info.lo_flags = LO_FLAGS_AUTOCLEAR | LO_FLAGS_DIRECT_IO;
        if read_only {
            cfg.info.lo_flags |= LO_FLAGS_READ_ONLY;
        }
        let name = file.as_os_str().as_encoded_bytes();
        let k = name.len().min(63);
        cfg.info.lo_file_name[..k].copy_from_slice(&name[..k]);
        // SAFETY: LOOP_CONFIGURE reads a struct loop_config that lives for the call.
        let r = unsafe { libc::ioctl(dev.as_raw_fd(), LOOP_CONFIGURE, &cfg as *const LoopConfig) };
        if r == 0 {
            return Ok((
                Loop {
                    path,
                    number: n as u32,
                },
                dev,
            ));
        }
        let e = io::Error::last_os_error();
        if e.raw_os_error() != Some(libc::EBUSY) {
            return Err(io::Error::new(
                e.kind(),
                format!("configuring {}: {e}", path.display()),
            ));
        }
    }
    Err(io::Error::other("no free loop device after 16 tries"))
}

/// Mounts the EROFS file system on `source` (a block device, or a regular file where the
/// kernel mounts EROFS straight from a file) read-only at `target`.
pub fn mount_erofs(source: &Path, target: &Path) -> io::Result<()> {
    rustix::mount::mount(
        source,
        target,
        "erofs",
        rustix::mount::MountFlags::RDONLY
            | rustix::mount::MountFlags::NODEV
            | rustix::mount::MountFlags::NOSUID,
        None,
    )
    .map_err(|e| {
        io::Error::new(
            io::Error::from(e).kind(),
            format!(
                "mounting EROFS {} at {}: {e}",
                source.display(),
                target.display()
            ),
        )
    })
}

/// Mounts the btrfs file system on block device `source` at `target` (no access times,
/// asynchronous discard so freed blocks go back to a sparse backing file).
pub fn mount_btrfs(source: &Path, target: &Path) -> io::Result<()> {
    rustix::mount::mount(
        source,
        target,
        "btrfs",
        rustix::mount::MountFlags::NOATIME
            | rustix::mount::MountFlags::NODEV
            | rustix::mount::MountFlags::NOSUID,
        Some(c"discard=async"),
    )
    .map_err(|e| {
        io::Error::new(
            io::Error::from(e).kind(),
            format!(
                "mounting btrfs {} at {}: {e}",
                source.display(),
                target.display()
            ),
        )
    })
}

/// Size of the file system holding `path`, bytes.
pub fn size_bytes(path: &Path) -> io::Result<u64> {
    let st = rustix::fs::statvfs(path)?;
    Ok(st.f_blocks * st.f_frsize)
}

/// Bytes free to unprivileged users on the file system holding `path`.
pub fn free_bytes(path: &Path) -> io::Result<u64> {
    let st = rustix::fs::statvfs(path)?;
    Ok(st.f_bavail * st.f_frsize)
}

/// Page-cache state of a file (`cachestat(2)`), in pages.
#[derive(Debug, Clone, Copy, Default)]
pub struct CacheStat {
    /// Pages in the page cache now.
    pub cached: u64,
    /// Pages that were cached and have been evicted since (as far as the kernel remembers).
    pub evicted: u64,
}

#[repr(C)]
struct CachestatRange {
    off: u64,
    len: u64,
}

#[repr(C)]
#[derive(Default)]
struct Cachestat {
    nr_cache: u64,
    nr_dirty: u64,
    nr_writeback: u64,
    nr_evicted: u64,
    nr_recently_evicted: u64,
}

/// How much of `file` is (or was) in the page cache.
pub fn cachestat(file: impl AsFd) -> io::Result<CacheStat> {
    let range = CachestatRange { off: 0, len: 0 };
    let mut out = Cachestat::default();
    // SAFETY: cachestat reads `range` and writes `out`, both live for the call; the fd is open.
    let r = unsafe {
        libc::syscall(
            SYS_CACHESTAT,
            file.as_fd().as_raw_fd(),
            &range as *const CachestatRange,
            &mut out as *mut Cachestat,
            0u32,
        )
    };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(CacheStat {
        cached: out.nr_cache,
        evicted: out.nr_evicted,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn struct_sizes_match_the_kernel() {
        assert_eq!(std::mem::size_of::<LoopInfo64>(), 232);
        assert_eq!(std::mem::size_of::<LoopConfig>(), 304);
    }

    #[test]
    fn cachestat_sees_a_file_read() {
        let mut f = tempfile::tempfile().unwrap();
        use std::io::{Read, Seek, Write};
        f.write_all(&vec![7u8; 1 << 20]).unwrap();
        f.rewind().unwrap();
        let mut buf = Vec::new();
        f.read_to_end(&mut buf).unwrap();
        let s = cachestat(&f).unwrap();
        assert!(s.cached > 0, "{s:?}");
    }
}
