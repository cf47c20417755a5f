//! Careful tar extraction into a layer directory.
//!
//! Every entry's path is checked before anything is written: no absolute paths, no `..`, no
//! writing through a symbolic link (each parent must be a real directory of the layer), no
//! relative symbolic link that climbs out of the layer, no hard link to something outside it.
//! OCI whiteouts become overlayfs ones: `.wh.NAME` a 0/0 character device `NAME`,
//! `.wh..wh..opq` the `trusted.overlay.opaque` attribute on its directory. Ownership, modes,
//! times, device nodes and extended attributes (PAX `SCHILY.xattr.*`) are kept.

use std::collections::HashMap;
use std::ffi::OsStr;
use std::io::{self, Read};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::{Component, Path, PathBuf};

use rustix::fs::{AtFlags, FileType, Mode as FsMode, OFlags};
use rustix::io::Errno;
use warren_fs::Beneath;
use warren_fs::meta::{self, Meta};

use crate::ImageError;

/// Limits on what one import may unpack to, all its archives and layers together.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Most bytes of file content.
    pub max_bytes: u64,
    /// Most entries.
    pub max_entries: u64,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_bytes: 64 << 30,
            max_entries: 10_000_000,
        }
    }
}

/// What is left of an import's [`Limits`]: one budget is shared by every archive and layer of
/// an import, so that an image of many layers cannot multiply them.
#[derive(Debug, Clone, Copy)]
pub struct Budget {
    limits: Limits,
    bytes: u64,
    entries: u64,
}

impl Budget {
    /// A full budget.
    pub fn new(limits: Limits) -> Budget {
        Budget {
            limits,
            bytes: limits.max_bytes,
            entries: limits.max_entries,
        }
    }

    fn take_entry(&mut self) -> Result<(), ImageError> {
        self.entries = self.entries.checked_sub(1).ok_or_else(|| {
            ImageError::TooLarge(format!(
                "the image has more than {} entries in all",
                self.limits.max_entries
            ))
        })?;
        Ok(())
    }

    fn take_bytes(&mut self, n: u64) -> Result<(), ImageError> {
        self.bytes = self.bytes.checked_sub(n).ok_or_else(|| {
            ImageError::TooLarge(format!(
                "the image unpacks to more than {} bytes in all",
                self.limits.max_bytes
            ))
        })?;
        Ok(())
    }
}

/// What [`unpack`] wrote.
#[derive(Debug, Default, Clone, Copy)]
pub struct Unpacked {
    /// Entries written.
    pub entries: u64,
    /// Bytes of file content.
    pub bytes: u64,
    /// Whiteouts and opaque directories converted.
    pub whiteouts: u64,
}

/// How to treat entries.
#[derive(Debug, Clone, Copy)]
pub struct Mode {
    /// A layer of a root file system: keep owners, devices and attributes, convert whiteouts.
    /// Otherwise an archive of files to read (OCI layout, docker save): regular files,
    /// directories and symbolic links only, owned by the caller.
    pub layer: bool,
}

fn bad(path: &Path, why: impl std::fmt::Display) -> ImageError {
    ImageError::Invalid(format!("tar entry {:?}: {why}", path.display().to_string()))
}

/// The entry path made relative and checked: no root, no `..`.
fn clean(path: &Path) -> Result<PathBuf, ImageError> {
    let mut out = PathBuf::new();
    for c in path.components() {
        match c {
            Component::Normal(x) => out.push(x),
            Component::CurDir => {}
            Component::ParentDir => {
                return Err(bad(
                    path,
                    "contains `..`; a layer cannot write outside itself",
                ));
            }
            Component::RootDir | Component::Prefix(_) => {
                return Err(bad(
                    path,
                    "is an absolute path; layer archives hold relative paths",
                ));
            }
        }
    }
    Ok(out)
}

/// Maps an error from walking the layer: a path that goes through something that is not a
/// directory (a symbolic link included) is the archive's fault.
fn walk_err(rel: &Path, e: io::Error) -> ImageError {
    if e.kind() == io::ErrorKind::InvalidInput {
        bad(rel, format!("goes through a path that {e}"))
    } else {
        ImageError::io(format!("unpacking {}", rel.display()), e)
    }
}

