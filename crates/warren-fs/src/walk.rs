//! Opening directories below a root without following symbolic links.

use std::ffi::OsStr;
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::{Component, Path, PathBuf};

use rustix::fs::{Mode, OFlags};
use rustix::io::Errno;

/// A relative path checked to stay below its root: no root, no `..` (`.` is skipped).
pub fn check_relative(rel: &Path) -> io::Result<PathBuf> {
    let mut out = PathBuf::new();
    for c in rel.components() {
        match c {
            Component::Normal(x) => out.push(x),
            Component::CurDir => {}
            Component::ParentDir | Component::RootDir | Component::Prefix(_) => {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!(
                        "{:?} leaves the tree: only relative paths without `..` are allowed",
                        rel.display().to_string()
                    ),
                ));
            }
        }
    }
    Ok(out)
}

const DIR_FLAGS: OFlags = OFlags::RDONLY
    .union(OFlags::DIRECTORY)
    .union(OFlags::NOFOLLOW)
    .union(OFlags::CLOEXEC);

/// Opens directory `name` in `dir`, refusing a symbolic link or anything else that is not a
/// directory.
pub(crate) fn open_dir_at(dir: BorrowedFd<'_>, name: &OsStr) -> io::Result<OwnedFd> {
    rustix::fs::openat(dir, name, DIR_FLAGS, Mode::empty()).map_err(|e| dir_error(e, name))
}

fn dir_error(e: Errno, name: &OsStr) -> io::Error {
    match e {
        Errno::LOOP | Errno::NOTDIR => io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "{:?} is not a directory (a symbolic link is never followed here)",
                name.to_string_lossy()
            ),
        ),
        e => crate::ctx(e, "opening directory", name),
    }
}

/// A directory tree worked on by descriptor: every path below it is resolved one component at
/// a time from the root's descriptor, and no component may be a symbolic link.
///
/// The last directory opened is kept, so that consecutive entries of one directory (the usual
/// order in archives) cost one open, not one per component.
pub struct Beneath {
    root: OwnedFd,
    last: Option<(PathBuf, OwnedFd)>,
}

impl Beneath {
    /// Opens `path` (a directory the caller trusts: the root itself may be reached through
    /// links) as the root.
    pub fn open(path: &Path) -> io::Result<Beneath> {
        let root = rustix::fs::open(
            path,
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .map_err(|e| crate::ctx(e, "opening", path))?;
        Ok(Beneath::new(root))
    }

    /// Uses an open directory as the root.
    pub fn new(root: OwnedFd) -> Beneath {
        Beneath { root, last: None }
    }

    /// The root's descriptor.
    pub fn root(&self) -> BorrowedFd<'_> {
        self.root.as_fd()
    }

    /// Forgets the directory kept from the last call (after something below it was removed
    /// or replaced).
    pub fn forget(&mut self) {
        self.last = None;
    }

    /// Opens directory `rel` (relative, checked by [`check_relative`]). Missing components are
    /// made with `create`'s mode when it is given; one that is not a real directory is an
    /// error.
    pub fn dir(&mut self, rel: &Path, create: Option<u32>) -> io::Result<BorrowedFd<'_>> {
        let rel = check_relative(rel)?;
        if rel.as_os_str().is_empty() {
            return Ok(self.root.as_fd());
        }
        let hit = self.last.as_ref().is_some_and(|(p, _)| *p == rel);
        if !hit {
            let mut cur: Option<OwnedFd> = None;
            for c in rel.iter() {
                let parent = cur.as_ref().map_or(self.root.as_fd(), |f| f.as_fd());
                let next = match (
                    rustix::fs::openat(parent, c, DIR_FLAGS, Mode::empty()),
                    create,
                ) {
                    (Ok(fd), _) => fd,
                    (Err(Errno::NOENT), Some(mode)) => {
                        match rustix::fs::mkdirat(parent, c, Mode::from_raw_mode(mode)) {
                            Ok(()) | Err(Errno::EXIST) => {}
                            Err(e) => return Err(crate::ctx(e, "making directory", c)),
                        }
                        open_dir_at(parent, c)?
                    }
                    (Err(e), _) => return Err(dir_error(e, c)),
                };
                cur = Some(next);
            }
            let fd = cur.ok_or_else(|| io::Error::other("empty path"))?;
            self.last = Some((rel, fd));
        }
        Ok(self
            .last
            .as_ref()
            .map_or(self.root.as_fd(), |(_, f)| f.as_fd()))
    }

    /// The directory that holds `rel`, and `rel`'s last component.
    pub fn parent<'a>(
        &mut self,
        rel: &'a Path,
        create: Option<u32>,
    ) -> io::Result<(BorrowedFd<'_>, &'a OsStr)> {
        let name = rel.file_name().ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("{:?} names no entry", rel.display().to_string()),
            )
        })?;
        let parent = rel.parent().unwrap_or(Path::new(""));
        Ok((self.dir(parent, create)?, name))
    }
}

