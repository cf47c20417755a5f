//! Mounts: the pieces a sandbox's init uses to build its root file system.
//!
//! Paths may be relative: they resolve against the caller's working directory, which lets the
//! init mount an overlay with `lowerdir=l0,upperdir=upper,...` so that the mount options shown
//! in `/proc/self/mountinfo` inside the sandbox never name a host path.

use std::ffi::CString;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

/// Mount flags (the `MS_*` constants) this crate's callers use.
pub mod flags {
    /// Read-only.
    pub const RDONLY: u64 = libc::MS_RDONLY;
    /// No set-user-id or file capabilities.
    pub const NOSUID: u64 = libc::MS_NOSUID;
    /// No device files.
    pub const NODEV: u64 = libc::MS_NODEV;
    /// No execution.
    pub const NOEXEC: u64 = libc::MS_NOEXEC;
}

fn c(p: &Path) -> io::Result<CString> {
    CString::new(p.as_os_str().as_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "path contains a NUL byte"))
}

fn cs(s: &str) -> io::Result<CString> {
    CString::new(s)
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "string contains a NUL byte"))
}

fn raw_mount(
    source: Option<&CString>,
    target: &CString,
    fstype: Option<&CString>,
    flags: u64,
    data: Option<&CString>,
) -> io::Result<()> {
    let p = |o: Option<&CString>| o.map_or(std::ptr::null(), |s| s.as_ptr());
    // SAFETY: all pointers are NUL-terminated strings that outlive the call, or null where the
    // kernel accepts null.
    let r = unsafe { libc::mount(p(source), target.as_ptr(), p(fstype), flags, p(data).cast()) };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

fn with_target(e: io::Error, what: &str, target: &Path) -> io::Error {
    io::Error::new(e.kind(), format!("{what} {}: {e}", target.display()))
}

/// Makes every mount in this mount namespace private, so nothing done here propagates to the
/// host (and nothing from the host propagates in).
pub fn make_all_private() -> io::Result<()> {
    raw_mount(None, &cs("/")?, None, libc::MS_REC | libc::MS_PRIVATE, None)
        .map_err(|e| with_target(e, "making mounts private at", Path::new("/")))
}

/// Mounts a file system of `fstype` (e.g. `proc`, `tmpfs`) at `target`.
pub fn mount_fs(fstype: &str, target: &Path, flags: u64, data: Option<&str>) -> io::Result<()> {
    let data = data.map(cs).transpose()?;
    let t = cs(fstype)?;
    raw_mount(Some(&t), &c(target)?, Some(&t), flags, data.as_ref())
        .map_err(|e| with_target(e, &format!("mounting {fstype} at"), target))
}

/// Mounts an overlay at `target`: `lowers` top first, a writable `upper` and its `work` dir.
///
/// The overlay is `volatile`: it never syncs the upper file system (a sync of an ext4 upper
/// waits for a journal commit, on every unmount). A sandbox's writable layer does not outlive
/// a crash of the machine anyway, since the sandbox does not.
///
/// It is `nodev` and `nosuid`: a device node that an image carries (an imported layer may hold
/// any) opens nothing, and set-user-id bits grant nothing. The sandbox's `/dev` is a separate
/// mount; overlay whiteouts (0/0 devices) work regardless.
pub fn mount_overlay(target: &Path, lowers: &[&str], upper: &str, work: &str) -> io::Result<()> {
    let data = format!(
        "lowerdir={},upperdir={upper},workdir={work},volatile",
        lowers.join(":")
    );
    raw_mount(
        Some(&cs("overlay")?),
        &c(target)?,
        Some(&cs("overlay")?),
        libc::MS_NODEV | libc::MS_NOSUID,
        Some(&cs(&data)?),
    )
    .map_err(|e| with_target(e, "mounting overlay at", target))
}

/// Mounts a read-only overlay of `lowers` (top first, at least two) at `target`.
pub fn mount_overlay_readonly(target: &Path, lowers: &[&str]) -> io::Result<()> {
    let data = format!("lowerdir={}", lowers.join(":"));
    raw_mount(
        Some(&cs("overlay")?),
        &c(target)?,
        Some(&cs("overlay")?),
        libc::MS_RDONLY | libc::MS_NODEV | libc::MS_NOSUID,
        Some(&cs(&data)?),
    )
    .map_err(|e| with_target(e, "mounting a read-only overlay at", target))
}

/// Whether `path` is the root of a mount (its device differs from its parent's).
pub fn is_mount_root(path: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    match (std::fs::metadata(path), std::fs::metadata(path.join(".."))) {
        (Ok(a), Ok(b)) => a.dev() != b.dev() || a.ino() == b.ino(),
        _ => false,
    }
}

/// Bind-mounts `source` at `target` (recursively when `recursive`), then applies `flags`
/// (read-only, nosuid, nodev, noexec) to the new mount.
pub fn bind(source: &Path, target: &Path, recursive: bool, flags: u64) -> io::Result<()> {
    let t = c(target)?;
    let rec = if recursive { libc::MS_REC } else { 0 };
    raw_mount(Some(&c(source)?), &t, None, libc::MS_BIND | rec, None).map_err(|e| {
        io::Error::new(
            e.kind(),
            format!(
                "bind-mounting {} at {}: {e}",
                source.display(),
                target.display()
            ),
        )
    })?;
    if flags == 0 {
        return Ok(());
    }
    if recursive {
        // A remount changes only the top mount: submounts of the source (a /usr with a mount
        // below it) would stay writable. mount_setattr changes the whole tree.
        return set_attrs_recursive(target, flags);
    }
    remount_flags(target, flags)
}

/// A detached copy of the mount of the file or directory at `source` (not following a final
/// symbolic link), to attach elsewhere later with [`attach_tree`] — also after `pivot_root`,
/// when `source` is no longer reachable by path.
pub fn clone_tree(source: &Path) -> io::Result<std::os::fd::OwnedFd> {
    use rustix::mount::OpenTreeFlags;
    rustix::mount::open_tree(
        rustix::fs::CWD,
        source,
        OpenTreeFlags::OPEN_TREE_CLONE
            | OpenTreeFlags::OPEN_TREE_CLOEXEC
            | OpenTreeFlags::AT_SYMLINK_NOFOLLOW,
    )
    .map_err(|e| with_target(e.into(), "cloning the mount of", source))
}

/// Attaches a mount from [`clone_tree`] at `target` (following links in `target`, in the
/// caller's root), then applies `flags` (read-only, nosuid, nodev, noexec) to it.
pub fn attach_tree(tree: std::os::fd::OwnedFd, target: &Path, flags: u64) -> io::Result<()> {
    use rustix::mount::MoveMountFlags;
    rustix::mount::move_mount(
        &tree,
        "",
        rustix::fs::CWD,
        target,
        MoveMountFlags::MOVE_MOUNT_F_EMPTY_PATH,
    )
    .map_err(|e| with_target(e.into(), "attaching a mount at", target))?;
    if flags == 0 {
        return Ok(());
    }
    remount_flags(target, flags)
}

/// Applies `flags` (read-only, nosuid, nodev, noexec) to the mount at `target` and every
/// mount below it, with `mount_setattr(AT_RECURSIVE)`.
pub fn set_attrs_recursive(target: &Path, flags: u64) -> io::Result<()> {
    let mut set = 0u64;
    for (ms, attr) in [
        (libc::MS_RDONLY, libc::MOUNT_ATTR_RDONLY),
        (libc::MS_NOSUID, libc::MOUNT_ATTR_NOSUID),
        (libc::MS_NODEV, libc::MOUNT_ATTR_NODEV),
        (libc::MS_NOEXEC, libc::MOUNT_ATTR_NOEXEC),
    ] {
        if flags & ms != 0 {
            set |= attr;
        }
    }
    let attr = libc::mount_attr {
        attr_set: set,
        attr_clr: 0,
        propagation: 0,
        userns_fd: 0,
    };
    let t = c(target)?;
    // SAFETY: `t` is a NUL-terminated path and `attr` a properly sized mount_attr, both alive
    // for the call; the kernel only reads them.
    let r = unsafe {
        libc::syscall(
            libc::SYS_mount_setattr,
            libc::AT_FDCWD,
            t.as_ptr(),
            libc::AT_RECURSIVE as libc::c_uint,
            &attr as *const libc::mount_attr,
            std::mem::size_of::<libc::mount_attr>(),
        )
    };
    if r < 0 {
        return Err(with_target(
            io::Error::last_os_error(),
            "setting mount attributes (recursively) on",
            target,
        ));
    }
    Ok(())
}

/// Remounts an existing mount point with `flags` (e.g. making `/proc/sys` read-only: the
/// path is first bound onto itself so it is a mount point).
pub fn remount_readonly(target: &Path) -> io::Result<()> {
    bind(
        target,
        target,
        true,
        flags::RDONLY | flags::NOSUID | flags::NODEV,
    )
}

/// Sets `flags` (read-only, nosuid, nodev, noexec) on the mount at `target` (which must be
/// the root of a mount), leaving the mounts below it as they are.
pub fn remount_flags(target: &Path, flags: u64) -> io::Result<()> {
    raw_mount(
        None,
        &c(target)?,
        None,
        libc::MS_BIND | libc::MS_REMOUNT | flags,
        None,
    )
    .map_err(|e| with_target(e, "remounting", target))
}

/// Changes the options of the file system mounted at `target` (its superblock: every mount
/// of it sees them), with `flags` the mount's own flags to keep (a remount sets them anew).
pub fn reconfigure(target: &Path, flags: u64, data: &str) -> io::Result<()> {
    raw_mount(
        None,
        &c(target)?,
        None,
        libc::MS_REMOUNT | flags,
        Some(&cs(data)?),
    )
    .map_err(|e| with_target(e, &format!("setting {data} on"), target))
}

/// Makes a character device node.
pub fn mknod_char(path: &Path, mode: u32, major: u32, minor: u32) -> io::Result<()> {
    // SAFETY: path is a NUL-terminated string that outlives the call.
    let r = unsafe {
        libc::mknod(
            c(path)?.as_ptr(),
            libc::S_IFCHR | mode,
            libc::makedev(major, minor),
        )
    };
    if r < 0 {
        let e = io::Error::last_os_error();
        return Err(with_target(e, "making device", path));
    }
    Ok(())
}

/// Makes the current directory the root (`pivot_root(".", ".")`) and detaches the old root,
/// so nothing of the host's file system stays reachable.
pub fn pivot_root_here() -> io::Result<()> {
    rustix::process::pivot_root(".", ".")
        .map_err(|e| io::Error::new(io::Error::from(e).kind(), format!("pivot_root: {e}")))?;
    rustix::mount::unmount(".", rustix::mount::UnmountFlags::DETACH).map_err(|e| {
        io::Error::new(
            io::Error::from(e).kind(),
            format!("detaching the old root: {e}"),
        )
    })?;
    std::env::set_current_dir("/")
}

/// Unmounts `target` lazily (`MNT_DETACH`).
pub fn unmount_detach(target: &Path) -> io::Result<()> {
    rustix::mount::unmount(target, rustix::mount::UnmountFlags::DETACH)
        .map_err(|e| with_target(e.into(), "unmounting", target))
}

/// Sets the host name (in the caller's UTS namespace).
pub fn set_hostname(name: &str) -> io::Result<()> {
    Ok(rustix::system::sethostname(name.as_bytes())?)
}

/// Gives the calling thread a file-system context of its own (root, working directory), so
/// that it can change mount namespace and root without the rest of the process.
pub fn unshare_fs_for_thread() -> io::Result<()> {
    // SAFETY: CLONE_FS takes no memory; only this thread's fs context is copied.
    let r = unsafe { libc::unshare(libc::CLONE_FS) };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Gives the calling thread (after [`unshare_fs_for_thread`]) a private copy of its mount
/// namespace.
pub fn unshare_mount_namespace() -> io::Result<()> {
    // SAFETY: CLONE_NEWNS takes no memory; it copies the caller's mount namespace.
    let r = unsafe { libc::unshare(libc::CLONE_NEWNS) };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// The calling thread's mount namespace, as a descriptor (to come back to it).
pub fn own_mount_namespace() -> io::Result<std::os::fd::OwnedFd> {
    Ok(std::fs::File::open("/proc/thread-self/ns/mnt")?.into())
}

/// Moves the calling thread into mount namespace `ns` (its root and working directory become
/// the namespace's root).
pub fn enter_mount_namespace(ns: std::os::fd::BorrowedFd<'_>) -> io::Result<()> {
    use std::os::fd::AsRawFd;
    // SAFETY: setns takes a descriptor and a flag.
    let r = unsafe { libc::setns(ns.as_raw_fd(), libc::CLONE_NEWNS) };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Gives the calling process a new cgroup namespace rooted at its current cgroups.
pub fn unshare_cgroup_namespace() -> io::Result<()> {
    // SAFETY: CLONE_NEWCGROUP changes only how cgroup paths are shown to this process and
    // its children; it touches no memory.
    let r = unsafe { libc::unshare(libc::CLONE_NEWCGROUP) };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs `f` on a thread of its own with a private mount namespace (and file system
    /// context), so the test's mounts never reach the host's namespace and vanish with it.
    fn in_private_mount_ns(f: impl FnOnce() + Send + 'static) {
        std::thread::spawn(move || {
            // SAFETY: unshare takes flags and touches no memory; CLONE_FS makes the mount
            // namespace this thread's alone.
            let r = unsafe { libc::unshare(libc::CLONE_FS | libc::CLONE_NEWNS) };
            assert_eq!(r, 0, "unshare: {}", io::Error::last_os_error());
            make_all_private().unwrap();
            f();
        })
        .join()
        .unwrap();
    }

    #[test]
    fn read_only_binds_cover_submounts() {
        if !rustix::process::geteuid().is_root() {
            eprintln!("skipped: needs root (mounts)");
            return;
        }
        in_private_mount_ns(|| {
            let d = tempfile::tempdir().unwrap();
            let (src, dst) = (d.path().join("src"), d.path().join("dst"));
            std::fs::create_dir_all(src.join("sub")).unwrap();
            std::fs::create_dir(&dst).unwrap();
            mount_fs("tmpfs", &src.join("sub"), 0, Some("size=1m")).unwrap();
            bind(
                &src,
                &dst,
                true,
                flags::RDONLY | flags::NOSUID | flags::NODEV,
            )
            .unwrap();
            for p in [dst.join("top"), dst.join("sub/below")] {
                let e = std::fs::write(&p, b"x").unwrap_err();
                assert_eq!(e.raw_os_error(), Some(libc::EROFS), "{}: {e}", p.display());
            }
            // The source itself stays writable.
            std::fs::write(src.join("sub/below"), b"x").unwrap();
            unmount_detach(&dst).unwrap();
            unmount_detach(&src.join("sub")).unwrap();
        });
    }
}