/// Whether a relative symlink target, resolved from the link's directory, stays in the layer.
fn link_stays_inside(rel: &Path, target: &Path) -> bool {
    if target.is_absolute() {
        // Resolved against the sandbox's root, not the host's.
        return true;
    }
    let mut depth = rel.components().count() as i64 - 1;
    for c in target.components() {
        match c {
            Component::ParentDir => {
                depth -= 1;
                if depth < 0 {
                    return false;
                }
            }
            Component::Normal(_) => depth += 1,
            _ => {}
        }
    }
    true
}

/// Removes whatever is at `name` in `dir` (a later entry replaces an earlier one), unless it
/// is a directory and `keep_dir`. Returns whether a directory was removed.
fn clear(dir: BorrowedFd<'_>, name: &OsStr, keep_dir: bool) -> io::Result<bool> {
    match rustix::fs::statat(dir, name, AtFlags::SYMLINK_NOFOLLOW) {
        Ok(st) if FileType::from_raw_mode(st.st_mode) == FileType::Directory => {
            if keep_dir {
                return Ok(false);
            }
            warren_fs::remove_tree(dir, name)?;
            Ok(true)
        }
        Ok(_) => match rustix::fs::unlinkat(dir, name, AtFlags::empty()) {
            Ok(()) | Err(Errno::NOENT) => Ok(false),
            Err(e) => Err(e.into()),
        },
        Err(Errno::NOENT) => Ok(false),
        Err(e) => Err(e.into()),
    }
}

/// Mode, time, owner and attributes of a directory, set once the whole archive is written.
struct DirMeta {
    meta: Meta,
}