/// Opens directory `rel` below `root` as a path descriptor, with no symbolic link (or magic
/// link) anywhere on the way and never above `root`.
pub fn open_dir_beneath(root: BorrowedFd<'_>, rel: &Path) -> io::Result<OwnedFd> {
    let rel = check_relative(rel)?;
    rustix::fs::openat2(
        root,
        &rel,
        OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
        rustix::fs::ResolveFlags::BENEATH
            | rustix::fs::ResolveFlags::NO_SYMLINKS
            | rustix::fs::ResolveFlags::NO_MAGICLINKS,
    )
    .map_err(|e| crate::ctx(e, "opening directory", &rel))
}

/// How [`open_file`] treats symbolic links on the way.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Links {
    /// Any link is an error.
    Refuse,
    /// Links are resolved as if the root were `/`: they can never lead outside it.
    InsideRoot,
}

/// Opens regular file `rel` below `root` for reading, with `RESOLVE_BENEATH` (or
/// `RESOLVE_IN_ROOT`) and no magic links. Anything but a regular file (a FIFO, a device, a
/// directory) is refused before it is read, so nothing blocks or reads a device.
pub fn open_file(root: BorrowedFd<'_>, rel: &Path, links: Links) -> io::Result<std::fs::File> {
    let rel = check_relative(rel)?;
    let resolve = match links {
        Links::Refuse => {
            rustix::fs::ResolveFlags::BENEATH
                | rustix::fs::ResolveFlags::NO_SYMLINKS
                | rustix::fs::ResolveFlags::NO_MAGICLINKS
        }
        Links::InsideRoot => {
            rustix::fs::ResolveFlags::IN_ROOT | rustix::fs::ResolveFlags::NO_MAGICLINKS
        }
    };
    let mut flags = OFlags::RDONLY | OFlags::NONBLOCK | OFlags::NOCTTY | OFlags::CLOEXEC;
    if links == Links::Refuse {
        flags |= OFlags::NOFOLLOW;
    }
    let fd =
        rustix::fs::openat2(root, &rel, flags, Mode::empty(), resolve).map_err(|e| match e {
            Errno::LOOP | Errno::XDEV => io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "{:?} goes through a symbolic link, which is not followed here",
                    rel.display().to_string()
                ),
            ),
            e => crate::ctx(e, "opening", &rel),
        })?;
    let st = rustix::fs::fstat(&fd).map_err(|e| crate::ctx(e, "stat", &rel))?;
    if rustix::fs::FileType::from_raw_mode(st.st_mode) != rustix::fs::FileType::RegularFile {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{:?} is not a regular file", rel.display().to_string()),
        ));
    }
    Ok(std::fs::File::from(fd))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refuses_links_and_climbing() {
        let d = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(d.path().join("a/b")).unwrap();
        std::os::unix::fs::symlink("/etc", d.path().join("a/link")).unwrap();
        let mut t = Beneath::open(d.path()).unwrap();
        assert!(t.dir(Path::new("a/b"), None).is_ok());
        let e = t.dir(Path::new("a/link"), None).unwrap_err();
        assert!(e.to_string().contains("never followed"), "{e}");
        assert!(t.dir(Path::new("a/link/x"), Some(0o755)).is_err());
        assert!(!Path::new("/etc/x").exists());
        assert!(t.dir(Path::new("../x"), Some(0o755)).is_err());
        assert!(t.dir(Path::new("/tmp"), None).is_err());
        t.dir(Path::new("new/deeper"), Some(0o700)).unwrap();
        assert!(d.path().join("new/deeper").is_dir());
        let (_, name) = t.parent(Path::new("new/deeper/file"), None).unwrap();
        assert_eq!(name, "file");
    }
}
