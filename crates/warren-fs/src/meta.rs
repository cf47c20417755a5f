//! Owner, mode, times and extended attributes of one directory entry, set without ever
//! following it when it is a symbolic link.
//!
//! The entry is opened with `O_PATH | O_NOFOLLOW` from its directory's descriptor: the
//! descriptor is the entry itself (a link stays a link), and every change goes through it or
//! through `/proc/self/fd/N`, which names exactly that inode. Nothing opens the entry for
//! reading or writing, so a device node or FIFO is never opened either.

use std::ffi::OsStr;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};

use rustix::fs::{AtFlags, FileType, Mode, OFlags, Timespec, Timestamps, XattrFlags};

/// What to set on an entry. `None` leaves a property as it is.
#[derive(Debug, Clone, Default)]
pub struct Meta {
    /// Owner (uid, gid).
    pub owner: Option<(u32, u32)>,
    /// Permission bits (ignored for symbolic links, which have none).
    pub mode: Option<u32>,
    /// Modification (and access) time, seconds since the epoch.
    pub mtime: Option<i64>,
    /// Extended attributes to set.
    pub xattrs: Vec<(String, Vec<u8>)>,
}

/// Opens `name` in `dir` as a path descriptor of the entry itself.
pub fn open_entry(dir: BorrowedFd<'_>, name: &OsStr) -> io::Result<OwnedFd> {
    rustix::fs::openat(
        dir,
        name,
        OFlags::PATH | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| crate::ctx(e, "opening", name))
}

/// The `/proc/self/fd` name of a descriptor: the inode it refers to, whatever its path.
fn proc_fd(fd: BorrowedFd<'_>) -> String {
    format!("/proc/self/fd/{}", fd.as_raw_fd())
}

/// Sets `m` on entry `name` of `dir`. Changes go in the order that keeps them: owner first
/// (it clears set-user-id bits), then mode, attributes, times.
pub fn apply(dir: BorrowedFd<'_>, name: &OsStr, m: &Meta) -> io::Result<()> {
    let fd = open_entry(dir, name)?;
    let st = rustix::fs::fstat(&fd).map_err(|e| crate::ctx(e, "stat", name))?;
    let is_link = FileType::from_raw_mode(st.st_mode) == FileType::Symlink;
    if let Some((uid, gid)) = m.owner {
        rustix::fs::chownat(
            &fd,
            "",
            Some(rustix::fs::Uid::from_raw(uid)),
            Some(rustix::fs::Gid::from_raw(gid)),
            AtFlags::EMPTY_PATH,
        )
        .map_err(|e| crate::ctx(e, "setting the owner of", name))?;
    }
    if let (Some(mode), false) = (m.mode, is_link) {
        rustix::fs::chmodat(
            rustix::fs::CWD,
            proc_fd(fd.as_fd()),
            Mode::from_raw_mode(mode & 0o7777),
            AtFlags::empty(),
        )
        .map_err(|e| crate::ctx(e, "setting the mode of", name))?;
    }
    for (attr, value) in &m.xattrs {
        set_xattr(dir, name, fd.as_fd(), is_link, attr, value)?;
    }
    if let Some(t) = m.mtime {
        let ts = Timespec {
            tv_sec: t,
            tv_nsec: 0,
        };
        let times = Timestamps {
            last_access: ts,
            last_modification: ts,
        };
        // Relative to the verified directory, final component not followed.
        rustix::fs::utimensat(dir, name, &times, AtFlags::SYMLINK_NOFOLLOW)
            .map_err(|e| crate::ctx(e, "setting the times of", name))?;
    }
    Ok(())
}

/// Sets one extended attribute on the entry `fd` (named `name` in `dir`).
pub fn set_xattr(
    dir: BorrowedFd<'_>,
    name: &OsStr,
    fd: BorrowedFd<'_>,
    is_link: bool,
    attr: &str,
    value: &[u8],
) -> io::Result<()> {
    let r = if is_link {
        // A link's own attributes: its directory by descriptor, the link's name not followed.
        let mut p = std::path::PathBuf::from(proc_fd(dir));
        p.push(name);
        rustix::fs::lsetxattr(&p, attr, value, XattrFlags::empty())
    } else {
        rustix::fs::setxattr(proc_fd(fd), attr, value, XattrFlags::empty())
    };
    r.map_err(|e| crate::ctx(e, &format!("setting {attr} on"), name))
}

