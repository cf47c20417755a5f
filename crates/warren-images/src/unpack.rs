//! Careful tar extraction into a layer directory.
//!
//! Every entry's path is checked before anything is written: no absolute paths, no `..`, no
//! writing through a symbolic link (each parent must be a real directory of the layer), no
//! relative symbolic link that climbs out of the layer, no hard link to something outside it.
//! OCI whiteouts become overlayfs ones: `.wh.NAME` a 0/0 character device `NAME`,
//! `.wh..wh..opq` the `trusted.overlay.opaque` attribute on its directory. Ownership, modes,
//! times, device nodes and extended attributes (PAX `SCHILY.xattr.*`) are kept.

use std::fs;
use std::io::{self, Read};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Component, Path, PathBuf};

use crate::ImageError;

/// Limits on what one archive may unpack to.
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

/// Makes sure every parent of `rel` is a real directory under `root` (creating missing ones),
/// so that nothing is ever written through a symbolic link.
fn parents(root: &Path, rel: &Path, create: bool) -> Result<(), ImageError> {
    let mut p = root.to_path_buf();
    let n = rel.components().count();
    for c in rel.components().take(n.saturating_sub(1)) {
        p.push(c);
        match fs::symlink_metadata(&p) {
            Ok(md) if md.is_dir() => {}
            Ok(_) => {
                return Err(bad(
                    rel,
                    format!(
                        "goes through {:?}, which is not a directory (a symbolic link cannot be followed while unpacking)",
                        p.strip_prefix(root).unwrap_or(&p).display().to_string()
                    ),
                ));
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound && create => {
                fs::create_dir(&p)
                    .map_err(|e| ImageError::io(format!("creating {}", p.display()), e))?;
            }
            Err(e) => return Err(ImageError::io(format!("checking {}", p.display()), e)),
        }
    }
    Ok(())
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

/// Removes whatever is at `p` (a later entry replaces an earlier one).
fn clear(p: &Path, keep_dir: bool) -> Result<(), ImageError> {
    match fs::symlink_metadata(p) {
        Ok(md) if md.is_dir() => {
            if keep_dir {
                return Ok(());
            }
            fs::remove_dir_all(p)
        }
        Ok(_) => fs::remove_file(p),
        Err(_) => return Ok(()),
    }
    .map_err(|e| ImageError::io(format!("replacing {}", p.display()), e))
}

fn mknod(
    p: &Path,
    kind: rustix::fs::FileType,
    mode: u32,
    major: u32,
    minor: u32,
) -> io::Result<()> {
    rustix::fs::mknodat(
        rustix::fs::CWD,
        p,
        kind,
        rustix::fs::Mode::from_raw_mode(mode),
        rustix::fs::makedev(major, minor),
    )?;
    Ok(())
}

/// Unpacks the tar stream `r` into `root` (an existing directory).
pub fn unpack(
    r: impl Read,
    root: &Path,
    mode: Mode,
    limits: Limits,
) -> Result<Unpacked, ImageError> {
    let mut ar = tar::Archive::new(r);
    let mut out = Unpacked::default();
    let mut dirs: Vec<(PathBuf, u32, i64)> = Vec::new();
    let entries = ar
        .entries()
        .map_err(|e| ImageError::Invalid(format!("not a readable tar archive: {e}")))?;
    for entry in entries {
        let mut entry = entry.map_err(|e| {
            ImageError::Invalid(format!("the tar archive is corrupt or truncated: {e}"))
        })?;
        out.entries += 1;
        if out.entries > limits.max_entries {
            return Err(ImageError::TooLarge(format!(
                "the archive has more than {} entries",
                limits.max_entries
            )));
        }
        let raw = entry
            .path()
            .map_err(|e| ImageError::Invalid(format!("tar entry with an unreadable path: {e}")))?
            .into_owned();
        let rel = clean(&raw)?;
        if rel.as_os_str().is_empty() {
            continue; // the archive's root directory
        }
        let kind = entry.header().entry_type();
        let name = rel
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        parents(root, &rel, true)?;
        let dest = root.join(&rel);

        if let Some(hidden) = name.strip_prefix(".wh.") {
            if !mode.layer {
                continue;
            }
            out.whiteouts += 1;
            if hidden == ".wh..opq" {
                let dir = dest.parent().unwrap_or(root);
                rustix::fs::lsetxattr(
                    dir,
                    "trusted.overlay.opaque",
                    b"y",
                    rustix::fs::XattrFlags::empty(),
                )
                .map_err(|e| {
                    ImageError::io(format!("marking {} opaque", dir.display()), e.into())
                })?;
            } else {
                if hidden.is_empty() || hidden.contains('/') {
                    return Err(bad(&raw, "is a malformed whiteout"));
                }
                let target = dest.with_file_name(hidden);
                clear(&target, false)?;
                mknod(&target, rustix::fs::FileType::CharacterDevice, 0, 0, 0)
                    .map_err(|e| ImageError::io(format!("whiteout {}", target.display()), e))?;
            }
            continue;
        }

        let h = entry.header();
        let perm = h.mode().unwrap_or(0o644) & 0o7777;
        let uid = h.uid().unwrap_or(0) as u32;
        let gid = h.gid().unwrap_or(0) as u32;
        let mtime = h.mtime().unwrap_or(0) as i64;
        match kind {
            tar::EntryType::Regular | tar::EntryType::Continuous => {
                let size = h.size().unwrap_or(0);
                if out.bytes + size > limits.max_bytes {
                    return Err(ImageError::TooLarge(format!(
                        "the archive unpacks to more than {} bytes",
                        limits.max_bytes
                    )));
                }
                clear(&dest, false)?;
                let mut f = fs::OpenOptions::new()
                    .write(true)
                    .create_new(true)
                    .mode(0o600)
                    .open(&dest)
                    .map_err(|e| ImageError::io(format!("creating {}", dest.display()), e))?;
                let n = io::copy(&mut entry, &mut f).map_err(|e| {
                    if e.kind() == io::ErrorKind::UnexpectedEof
                        || e.kind() == io::ErrorKind::InvalidData
                    {
                        ImageError::Invalid(format!(
                            "the tar archive is truncated or corrupt in {:?}: {e}",
                            raw.display().to_string()
                        ))
                    } else {
                        ImageError::io(format!("writing {}", dest.display()), e)
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
                clear(&dest, true)?;
                if !dest.is_dir() {
                    fs::create_dir(&dest)
                        .map_err(|e| ImageError::io(format!("creating {}", dest.display()), e))?;
                }
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
                clear(&dest, false)?;
                std::os::unix::fs::symlink(&target, &dest)
                    .map_err(|e| ImageError::io(format!("creating {}", dest.display()), e))?;
            }
            tar::EntryType::Link => {
                let target = entry
                    .link_name()
                    .ok()
                    .flatten()
                    .ok_or_else(|| bad(&raw, "is a hard link without a target"))?
                    .into_owned();
                let trel = clean(&target).map_err(|_| {
                    bad(
                        &raw,
                        format!(
                            "is a hard link to {:?}, outside the layer",
                            target.display().to_string()
                        ),
                    )
                })?;
                parents(root, &trel, false)?;
                let src = root.join(&trel);
                match fs::symlink_metadata(&src) {
                    Ok(md) if !md.is_dir() => {}
                    _ => {
                        return Err(bad(
                            &raw,
                            format!(
                                "is a hard link to {:?}, which is not an earlier file of the archive",
                                target.display().to_string()
                            ),
                        ));
                    }
                }
                clear(&dest, false)?;
                fs::hard_link(&src, &dest)
                    .map_err(|e| ImageError::io(format!("linking {}", dest.display()), e))?;
                continue; // shares the inode: owner and mode are the target's
            }
            tar::EntryType::Char | tar::EntryType::Block | tar::EntryType::Fifo if mode.layer => {
                let (ft, major, minor) = match kind {
                    tar::EntryType::Char => (
                        rustix::fs::FileType::CharacterDevice,
                        h.device_major().ok().flatten().unwrap_or(0),
                        h.device_minor().ok().flatten().unwrap_or(0),
                    ),
                    tar::EntryType::Block => (
                        rustix::fs::FileType::BlockDevice,
                        h.device_major().ok().flatten().unwrap_or(0),
                        h.device_minor().ok().flatten().unwrap_or(0),
                    ),
                    _ => (rustix::fs::FileType::Fifo, 0, 0),
                };
                clear(&dest, false)?;
                mknod(&dest, ft, perm, major, minor)
                    .map_err(|e| ImageError::io(format!("creating {}", dest.display()), e))?;
            }
            tar::EntryType::Char | tar::EntryType::Block | tar::EntryType::Fifo => {
                return Err(bad(
                    &raw,
                    "is a device or fifo, which this archive kind cannot hold",
                ));
            }
            tar::EntryType::XGlobalHeader | tar::EntryType::XHeader => continue,
            other => {
                return Err(bad(
                    &raw,
                    format!("has an unsupported entry type {other:?}"),
                ));
            }
        }

        if !mode.layer {
            if kind == tar::EntryType::Regular {
                let _ = fs::set_permissions(&dest, fs::Permissions::from_mode(0o644));
            }
            continue;
        }
        std::os::unix::fs::lchown(&dest, Some(uid), Some(gid))
            .map_err(|e| ImageError::io(format!("setting the owner of {}", dest.display()), e))?;
        let is_link = kind == tar::EntryType::Symlink;
        if kind == tar::EntryType::Directory {
            dirs.push((dest.clone(), perm, mtime));
        } else if !is_link {
            fs::set_permissions(&dest, fs::Permissions::from_mode(perm)).map_err(|e| {
                ImageError::io(format!("setting the mode of {}", dest.display()), e)
            })?;
        }
        if let Ok(Some(exts)) = entry.pax_extensions() {
            for ext in exts.flatten() {
                let (Ok(key), value) = (ext.key(), ext.value_bytes()) else {
                    continue;
                };
                if let Some(attr) = key.strip_prefix("SCHILY.xattr.") {
                    rustix::fs::lsetxattr(&dest, attr, value, rustix::fs::XattrFlags::empty())
                        .map_err(|e| {
                            ImageError::io(
                                format!("setting {attr} on {}", dest.display()),
                                e.into(),
                            )
                        })?;
                }
            }
        }
        if kind != tar::EntryType::Directory {
            let t = filetime::FileTime::from_unix_time(mtime, 0);
            let _ = filetime::set_symlink_file_times(&dest, t, t);
        }
    }
    // Directories last: their modes may forbid writing into them, and writing changes mtimes.
    for (d, perm, mtime) in dirs.into_iter().rev() {
        fs::set_permissions(&d, fs::Permissions::from_mode(perm))
            .map_err(|e| ImageError::io(format!("setting the mode of {}", d.display()), e))?;
        let t = filetime::FileTime::from_unix_time(mtime, 0);
        let _ = filetime::set_file_times(&d, t, t);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

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
        let u = unpack(&t[..], d.path(), layer(), Limits::default()).unwrap();
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
            let r = unpack(&t[..], &inner, layer(), Limits::default());
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
        unpack(&t[..], d.path(), layer(), Limits::default()).unwrap();
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
        let r = unpack(&t[..3000], d.path(), layer(), Limits::default());
        assert!(matches!(r, Err(ImageError::Invalid(_))), "{r:?}");
        let d = tempfile::tempdir().unwrap();
        let r = unpack(
            &t[..],
            d.path(),
            layer(),
            Limits {
                max_bytes: 100,
                max_entries: 10,
            },
        );
        assert!(matches!(r, Err(ImageError::TooLarge(_))), "{r:?}");
        let r = unpack(
            &b"this is not a tar archive at all"[..],
            d.path(),
            layer(),
            Limits::default(),
        );
        assert!(r.is_err());
    }
}
