//! Copying a tree someone else controls, by descriptor and without recursion: used to take a
//! snapshot of a sandbox's writable layer (to commit it as an image layer) without changing
//! the live layer and without following anything the sandbox planted.
//!
//! Regular files, directories, symbolic links (as links), device nodes and FIFOs are copied
//! with owner, mode, modification time and the extended attributes `keep_xattr` accepts.
//! Sockets are skipped (they mean nothing outside their sandbox). Hard links become separate
//! files.

use std::ffi::{OsStr, OsString};
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;

use rustix::fs::{FileType, Mode, OFlags};

use crate::meta::{self, Meta};
use crate::walk::open_dir_at;

/// What a copy did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct CopyStats {
    /// Entries copied.
    pub entries: u64,
    /// Bytes of file content copied.
    pub bytes: u64,
    /// Sockets skipped.
    pub skipped: u64,
}

struct Level {
    src: OwnedFd,
    dst: OwnedFd,
    /// This directory's name in its parent, and what to set on its copy once its entries are
    /// done (`None` for the top).
    name: Option<(OsString, Meta)>,
    pending: Vec<OsString>,
}

/// The names in directory `dir` (not `.` and `..`), in reverse directory order, for popping.
pub fn names(dir: BorrowedFd<'_>) -> io::Result<Vec<OsString>> {
    let mut out = Vec::new();
    for e in rustix::fs::Dir::read_from(dir).map_err(|e| crate::ctx(e, "reading", "dir"))? {
        let e = e.map_err(|e| crate::ctx(e, "reading", "dir"))?;
        let n = OsStr::from_bytes(e.file_name().to_bytes());
        if n != "." && n != ".." {
            out.push(n.to_os_string());
        }
    }
    // Reverse order, so that popping visits names in directory order.
    out.reverse();
    Ok(out)
}

fn meta_of(
    st: &rustix::fs::Stat,
    xattrs: Vec<(String, Vec<u8>)>,
    keep: &dyn Fn(&str) -> bool,
) -> Meta {
    Meta {
        owner: Some((st.st_uid, st.st_gid)),
        mode: Some(st.st_mode & 0o7777),
        mtime: Some(st.st_mtime),
        xattrs: xattrs.into_iter().filter(|(k, _)| keep(k)).collect(),
    }
}

