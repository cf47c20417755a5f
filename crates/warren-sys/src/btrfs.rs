//! btrfs subvolumes and quota groups, by ioctl: the writable layers' disk quotas.
//!
//! One btrfs file system (a node's disk pool) holds a subvolume per sandbox; the subvolume's
//! quota group caps what the sandbox can write (`EDQUOT` past it, inside that sandbox only).
//! Deleting a subvolume is one call whatever its contents: the kernel's cleaner frees the tree.

use std::ffi::CStr;
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd};

const MAGIC: u64 = 0x94;
const fn iow(nr: u64, size: u64) -> u64 {
    (1 << 30) | (size << 16) | (MAGIC << 8) | nr
}
const fn ior(nr: u64, size: u64) -> u64 {
    (2 << 30) | (size << 16) | (MAGIC << 8) | nr
}
const fn iowr(nr: u64, size: u64) -> u64 {
    (3 << 30) | (size << 16) | (MAGIC << 8) | nr
}

/// `struct btrfs_ioctl_vol_args`.
#[repr(C)]
struct VolArgs {
    fd: i64,
    name: [u8; 4088],
}

/// `struct btrfs_ioctl_quota_ctl_args`.
#[repr(C)]
struct QuotaCtlArgs {
    cmd: u64,
    status: u64,
}

/// `struct btrfs_qgroup_limit`.
#[repr(C)]
struct QgroupLimit {
    flags: u64,
    max_rfer: u64,
    max_excl: u64,
    rsv_rfer: u64,
    rsv_excl: u64,
}

/// `struct btrfs_ioctl_qgroup_limit_args`.
#[repr(C)]
struct QgroupLimitArgs {
    qgroupid: u64,
    lim: QgroupLimit,
}

/// `struct btrfs_ioctl_qgroup_create_args`.
#[repr(C)]
struct QgroupCreateArgs {
    create: u64,
    qgroupid: u64,
}

/// `struct btrfs_ioctl_ino_lookup_args`.
#[repr(C)]
struct InoLookupArgs {
    treeid: u64,
    objectid: u64,
    name: [u8; 4080],
}

/// `struct btrfs_ioctl_fs_info_args` (only the fields before `fsid` and `fsid` are read).
#[repr(C)]
struct FsInfoArgs {
    max_id: u64,
    num_devices: u64,
    fsid: [u8; 16],
    rest: [u8; 1024 - 32],
}

const SUBVOL_CREATE: u64 = iow(14, std::mem::size_of::<VolArgs>() as u64);
const SNAP_DESTROY: u64 = iow(15, std::mem::size_of::<VolArgs>() as u64);
const INO_LOOKUP: u64 = iowr(18, std::mem::size_of::<InoLookupArgs>() as u64);
const FS_INFO: u64 = ior(31, std::mem::size_of::<FsInfoArgs>() as u64);
const QUOTA_CTL: u64 = iowr(40, std::mem::size_of::<QuotaCtlArgs>() as u64);
const QGROUP_CREATE: u64 = iow(42, std::mem::size_of::<QgroupCreateArgs>() as u64);
const QGROUP_LIMIT: u64 = ior(43, std::mem::size_of::<QgroupLimitArgs>() as u64);

const QUOTA_CTL_ENABLE: u64 = 1;
const QGROUP_LIMIT_MAX_RFER: u64 = 1 << 0;
const FIRST_FREE_OBJECTID: u64 = 256;

/// `ioctl(fd, req, arg)` on a properly sized structure.
///
/// # Safety
/// `arg` must point at a live value of the type the request's size encodes.
unsafe fn ioctl<T>(fd: BorrowedFd<'_>, req: u64, arg: *mut T) -> io::Result<()> {
    // SAFETY: the caller guarantees `arg` is the structure `req` names.
    let r = unsafe { libc::ioctl(fd.as_raw_fd(), req as _, arg) };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

fn vol_args(name: &CStr) -> io::Result<Box<VolArgs>> {
    let b = name.to_bytes();
    if b.is_empty() || b.len() >= 4088 || b.contains(&b'/') {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "a subvolume name is one path component",
        ));
    }
    let mut a = Box::new(VolArgs {
        fd: 0,
        name: [0; 4088],
    });
    a.name[..b.len()].copy_from_slice(b);
    Ok(a)
}

