//! Removing a tree without recursion and with two descriptors open at most.
//!
//! `std::fs::remove_dir_all` recurses once per level and holds a descriptor per level, so a
//! tree a sandbox made 100,000 directories deep overflows the thread's stack or runs out of
//! descriptors. Here the walk keeps, per level, only the names still to visit (memory), and
//! climbs back with `..`, checking that it lands on the directory it came from (device and
//! inode), so a tree changed during the walk is an error, never a walk elsewhere.

use std::ffi::{OsStr, OsString};
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use rustix::fs::{AtFlags, FileType};
use rustix::io::Errno;

use crate::walk::open_dir_at;

/// One directory on the way down: its name in its parent, its identity, and the
/// subdirectories of it still to remove.
struct Level {
    name: OsString,
    id: (u64, u64),
    pending: Vec<OsString>,
}

fn identity(fd: BorrowedFd<'_>) -> io::Result<(u64, u64)> {
    let st = rustix::fs::fstat(fd)?;
    Ok((st.st_dev, st.st_ino))
}

/// Removes every non-directory entry of `dir` and returns the names of its subdirectories.
fn clear_files(dir: BorrowedFd<'_>) -> io::Result<Vec<OsString>> {
    let mut subdirs = Vec::new();
    let rd = rustix::fs::Dir::read_from(dir).map_err(|e| crate::ctx(e, "reading", "dir"))?;
    for entry in rd {
        let entry = entry.map_err(|e| crate::ctx(e, "reading", "dir"))?;
        let name = OsStr::from_bytes(entry.file_name().to_bytes());
        if name == "." || name == ".." {
            continue;
        }
        let is_dir = match entry.file_type() {
            FileType::Directory => true,
            FileType::Unknown => rustix::fs::statat(dir, name, AtFlags::SYMLINK_NOFOLLOW)
                .is_ok_and(|st| FileType::from_raw_mode(st.st_mode) == FileType::Directory),
            _ => false,
        };
        if is_dir {
            subdirs.push(name.to_os_string());
            continue;
        }
        match rustix::fs::unlinkat(dir, name, AtFlags::empty()) {
            Ok(()) | Err(Errno::NOENT) => {}
            Err(Errno::ISDIR) => subdirs.push(name.to_os_string()),
            Err(e) => return Err(crate::ctx(e, "removing", name)),
        }
    }
    Ok(subdirs)
}

/// Removes `name` in `parent` and, if it is a directory, everything below it. A symbolic link
/// is removed, never followed. A missing entry is not an error.
pub fn remove_tree(parent: BorrowedFd<'_>, name: &OsStr) -> io::Result<()> {
    match rustix::fs::unlinkat(parent, name, AtFlags::empty()) {
        Ok(()) | Err(Errno::NOENT) => return Ok(()),
        Err(Errno::ISDIR) | Err(Errno::PERM) => {}
        Err(e) => return Err(crate::ctx(e, "removing", name)),
    }
    let top = open_dir_at(parent, name)?;
    let mut stack = vec![Level {
        name: name.to_os_string(),
        id: identity(top.as_fd())?,
        pending: clear_files(top.as_fd())?,
    }];
    let mut cur: OwnedFd = top;
    loop {
        let Some(level) = stack.last_mut() else {
            return Ok(());
        };
        if let Some(sub) = level.pending.pop() {
            let next = match open_dir_at(cur.as_fd(), &sub) {
                Ok(fd) => fd,
                // Gone or replaced meanwhile: nothing of ours to remove there.
                Err(_) => {
                    match rustix::fs::unlinkat(cur.as_fd(), &sub, AtFlags::empty()) {
                        Ok(()) | Err(Errno::NOENT) => {}
                        Err(e) => return Err(crate::ctx(e, "removing", &sub)),
                    }
                    continue;
                }
            };
            stack.push(Level {
                name: sub,
                id: identity(next.as_fd())?,
                pending: clear_files(next.as_fd())?,
            });
            cur = next;
            continue;
        }
        // `cur` is empty now: climb to its parent and remove it there.
        let done = stack.pop().expect("a level was just looked at");
        let up = match stack.last() {
            None => {
                drop(cur);
                return match rustix::fs::unlinkat(parent, &done.name, AtFlags::REMOVEDIR) {
                    Ok(()) | Err(Errno::NOENT) => Ok(()),
                    Err(e) => Err(crate::ctx(e, "removing directory", &done.name)),
                };
            }
            Some(up) => up,
        };
        let parent_fd = open_dir_at(cur.as_fd(), OsStr::new(".."))?;
        if identity(parent_fd.as_fd())? != up.id {
            return Err(io::Error::other(format!(
                "the tree changed while it was being removed ({:?} moved)",
                done.name
            )));
        }
        match rustix::fs::unlinkat(parent_fd.as_fd(), &done.name, AtFlags::REMOVEDIR) {
            Ok(()) | Err(Errno::NOENT) => {}
            // Refilled meanwhile: visit it again.
            Err(Errno::NOTEMPTY) => stack.last_mut().expect("checked").pending.push(done.name),
            Err(e) => return Err(crate::ctx(e, "removing directory", &done.name)),
        }
        cur = parent_fd;
    }
}

/// Removes the tree at `path`, a path the caller trusts up to its last component (which is
/// removed, not followed, if it is a link).
pub fn remove_path(path: &Path) -> io::Result<()> {
    let name = path.file_name().ok_or_else(|| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{} names no entry to remove", path.display()),
        )
    })?;
    let parent = path.parent().filter(|p| !p.as_os_str().is_empty());
    let dir = rustix::fs::open(
        parent.unwrap_or(Path::new(".")),
        rustix::fs::OFlags::RDONLY | rustix::fs::OFlags::DIRECTORY | rustix::fs::OFlags::CLOEXEC,
        rustix::fs::Mode::empty(),
    );
    match dir {
        Ok(d) => remove_tree(d.as_fd(), name),
        Err(Errno::NOENT) => Ok(()),
        Err(e) => Err(crate::ctx(e, "opening", parent)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn removes_deep_and_wide_trees_without_following_links() {
        let d = tempfile::tempdir().unwrap();
        let outside = d.path().join("outside");
        std::fs::create_dir(&outside).unwrap();
        std::fs::write(outside.join("keep"), b"k").unwrap();
        let top = d.path().join("top");
        // Deep: 5,000 levels made relative to a descriptor (paths would exceed PATH_MAX).
        std::fs::create_dir(&top).unwrap();
        let mut cur = rustix::fs::open(
            &top,
            rustix::fs::OFlags::RDONLY | rustix::fs::OFlags::DIRECTORY,
            rustix::fs::Mode::empty(),
        )
        .unwrap();
        for _ in 0..5000 {
            rustix::fs::mkdirat(&cur, "d", rustix::fs::Mode::from_raw_mode(0o755)).unwrap();
            cur = open_dir_at(cur.as_fd(), OsStr::new("d")).unwrap();
        }
        rustix::fs::symlinkat(&outside, &cur, "link").unwrap();
        drop(cur);
        // Wide: many siblings with files.
        for i in 0..200 {
            let w = top.join(format!("w{i}"));
            std::fs::create_dir(&w).unwrap();
            std::fs::write(w.join("f"), b"x").unwrap();
        }
        std::os::unix::fs::symlink(&outside, top.join("out")).unwrap();
        remove_path(&top).unwrap();
        assert!(!top.exists());
        assert!(outside.join("keep").exists(), "links were not followed");
        remove_path(&top).unwrap(); // missing is fine
    }
}