/// Copies the contents of directory `src` into the empty directory `dst`.
pub fn copy_tree(
    src: BorrowedFd<'_>,
    dst: BorrowedFd<'_>,
    keep_xattr: &dyn Fn(&str) -> bool,
) -> io::Result<CopyStats> {
    let mut stats = CopyStats::default();
    let dup = |fd: BorrowedFd<'_>| fd.try_clone_to_owned();
    let mut stack = vec![Level {
        src: dup(src)?,
        dst: dup(dst)?,
        name: None,
        pending: names(src)?,
    }];
    while let Some(level) = stack.last_mut() {
        let Some(name) = level.pending.pop() else {
            let done = stack.pop().expect("just looked at");
            if let (Some((name, m)), Some(parent)) = (done.name, stack.last()) {
                drop(done.dst);
                meta::apply(parent.dst.as_fd(), &name, &m)?;
            }
            continue;
        };
        let (s, d) = (level.src.as_fd(), level.dst.as_fd());
        let entry = meta::open_entry(s, &name)?;
        let st = rustix::fs::fstat(&entry).map_err(|e| crate::ctx(e, "stat", &name))?;
        let kind = FileType::from_raw_mode(st.st_mode);
        let is_link = kind == FileType::Symlink;
        if kind == FileType::Socket {
            stats.skipped += 1;
            continue;
        }
        let xattrs = meta::xattrs(s, &name, entry.as_fd(), is_link)?;
        let m = meta_of(&st, xattrs, keep_xattr);
        stats.entries += 1;
        match kind {
            FileType::Directory => {
                rustix::fs::mkdirat(d, &name, Mode::from_raw_mode(0o700))
                    .map_err(|e| crate::ctx(e, "making directory", &name))?;
                let src = open_dir_at(s, &name)?;
                let dst = open_dir_at(d, &name)?;
                let pending = names(src.as_fd())?;
                stack.push(Level {
                    src,
                    dst,
                    name: Some((name, m)),
                    pending,
                });
                continue;
            }
            FileType::RegularFile => {
                let from = rustix::fs::openat(
                    s,
                    &name,
                    OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::CLOEXEC,
                    Mode::empty(),
                )
                .map_err(|e| crate::ctx(e, "opening", &name))?;
                let to = rustix::fs::openat(
                    d,
                    &name,
                    OFlags::WRONLY
                        | OFlags::CREATE
                        | OFlags::EXCL
                        | OFlags::NOFOLLOW
                        | OFlags::CLOEXEC,
                    Mode::from_raw_mode(0o600),
                )
                .map_err(|e| crate::ctx(e, "creating", &name))?;
                let mut from = std::fs::File::from(from);
                let mut to = std::fs::File::from(to);
                stats.bytes +=
                    io::copy(&mut from, &mut to).map_err(|e| crate::ctx(e, "copying", &name))?;
            }
            FileType::Symlink => {
                let target = rustix::fs::readlinkat(s, &name, Vec::new())
                    .map_err(|e| crate::ctx(e, "reading link", &name))?;
                rustix::fs::symlinkat(target.as_c_str(), d, &name)
                    .map_err(|e| crate::ctx(e, "making link", &name))?;
            }
            FileType::CharacterDevice | FileType::BlockDevice | FileType::Fifo => {
                rustix::fs::mknodat(d, &name, kind, Mode::from_raw_mode(0o600), st.st_rdev)
                    .map_err(|e| crate::ctx(e, "making node", &name))?;
            }
            _ => {
                stats.skipped += 1;
                stats.entries -= 1;
                continue;
            }
        }
        meta::apply(d, &name, &m)?;
    }
    Ok(stats)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::MetadataExt;

    #[test]
    fn copies_links_as_links_and_filters_attributes() {
        let d = tempfile::tempdir().unwrap();
        let (src, dst) = (d.path().join("src"), d.path().join("dst"));
        std::fs::create_dir_all(src.join("a/b")).unwrap();
        std::fs::create_dir(&dst).unwrap();
        std::fs::write(src.join("a/b/f"), b"hello").unwrap();
        std::os::unix::fs::symlink("/etc/passwd", src.join("a/link")).unwrap();
        rustix::fs::setxattr(
            src.join("a/b/f"),
            "user.keep",
            b"1",
            rustix::fs::XattrFlags::empty(),
        )
        .unwrap();
        rustix::fs::setxattr(
            src.join("a/b/f"),
            "user.drop",
            b"1",
            rustix::fs::XattrFlags::empty(),
        )
        .unwrap();
        let open = |p: &std::path::Path| {
            rustix::fs::open(p, OFlags::RDONLY | OFlags::DIRECTORY, Mode::empty()).unwrap()
        };
        let stats = copy_tree(open(&src).as_fd(), open(&dst).as_fd(), &|k| {
            k != "user.drop"
        })
        .unwrap();
        assert_eq!(stats.bytes, 5);
        assert_eq!(std::fs::read(dst.join("a/b/f")).unwrap(), b"hello");
        assert_eq!(
            std::fs::read_link(dst.join("a/link")).unwrap(),
            std::path::Path::new("/etc/passwd")
        );
        let mut v = [0u8; 8];
        assert!(rustix::fs::getxattr(dst.join("a/b/f"), "user.keep", &mut v).is_ok());
        assert!(rustix::fs::getxattr(dst.join("a/b/f"), "user.drop", &mut v).is_err());
        assert_eq!(
            std::fs::metadata(src.join("a")).unwrap().mode(),
            std::fs::metadata(dst.join("a")).unwrap().mode()
        );
    }
}