/// Creates subvolume `name` in directory `parent`.
pub fn create_subvolume(parent: BorrowedFd<'_>, name: &CStr) -> io::Result<()> {
    let mut a = vol_args(name)?;
    // SAFETY: `a` is a btrfs_ioctl_vol_args, as SUBVOL_CREATE requires.
    unsafe { ioctl(parent, SUBVOL_CREATE, &mut *a) }
}

/// Deletes subvolume `name` of directory `parent`, contents and all (the kernel's cleaner
/// frees them afterwards).
pub fn delete_subvolume(parent: BorrowedFd<'_>, name: &CStr) -> io::Result<()> {
    let mut a = vol_args(name)?;
    // SAFETY: as above, for SNAP_DESTROY.
    unsafe { ioctl(parent, SNAP_DESTROY, &mut *a) }
}

/// The id of the subvolume `fd` is in.
pub fn subvolume_id(fd: BorrowedFd<'_>) -> io::Result<u64> {
    let mut a = Box::new(InoLookupArgs {
        treeid: 0,
        objectid: FIRST_FREE_OBJECTID,
        name: [0; 4080],
    });
    // SAFETY: `a` is a btrfs_ioctl_ino_lookup_args, as INO_LOOKUP requires.
    unsafe { ioctl(fd, INO_LOOKUP, &mut *a)? };
    Ok(a.treeid)
}

/// The file system's UUID, as `/sys/fs/btrfs/<uuid>` names it.
pub fn fsid(fd: BorrowedFd<'_>) -> io::Result<String> {
    let mut a = Box::new(FsInfoArgs {
        max_id: 0,
        num_devices: 0,
        fsid: [0; 16],
        rest: [0; 1024 - 32],
    });
    // SAFETY: `a` is a 1024-byte btrfs_ioctl_fs_info_args, as FS_INFO requires.
    unsafe { ioctl(fd, FS_INFO, &mut *a)? };
    let h: Vec<String> = a.fsid.iter().map(|b| format!("{b:02x}")).collect();
    let h = h.concat();
    Ok(format!(
        "{}-{}-{}-{}-{}",
        &h[0..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..32]
    ))
}

/// Turns quota groups on for the file system of `fd`.
pub fn enable_quota(fd: BorrowedFd<'_>) -> io::Result<()> {
    let mut a = QuotaCtlArgs {
        cmd: QUOTA_CTL_ENABLE,
        status: 0,
    };
    // SAFETY: `a` is a btrfs_ioctl_quota_ctl_args, as QUOTA_CTL requires.
    unsafe { ioctl(fd, QUOTA_CTL, &mut a) }
}

/// Caps what the subvolume `fd` is in may reference, in bytes (0: no limit).
pub fn set_limit(fd: BorrowedFd<'_>, bytes: u64) -> io::Result<()> {
    let mut a = QgroupLimitArgs {
        // 0: the quota group of the subvolume the descriptor is in.
        qgroupid: 0,
        lim: QgroupLimit {
            flags: QGROUP_LIMIT_MAX_RFER,
            max_rfer: if bytes == 0 { u64::MAX } else { bytes },
            max_excl: 0,
            rsv_rfer: 0,
            rsv_excl: 0,
        },
    };
    // SAFETY: `a` is a btrfs_ioctl_qgroup_limit_args, as QGROUP_LIMIT requires.
    unsafe { ioctl(fd, QGROUP_LIMIT, &mut a) }
}

/// Removes the quota group of a deleted subvolume (`EBUSY` until the cleaner is done with it).
pub fn destroy_qgroup(fs: BorrowedFd<'_>, subvolume: u64) -> io::Result<()> {
    let mut a = QgroupCreateArgs {
        create: 0,
        qgroupid: subvolume,
    };
    // SAFETY: `a` is a btrfs_ioctl_qgroup_create_args, as QGROUP_CREATE requires.
    unsafe { ioctl(fs, QGROUP_CREATE, &mut a) }
}