/// Lists the extended attributes of the entry `fd` (`name` in `dir`), with their values.
pub fn xattrs(
    dir: BorrowedFd<'_>,
    name: &OsStr,
    fd: BorrowedFd<'_>,
    is_link: bool,
) -> io::Result<Vec<(String, Vec<u8>)>> {
    let path = if is_link {
        let mut p = std::path::PathBuf::from(proc_fd(dir));
        p.push(name);
        p
    } else {
        std::path::PathBuf::from(proc_fd(fd))
    };
    let list = |buf: &mut Vec<u8>| {
        if is_link {
            rustix::fs::llistxattr(&path, buf)
        } else {
            rustix::fs::listxattr(&path, buf)
        }
    };
    let get = |attr: &str, buf: &mut Vec<u8>| {
        if is_link {
            rustix::fs::lgetxattr(&path, attr, buf)
        } else {
            rustix::fs::getxattr(&path, attr, buf)
        }
    };
    let mut names = vec![0u8; 4096];
    let n = loop {
        match list(&mut names) {
            Ok(n) => break n,
            Err(rustix::io::Errno::RANGE) if names.len() < 1 << 20 => {
                names.resize(names.len() * 4, 0)
            }
            Err(rustix::io::Errno::NOTSUP) => return Ok(Vec::new()),
            Err(e) => return Err(crate::ctx(e, "listing attributes of", name)),
        }
    };
    let mut out = Vec::new();
    for attr in names[..n].split(|b| *b == 0).filter(|a| !a.is_empty()) {
        let attr = String::from_utf8_lossy(attr).into_owned();
        let mut value = vec![0u8; 4096];
        let len = loop {
            match get(&attr, &mut value) {
                Ok(len) => break len,
                Err(rustix::io::Errno::RANGE) if value.len() < 1 << 20 => {
                    value.resize(value.len() * 4, 0)
                }
                Err(e) => return Err(crate::ctx(e, &format!("reading {attr} of"), name)),
            }
        };
        value.truncate(len);
        out.push((attr, value));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::{MetadataExt, PermissionsExt};

    #[test]
    fn never_through_a_link() {
        let d = tempfile::tempdir().unwrap();
        let victim = d.path().join("victim");
        std::fs::write(&victim, b"v").unwrap();
        std::fs::set_permissions(&victim, std::fs::Permissions::from_mode(0o600)).unwrap();
        std::os::unix::fs::symlink(&victim, d.path().join("link")).unwrap();
        let dir =
            rustix::fs::open(d.path(), OFlags::RDONLY | OFlags::DIRECTORY, Mode::empty()).unwrap();
        apply(
            dir.as_fd(),
            OsStr::new("link"),
            &Meta {
                mode: Some(0o4777),
                mtime: Some(1000),
                ..Meta::default()
            },
        )
        .unwrap();
        let md = std::fs::metadata(&victim).unwrap();
        assert_eq!(md.mode() & 0o7777, 0o600, "the link's target kept its mode");
        assert_ne!(md.mtime(), 1000, "and its times");
        assert_eq!(
            std::fs::symlink_metadata(d.path().join("link"))
                .unwrap()
                .mtime(),
            1000,
            "the link itself got the time"
        );
        // A regular file gets what it is given.
        apply(
            dir.as_fd(),
            OsStr::new("victim"),
            &Meta {
                mode: Some(0o640),
                xattrs: vec![("user.test".into(), b"1".to_vec())],
                ..Meta::default()
            },
        )
        .unwrap();
        assert_eq!(std::fs::metadata(&victim).unwrap().mode() & 0o7777, 0o640);
        let fd = open_entry(dir.as_fd(), OsStr::new("victim")).unwrap();
        let x = xattrs(dir.as_fd(), OsStr::new("victim"), fd.as_fd(), false).unwrap();
        assert!(
            x.contains(&("user.test".to_string(), b"1".to_vec())),
            "{x:?}"
        );
    }
}