/// Unpacks the tar stream `r` into `root` (an existing directory), taking from `budget`.
///
/// Everything is done by descriptor: each entry's parent is opened component by component
/// from `root` without following links, the entry is made relative to that descriptor, and
/// its owner, mode, times and attributes are set through a descriptor of the entry itself
/// (see [`warren_fs::meta`]). Directories get their modes and times after the last entry,
/// found again the same way: a directory that a later entry replaced with a link is skipped,
/// never followed.
pub fn unpack(
    r: impl Read,
    root: &Path,
    mode: Mode,
    budget: &mut Budget,
) -> Result<Unpacked, ImageError> {
    let mut tree = Beneath::open(root)
        .map_err(|e| ImageError::io(format!("opening {}", root.display()), e))?;
    let mut ar = tar::Archive::new(r);
    let mut out = Unpacked::default();
    let mut dirs: HashMap<PathBuf, DirMeta> = HashMap::new();
    let entries = ar
        .entries()
        .map_err(|e| ImageError::Invalid(format!("not a readable tar archive: {e}")))?;
    for entry in entries {
        let mut entry = entry.map_err(|e| {
            ImageError::Invalid(format!("the tar archive is corrupt or truncated: {e}"))
        })?;
        budget.take_entry()?;
        out.entries += 1;
        let raw = entry
            .path()
            .map_err(|e| ImageError::Invalid(format!("tar entry with an unreadable path: {e}")))?
            .into_owned();
        let rel = clean(&raw)?;
        if rel.as_os_str().is_empty() {
            continue; // the archive's root directory
        }
        // Directories the archive does not list are made on the way (mode 0755); they get the
        // epoch as their time at the end, so that when they were unpacked does not change the
        // layer. Each is registered once: the walk up stops at the first one known.
        for a in rel.ancestors().skip(1) {
            if a.as_os_str().is_empty() || dirs.contains_key(a) {
                break;
            }
            dirs.insert(
                a.to_path_buf(),
                DirMeta {
                    meta: Meta {
                        mtime: Some(0),
                        ..Meta::default()
                    },
                },
            );
        }
        let kind = entry.header().entry_type();
        if matches!(
            kind,
            tar::EntryType::XGlobalHeader | tar::EntryType::XHeader
        ) {
            continue;
        }
        let name = rel
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();

        if let Some(hidden) = name.strip_prefix(".wh.") {
            if !mode.layer {
                continue;
            }
            out.whiteouts += 1;
            let (parent, _) = tree
                .parent(&rel, Some(0o755))
                .map_err(|e| walk_err(&rel, e))?;
            if hidden == ".wh..opq" {
                rustix::fs::fsetxattr(
                    parent,
                    "trusted.overlay.opaque",
                    b"y",
                    rustix::fs::XattrFlags::empty(),
                )
                .map_err(|e| {
                    ImageError::io(format!("marking {} opaque", raw.display()), e.into())
                })?;
            } else {
                if hidden.is_empty() || hidden.contains('/') {
                    return Err(bad(&raw, "is a malformed whiteout"));
                }
                let parent = parent
                    .try_clone_to_owned()
                    .map_err(|e| ImageError::io("unpacking", e))?;
                let target = OsStr::new(hidden);
                if clear(parent.as_fd(), target, false)
                    .map_err(|e| ImageError::io(format!("whiteout {}", raw.display()), e))?
                {
                    tree.forget();
                }
                rustix::fs::mknodat(
                    &parent,
                    target,
                    FileType::CharacterDevice,
                    FsMode::empty(),
                    0,
                )
                .map_err(|e| ImageError::io(format!("whiteout {}", raw.display()), e.into()))?;
            }
            continue;
        }

        let mut xattrs = Vec::new();
        if mode.layer
            && let Ok(Some(exts)) = entry.pax_extensions()
        {
            for ext in exts.flatten() {
                if let (Ok(key), value) = (ext.key(), ext.value_bytes())
                    && let Some(attr) = key.strip_prefix("SCHILY.xattr.")
                {
                    xattrs.push((attr.to_string(), value.to_vec()));
                }
            }
        }
        let h = entry.header();
        let perm = h.mode().unwrap_or(0o644) & 0o7777;
        let uid = h.uid().unwrap_or(0) as u32;
        let gid = h.gid().unwrap_or(0) as u32;
        let mtime = h.mtime().unwrap_or(0) as i64;
        let meta = if mode.layer {
            Meta {
                owner: Some((uid, gid)),
                mode: Some(perm),
                mtime: Some(mtime),
                xattrs,
            }
        } else {
            Meta {
                mode: (kind == tar::EntryType::Regular).then_some(0o644),
                ..Meta::default()
            }
        };
        let fname = rel.file_name().unwrap_or_default().to_os_string();
        // The entry's parent, held as our own descriptor while the entry is made.
        let parent: OwnedFd = tree
            .parent(&rel, Some(0o755))
            .and_then(|(p, _)| p.try_clone_to_owned())
            .map_err(|e| walk_err(&rel, e))?;
        let p = parent.as_fd();
        let made = |e: Errno| ImageError::io(format!("creating {}", raw.display()), e.into());
        let replace = |keep_dir: bool, tree: &mut Beneath| -> Result<(), ImageError> {
            if clear(p, &fname, keep_dir)
                .map_err(|e| ImageError::io(format!("replacing {}", raw.display()), e))?
            {
                tree.forget();
            }
            Ok(())
        };
        match kind {
            tar::EntryType::Regular | tar::EntryType::Continuous => {
                let size = h.size().unwrap_or(0);
                budget.take_bytes(size)?;
                replace(false, &mut tree)?;
                let fd = rustix::fs::openat(
                    p,
                    &fname,
                    OFlags::WRONLY
                        | OFlags::CREATE
                        | OFlags::EXCL
                        | OFlags::NOFOLLOW
                        | OFlags::CLOEXEC,
                    FsMode::from_raw_mode(0o600),
                )
                .map_err(made)?;
                let mut f = std::fs::File::from(fd);
                let n = io::copy(&mut entry, &mut f).map_err(|e| {
                    if e.kind() == io::ErrorKind::UnexpectedEof
                        || e.kind() == io::ErrorKind::InvalidData
                    {
                        ImageError::Invalid(format!(
                            "the tar archive is truncated or corrupt in {:?}: {e}",
                            raw.display().to_string()
                        ))
                    } else {
                        ImageError::io(format!("writing {}", raw.display()), e)
                    }
                })?;
                if n != size {
                    return Err(ImageError::Invalid(format!(
                        "the tar archive is truncated: {:?} holds {n} of {size} bytes",
                        raw.display().to_string()
                    )));
                }
                out.bytes += n;
            }
            tar::EntryType::Directory => {
                replace(true, &mut tree)?;
                match rustix::fs::mkdirat(p, &fname, FsMode::from_raw_mode(0o700)) {
                    Ok(()) | Err(Errno::EXIST) => {}
                    Err(e) => return Err(made(e)),
                }
                // A later entry for the same directory wins.
                dirs.insert(rel.clone(), DirMeta { meta });
                continue;
            }
            tar::EntryType::Symlink => {
                let target = entry
                    .link_name()
                    .ok()
                    .flatten()
                    .ok_or_else(|| bad(&raw, "is a symbolic link without a target"))?
                    .into_owned();
                if !link_stays_inside(&rel, &target) {
                    return Err(bad(
                        &raw,
                        format!(
                            "is a symbolic link to {:?}, outside the layer",
                            target.display().to_string()
                        ),
                    ));
                }
                replace(false, &mut tree)?;
                rustix::fs::symlinkat(&target, p, &fname).map_err(made)?;
            }
            tar::EntryType::Link => {
                let target = entry
                    .link_name()
                    .ok()
                    .flatten()
                    .ok_or_else(|| bad(&raw, "is a hard link without a target"))?
                    .into_owned();
                let outside = || {
                    bad(
                        &raw,
                        format!(
                            "is a hard link to {:?}, which is not an earlier file of the archive",
                            target.display().to_string()
                        ),
                    )
                };
                let trel = clean(&target).map_err(|_| outside())?;
                let (tdir, tname) = tree.parent(&trel, None).map_err(|_| outside())?;
                let tdir = tdir
                    .try_clone_to_owned()
                    .map_err(|e| ImageError::io("unpacking", e))?;
                match rustix::fs::statat(&tdir, tname, AtFlags::SYMLINK_NOFOLLOW) {
                    Ok(st) if FileType::from_raw_mode(st.st_mode) != FileType::Directory => {}
                    _ => return Err(outside()),
                }
                if trel == rel {
                    continue; // a link to itself: the file is already there
                }
                replace(false, &mut tree)?;
                // Without AT_SYMLINK_FOLLOW: a link to a symbolic link links the link itself.
                rustix::fs::linkat(&tdir, tname, p, &fname, AtFlags::empty()).map_err(made)?;
                continue; // shares the inode: owner and mode are the target's
            }
            tar::EntryType::Char | tar::EntryType::Block | tar::EntryType::Fifo if mode.layer => {
                let (ft, major, minor) = match kind {
                    tar::EntryType::Char => (
                        FileType::CharacterDevice,
                        h.device_major().ok().flatten().unwrap_or(0),
                        h.device_minor().ok().flatten().unwrap_or(0),
                    ),
                    tar::EntryType::Block => (
                        FileType::BlockDevice,
                        h.device_major().ok().flatten().unwrap_or(0),
                        h.device_minor().ok().flatten().unwrap_or(0),
                    ),
                    _ => (FileType::Fifo, 0, 0),
                };
                replace(false, &mut tree)?;
                rustix::fs::mknodat(
                    p,
                    &fname,
                    ft,
                    FsMode::from_raw_mode(0o600),
                    rustix::fs::makedev(major, minor),
                )
                .map_err(made)?;
            }
            tar::EntryType::Char | tar::EntryType::Block | tar::EntryType::Fifo => {
                return Err(bad(
                    &raw,
                    "is a device or fifo, which this archive kind cannot hold",
                ));
            }
            other => {
                return Err(bad(
                    &raw,
                    format!("has an unsupported entry type {other:?}"),
                ));
            }
        }
        meta::apply(p, &fname, &meta)
            .map_err(|e| ImageError::io(format!("setting attributes of {}", raw.display()), e))?;
    }
    // Directories last: their modes may forbid writing into them, and writing changes mtimes.
    // Each is found again from the root without following links; one that a later entry
    // replaced by something else is skipped.
    for (rel, d) in dirs {
        let Ok((parent, name)) = tree.parent(&rel, None) else {
            continue;
        };
        let parent = parent
            .try_clone_to_owned()
            .map_err(|e| ImageError::io("unpacking", e))?;
        match rustix::fs::statat(&parent, name, AtFlags::SYMLINK_NOFOLLOW) {
            Ok(st) if FileType::from_raw_mode(st.st_mode) == FileType::Directory => {}
            _ => continue,
        }
        meta::apply(parent.as_fd(), name, &d.meta)
            .map_err(|e| ImageError::io(format!("setting the mode of {}", rel.display()), e))?;
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;

    fn tar_of(build: impl FnOnce(&mut tar::Builder<Vec<u8>>)) -> Vec<u8> {
        let mut b = tar::Builder::new(Vec::new());
        build(&mut b);
        b.into_inner().unwrap()
    }

    fn file(b: &mut tar::Builder<Vec<u8>>, path: &str, data: &[u8]) {
        let mut h = tar::Header::new_gnu();
        h.set_size(data.len() as u64);
        h.set_mode(0o644);
        h.set_entry_type(tar::EntryType::Regular);
        b.append_data(&mut h, path, data).unwrap();
    }

    fn raw_path(
        b: &mut tar::Builder<Vec<u8>>,
        path: &str,
        kind: tar::EntryType,
        link: Option<&str>,
    ) {
        // Builder refuses `..` in paths: write the name field directly.
        let mut h = tar::Header::new_old();
        h.as_old_mut().name[..path.len()].copy_from_slice(path.as_bytes());
        if let Some(l) = link {
            h.as_old_mut().linkname[..l.len()].copy_from_slice(l.as_bytes());
        }
        h.set_size(0);
        h.set_mode(0o777);
        h.set_entry_type(kind);
        h.set_cksum();
        b.append(&h, io::empty()).unwrap();
    }

    fn layer() -> Mode {
        Mode { layer: true }
    }

    #[test]
    fn whiteouts_become_overlay_whiteouts() {
        let t = tar_of(|b| {
            file(b, "etc/keep", b"k");
            file(b, "etc/.wh.gone", b"");
            file(b, "var/.wh..wh..opq", b"");
        });
        let d = tempfile::tempdir().unwrap();
        let u = unpack(
            &t[..],
            d.path(),
            layer(),
            &mut Budget::new(Limits::default()),
        )
        .unwrap();
        assert_eq!(u.whiteouts, 2);
        use std::os::unix::fs::FileTypeExt;
        let md = fs::symlink_metadata(d.path().join("etc/gone")).unwrap();
        assert!(md.file_type().is_char_device());
        use std::os::unix::fs::MetadataExt;
        assert_eq!(md.rdev(), 0);
        let mut v = [0u8; 4];
        let n =
            rustix::fs::lgetxattr(d.path().join("var"), "trusted.overlay.opaque", &mut v).unwrap();
        assert_eq!(&v[..n], b"y");
        assert!(!d.path().join("etc/.wh.gone").exists());
    }

    #[test]
    fn escapes_are_refused() {
        let cases: Vec<(&str, Vec<u8>)> = vec![
            (
                "dotdot",
                tar_of(|b| raw_path(b, "../evil", tar::EntryType::Regular, None)),
            ),
            (
                "absolute",
                tar_of(|b| raw_path(b, "/etc/evil", tar::EntryType::Regular, None)),
            ),
            (
                "symlink out",
                tar_of(|b| raw_path(b, "a/link", tar::EntryType::Symlink, Some("../../../etc"))),
            ),
            (
                "through a symlink",
                tar_of(|b| {
                    raw_path(b, "link", tar::EntryType::Symlink, Some("/etc"));
                    file(b, "link/passwd", b"x");
                }),
            ),
            (
                "hard link out",
                tar_of(|b| raw_path(b, "h", tar::EntryType::Link, Some("../../etc/passwd"))),
            ),
        ];
        for (what, t) in cases {
            let d = tempfile::tempdir().unwrap();
            let inner = d.path().join("root");
            fs::create_dir(&inner).unwrap();
            let r = unpack(&t[..], &inner, layer(), &mut Budget::new(Limits::default()));
            assert!(matches!(r, Err(ImageError::Invalid(_))), "{what}: {r:?}");
            assert!(!d.path().join("evil").exists(), "{what} wrote outside");
        }
    }

    #[test]
    fn links_inside_are_kept() {
        let t = tar_of(|b| {
            file(b, "usr/bin/busybox", b"bb");
            raw_path(b, "bin", tar::EntryType::Symlink, Some("usr/bin"));
            raw_path(
                b,
                "usr/bin/sh",
                tar::EntryType::Symlink,
                Some("/usr/bin/busybox"),
            );
            raw_path(
                b,
                "usr/bin/ls",
                tar::EntryType::Link,
                Some("usr/bin/busybox"),
            );
        });
        let d = tempfile::tempdir().unwrap();
        unpack(
            &t[..],
            d.path(),
            layer(),
            &mut Budget::new(Limits::default()),
        )
        .unwrap();
        assert_eq!(
            fs::read_link(d.path().join("bin")).unwrap(),
            Path::new("usr/bin")
        );
        assert_eq!(fs::read(d.path().join("usr/bin/ls")).unwrap(), b"bb");
    }

    #[test]
    fn truncated_and_oversized_archives_are_refused() {
        let t = tar_of(|b| file(b, "big", &[1u8; 10000]));
        let d = tempfile::tempdir().unwrap();
        let r = unpack(
            &t[..3000],
            d.path(),
            layer(),
            &mut Budget::new(Limits::default()),
        );
        assert!(matches!(r, Err(ImageError::Invalid(_))), "{r:?}");
        let d = tempfile::tempdir().unwrap();
        let r = unpack(
            &t[..],
            d.path(),
            layer(),
            &mut Budget::new(Limits {
                max_bytes: 100,
                max_entries: 10,
            }),
        );
        assert!(matches!(r, Err(ImageError::TooLarge(_))), "{r:?}");
        let r = unpack(
            &b"this is not a tar archive at all"[..],
            d.path(),
            layer(),
            &mut Budget::new(Limits::default()),
        );
        assert!(r.is_err());
    }

    /// A header for `path` of `kind`, with mode `mode` and link name `link`.
    fn entry(
        b: &mut tar::Builder<Vec<u8>>,
        path: &str,
        kind: tar::EntryType,
        mode: u32,
        link: Option<&str>,
    ) {
        let mut h = tar::Header::new_gnu();
        h.set_entry_type(kind);
        h.set_mode(mode);
        h.set_size(0);
        h.set_mtime(1000);
        match link {
            Some(l) => b.append_link(&mut h, path, l).unwrap(),
            None => b.append_data(&mut h, path, io::empty()).unwrap(),
        }
    }

    /// A victim file outside the layer, and its mode and mtime.
    fn victim(d: &Path) -> (PathBuf, u32, i64) {
        use std::os::unix::fs::{MetadataExt, PermissionsExt};
        let v = d.join("victim");
        fs::write(&v, b"v").unwrap();
        fs::set_permissions(&v, fs::Permissions::from_mode(0o600)).unwrap();
        let md = fs::metadata(&v).unwrap();
        (v, md.mode() & 0o7777, md.mtime())
    }

    fn unchanged(v: &(PathBuf, u32, i64)) {
        use std::os::unix::fs::MetadataExt;
        let md = fs::metadata(&v.0).unwrap();
        assert_eq!(md.mode() & 0o7777, v.1, "the host file's mode changed");
        assert_eq!(md.mtime(), v.2, "the host file's time changed");
        assert_eq!(md.uid(), 0);
        assert_eq!(fs::read(&v.0).unwrap(), b"v");
    }

    /// The critical finding: a directory entry, then a symlink of the same name to a host
    /// file; the final pass over directories used to chmod (04777) and touch the host file.
    #[test]
    fn a_directory_replaced_by_a_link_never_changes_the_link_target() {
        let d = tempfile::tempdir().unwrap();
        let v = victim(d.path());
        let target = v.0.display().to_string();
        let t = tar_of(|b| {
            entry(b, "x", tar::EntryType::Directory, 0o4777, None);
            entry(b, "x", tar::EntryType::Symlink, 0o777, Some(&target));
            file(b, "hello", b"hi\n");
        });
        let root = d.path().join("root");
        fs::create_dir(&root).unwrap();
        unpack(&t[..], &root, layer(), &mut Budget::new(Limits::default())).unwrap();
        unchanged(&v);
        assert_eq!(fs::read_link(root.join("x")).unwrap(), v.0);
        assert_eq!(fs::read(root.join("hello")).unwrap(), b"hi\n");
    }

    /// Other ways an entry could reach through a link: attributes, owners and times on a
    /// link, a hard link to a link, a whiteout of a link, a later file through a link.
    #[test]
    fn no_entry_reaches_through_a_link() {
        let d = tempfile::tempdir().unwrap();
        let v = victim(d.path());
        let target = v.0.display().to_string();
        let dir_target = d.path().display().to_string();
        let mut b = tar::Builder::new(Vec::new());
        entry(&mut b, "l", tar::EntryType::Symlink, 0o777, Some(&target));
        // PAX attributes and an owner on the link itself.
        let mut h = tar::Header::new_gnu();
        h.set_entry_type(tar::EntryType::Symlink);
        h.set_uid(1234);
        h.set_mode(0o777);
        h.set_size(0);
        b.append_pax_extensions([("SCHILY.xattr.trusted.evil", &b"1"[..])])
            .unwrap();
        b.append_link(&mut h, "l2", &target).unwrap();
        // A hard link to the link: links the link, not the file.
        entry(&mut b, "h", tar::EntryType::Link, 0o777, Some("l"));
        // A whiteout named like a link to a directory outside.
        entry(
            &mut b,
            "dl",
            tar::EntryType::Symlink,
            0o777,
            Some(&dir_target),
        );
        file(&mut b, ".wh.dl", b"");
        let t = b.into_inner().unwrap();
        let root = d.path().join("root");
        fs::create_dir(&root).unwrap();
        unpack(&t[..], &root, layer(), &mut Budget::new(Limits::default())).unwrap();
        unchanged(&v);
        let mut buf = [0u8; 4];
        assert!(rustix::fs::getxattr(&v.0, "trusted.evil", &mut buf).is_err());
        assert!(fs::symlink_metadata(root.join("h")).unwrap().is_symlink());
        assert!(
            d.path().join("victim").exists(),
            "the whiteout removed the link only"
        );
        use std::os::unix::fs::FileTypeExt;
        assert!(
            fs::symlink_metadata(root.join("dl"))
                .unwrap()
                .file_type()
                .is_char_device()
        );
        // A file written through a link is refused.
        let t = tar_of(|b| {
            entry(b, "p", tar::EntryType::Symlink, 0o777, Some(&dir_target));
            file(b, "p/victim", b"overwritten");
        });
        let root2 = d.path().join("root2");
        fs::create_dir(&root2).unwrap();
        let r = unpack(&t[..], &root2, layer(), &mut Budget::new(Limits::default()));
        assert!(matches!(r, Err(ImageError::Invalid(_))), "{r:?}");
        unchanged(&v);
    }

    /// A later entry replaces an earlier one whatever their kinds.
    #[test]
    fn later_entries_replace_earlier_ones() {
        let t = tar_of(|b| {
            file(b, "a", b"file");
            entry(b, "a", tar::EntryType::Directory, 0o755, None);
            file(b, "a/inner", b"i");
            file(b, "a", b"file again");
            entry(b, "b", tar::EntryType::Directory, 0o700, None);
            entry(b, "b", tar::EntryType::Directory, 0o751, None);
        });
        let d = tempfile::tempdir().unwrap();
        unpack(
            &t[..],
            d.path(),
            layer(),
            &mut Budget::new(Limits::default()),
        )
        .unwrap();
        assert_eq!(fs::read(d.path().join("a")).unwrap(), b"file again");
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(
            fs::metadata(d.path().join("b"))
                .unwrap()
                .permissions()
                .mode()
                & 0o7777,
            0o751,
            "the last entry of a directory sets its mode"
        );
    }

    /// The limits are one budget for a whole import: two archives that each fit can together
    /// be too much.
    #[test]
    fn the_budget_is_shared_by_every_archive_of_an_import() {
        let t = tar_of(|b| file(b, "f", &[0u8; 600]));
        let mut budget = Budget::new(Limits {
            max_bytes: 1000,
            max_entries: 100,
        });
        let d = tempfile::tempdir().unwrap();
        unpack(&t[..], d.path(), layer(), &mut budget).unwrap();
        let d2 = tempfile::tempdir().unwrap();
        let r = unpack(&t[..], d2.path(), layer(), &mut budget);
        assert!(matches!(r, Err(ImageError::TooLarge(_))), "{r:?}");
        // A huge declared size is refused before anything is written.
        let mut h = tar::Header::new_gnu();
        h.set_entry_type(tar::EntryType::Regular);
        h.set_size(1 << 62);
        h.set_mode(0o644);
        h.set_path("huge").unwrap();
        h.set_cksum();
        let mut raw = h.as_bytes().to_vec();
        raw.extend_from_slice(&[0u8; 1024]);
        let r = unpack(
            &raw[..],
            d2.path(),
            layer(),
            &mut Budget::new(Limits::default()),
        );
        assert!(matches!(r, Err(ImageError::TooLarge(_))), "{r:?}");
    }
}
