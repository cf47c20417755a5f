//! Directories as tar streams: what `import_image` and a build's copy step upload.

use std::io::{self, Write};
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::path::Path;

use bytes::Bytes;

/// Writes into a channel in chunks: the tar of a directory, made on a thread, streamed out.
struct ChanWriter {
    tx: tokio::sync::mpsc::Sender<io::Result<Bytes>>,
    buf: Vec<u8>,
}

impl Write for ChanWriter {
    fn write(&mut self, data: &[u8]) -> io::Result<usize> {
        self.buf.extend_from_slice(data);
        if self.buf.len() >= 256 * 1024 {
            self.flush()?;
        }
        Ok(data.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        if !self.buf.is_empty() {
            let chunk = Bytes::from(std::mem::take(&mut self.buf));
            self.tx
                .blocking_send(Ok(chunk))
                .map_err(|_| io::Error::other("the upload stopped"))?;
        }
        Ok(())
    }
}

/// Extended attributes of `path` (not following a symbolic link), as PAX records.
fn xattr_records(path: &Path) -> Vec<u8> {
    let mut names = vec![0u8; 64 * 1024];
    let Ok(n) = rustix::fs::llistxattr(path, &mut names) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for name in names[..n].split(|b| *b == 0).filter(|s| !s.is_empty()) {
        let Ok(name) = std::str::from_utf8(name) else {
            continue;
        };
        let mut value = vec![0u8; 64 * 1024];
        let Ok(len) = rustix::fs::lgetxattr(path, name, &mut value) else {
            continue;
        };
        out.extend(pax_record(&format!("SCHILY.xattr.{name}"), &value[..len]));
    }
    out
}

/// One PAX extended-header record: `<length> <key>=<value>\n`, the length counting itself.
fn pax_record(key: &str, value: &[u8]) -> Vec<u8> {
    let rest = key.len() + value.len() + 3; // space, '=', newline
    let mut len = rest + 1;
    while len != rest + len.to_string().len() {
        len = rest + len.to_string().len();
    }
    let mut r = format!("{len} {key}=").into_bytes();
    r.extend_from_slice(value);
    r.push(b'\n');
    r
}

/// What a walk has seen: the first path of each multiply linked inode (later ones become hard
/// links to it), and what to call for an entry that cannot be archived.
struct Walk<'a> {
    links: std::collections::HashMap<(u64, u64), std::path::PathBuf>,
    on_skip: &'a dyn Fn(&Path, &str),
}

/// A header for `md` with everything but the name: type, mode, owner, modification time, and
/// the device numbers of a device node.
fn header_for(md: &std::fs::Metadata) -> tar::Header {
    use std::os::unix::fs::MetadataExt;
    let mut h = tar::Header::new_gnu();
    h.set_metadata_in_mode(md, tar::HeaderMode::Complete);
    h.set_size(0);
    let ft = md.file_type();
    if ft.is_char_device() || ft.is_block_device() {
        let (major, minor) = (rustix::fs::major(md.rdev()), rustix::fs::minor(md.rdev()));
        // Both fit the header's fields (seven octal digits) for every device Linux makes.
        let _ = h.set_device_major(major);
        let _ = h.set_device_minor(minor);
    }
    h
}

/// Appends one entry, `rel` its name in the archive and `path` where it is here.
fn append_entry<W: Write>(
    b: &mut tar::Builder<W>,
    walk: &mut Walk<'_>,
    path: &Path,
    rel: &Path,
    md: &std::fs::Metadata,
) -> io::Result<()> {
    use std::os::unix::fs::MetadataExt;
    let ft = md.file_type();
    if ft.is_socket() {
        (walk.on_skip)(
            rel,
            "a socket (it cannot be archived: a program makes it when it listens)",
        );
        return Ok(());
    }
    let pax = xattr_records(path);
    if !pax.is_empty() {
        let mut h = tar::Header::new_ustar();
        h.set_entry_type(tar::EntryType::XHeader);
        h.set_size(pax.len() as u64);
        h.set_mode(0o644);
        h.set_cksum();
        b.append(&h, &pax[..])?;
    }
    let mut h = header_for(md);
    if !ft.is_dir() && md.nlink() > 1 {
        match walk.links.entry((md.dev(), md.ino())) {
            std::collections::hash_map::Entry::Occupied(first) => {
                h.set_entry_type(tar::EntryType::Link);
                return b.append_link(&mut h, rel, first.get());
            }
            std::collections::hash_map::Entry::Vacant(v) => {
                v.insert(rel.to_path_buf());
            }
        }
    }
    if ft.is_symlink() {
        let target = std::fs::read_link(path)?;
        return b.append_link(&mut h, rel, target);
    }
    if ft.is_file() {
        let f = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(o_nofollow())
            .open(path)?;
        let size = md.len();
        h.set_size(size);
        // A file that changes while it is packed must not break the archive: exactly `size`
        // bytes go in, and a file that shrank is an error.
        let mut data = io::Read::take(f, size);
        let mut counted = Counted {
            inner: &mut data,
            n: 0,
        };
        b.append_data(&mut h, rel, &mut counted)?;
        if counted.n != size {
            return Err(io::Error::other(format!(
                "{} changed while it was packed (it shrank from {size} bytes)",
                path.display()
            )));
        }
        return Ok(());
    }
    // Directories, FIFOs and device nodes: a header alone.
    b.append_data(&mut h, rel, io::empty())
}

fn o_nofollow() -> i32 {
    rustix::fs::OFlags::NOFOLLOW.bits() as i32
}

/// Counts what a reader gave.
struct Counted<'a, R> {
    inner: &'a mut R,
    n: u64,
}

impl<R: io::Read> io::Read for Counted<'_, R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let k = self.inner.read(buf)?;
        self.n += k as u64;
        Ok(k)
    }
}

/// Appends `dir`'s contents under `rel`, depth first in name order, each entry with its
/// extended attributes.
fn append_tree<W: Write>(
    b: &mut tar::Builder<W>,
    walk: &mut Walk<'_>,
    root: &Path,
    rel: &Path,
) -> io::Result<()> {
    let path = root.join(rel);
    let md = std::fs::symlink_metadata(&path)?;
    if !rel.as_os_str().is_empty() {
        append_entry(b, walk, &path, rel, &md)?;
    }
    if md.is_dir() {
        let mut names: Vec<_> = std::fs::read_dir(&path)?
            .map(|e| e.map(|e| e.file_name()))
            .collect::<io::Result<_>>()?;
        names.sort();
        for n in names {
            append_tree(b, walk, root, &rel.join(n))?;
        }
    }
    Ok(())
}

/// A tar stream of `dir` (owners, modes, modification times, symbolic and hard links, device
/// nodes, FIFOs and extended attributes; symbolic links not followed). Sockets cannot be
/// archived and are left out.
pub fn tar_dir(dir: &Path) -> impl futures_util::Stream<Item = io::Result<Bytes>> + Send + 'static {
    tar_dir_with(dir, |_, _| {})
}

/// [`tar_dir`], calling `on_skip` with the name and the reason for each entry left out.
pub fn tar_dir_with(
    dir: &Path,
    on_skip: impl Fn(&Path, &str) + Send + 'static,
) -> impl futures_util::Stream<Item = io::Result<Bytes>> + Send + 'static {
    let (tx, rx) = tokio::sync::mpsc::channel(8);
    let dir = dir.to_path_buf();
    std::thread::spawn(move || {
        let w = ChanWriter {
            tx: tx.clone(),
            buf: Vec::new(),
        };
        let mut b = tar::Builder::new(w);
        b.follow_symlinks(false);
        b.mode(tar::HeaderMode::Complete);
        let mut walk = Walk {
            links: Default::default(),
            on_skip: &on_skip,
        };
        let r = append_tree(&mut b, &mut walk, &dir, Path::new(""))
            .and_then(|()| b.into_inner())
            .and_then(|mut w| w.flush());
        if let Err(e) = r {
            let _ = tx.blocking_send(Err(io::Error::new(
                e.kind(),
                format!("packing {}: {e}", dir.display()),
            )));
        }
    });
    futures_util::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|x| (x, rx)) })
}

/// Unpacks a tar stream that someone else made (a sandbox's directory) into the local
/// directory `dest`, made if missing; returns the bytes of file data written. Only regular
/// files, directories, symbolic links and hard links are made, each inside `dest` and never
/// through a link (the `tar` crate's checks); owners are not kept and modes lose their
/// set-id bits; other entries are skipped. Directory modes are applied last, so a read-only
/// directory still receives its contents.
pub fn unpack_local(r: impl io::Read, dest: &Path) -> io::Result<u64> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::create_dir_all(dest)?;
    let mut ar = tar::Archive::new(r);
    ar.set_preserve_permissions(false);
    ar.set_preserve_ownerships(false);
    ar.set_unpack_xattrs(false);
    ar.set_overwrite(true);
    let mut written = 0u64;
    let mut dirs = Vec::new();
    for entry in ar.entries()? {
        let mut entry = entry?;
        let kind = entry.header().entry_type();
        let mode = entry.header().mode().unwrap_or(0o644) & 0o777;
        match kind {
            tar::EntryType::Regular | tar::EntryType::Continuous => {
                written += entry.size();
            }
            tar::EntryType::Directory => {
                let rel = entry.path()?.into_owned();
                if entry.unpack_in(dest)? {
                    dirs.push((rel, mode));
                }
                continue;
            }
            tar::EntryType::Symlink | tar::EntryType::Link => {}
            tar::EntryType::XHeader | tar::EntryType::XGlobalHeader => continue,
            tar::EntryType::GNULongName | tar::EntryType::GNULongLink => continue,
            _ => continue, // devices, FIFOs: not made here
        }
        if kind == tar::EntryType::Link {
            // A hard link's target must be an entry already unpacked here.
            let target = entry.link_name()?.unwrap_or_default().into_owned();
            if target.is_absolute()
                || target
                    .components()
                    .any(|c| matches!(c, std::path::Component::ParentDir))
            {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!(
                        "the archive links {} to {}, outside the directory",
                        entry.path()?.display(),
                        target.display()
                    ),
                ));
            }
        }
        entry.unpack_in(dest)?;
    }
    // Deepest first, so a directory that forbids writing is closed after its contents.
    dirs.sort_by_key(|d| std::cmp::Reverse(d.0.components().count()));
    for (rel, mode) in dirs {
        let p = dest.join(&rel);
        if std::fs::symlink_metadata(&p).is_ok_and(|m| m.is_dir()) {
            std::fs::set_permissions(&p, std::fs::Permissions::from_mode(mode | 0o700))?;
        }
    }
    Ok(written)
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures_util::StreamExt;

    /// A tar of raw entries: (path, type, link target, data).
    fn raw_tar(entries: &[(&str, tar::EntryType, &str, &[u8])]) -> Vec<u8> {
        raw_tar_with(entries, |_| 0o644)
    }

    fn raw_tar_with(
        entries: &[(&str, tar::EntryType, &str, &[u8])],
        mode: impl Fn(&str) -> u32,
    ) -> Vec<u8> {
        let mut out = Vec::new();
        for (path, kind, link, data) in entries {
            let mut h = tar::Header::new_gnu();
            // Names set byte for byte: the tar crate's setters refuse `..` and absolute paths.
            h.as_gnu_mut().unwrap().name[..path.len()].copy_from_slice(path.as_bytes());
            h.as_gnu_mut().unwrap().linkname[..link.len()].copy_from_slice(link.as_bytes());
            h.set_entry_type(*kind);
            h.set_mode(mode(path));
            h.set_size(data.len() as u64);
            h.set_cksum();
            out.extend_from_slice(h.as_bytes());
            out.extend_from_slice(data);
            out.resize(out.len().div_ceil(512) * 512, 0);
        }
        out.resize(out.len() + 1024, 0);
        out
    }

    #[test]
    fn archives_from_a_sandbox_cannot_write_outside_the_destination() {
        use tar::EntryType as T;
        let outside = tempfile::tempdir().unwrap();
        let o = outside.path().to_str().unwrap().to_string();
        let cases: Vec<Vec<u8>> = vec![
            raw_tar(&[("../escape", T::Regular, "", b"x")]),
            raw_tar(&[(&format!("{o}/abs"), T::Regular, "", b"x")]),
            raw_tar(&[
                ("l", T::Symlink, &o, b""),
                ("l/through", T::Regular, "", b"x"),
            ]),
            raw_tar(&[
                ("d", T::Directory, "", b""),
                ("d/l", T::Symlink, "..", b""),
                ("d/l/l2", T::Symlink, &o, b""),
                ("d/l/l2/x", T::Regular, "", b"x"),
            ]),
            raw_tar(&[("h", T::Link, &format!("{o}/target"), b"")]),
            raw_tar(&[("h", T::Link, "../target", b"")]),
        ];
        std::fs::write(outside.path().join("target"), b"keep").unwrap();
        for (i, t) in cases.iter().enumerate() {
            let dest = tempfile::tempdir().unwrap();
            let _ = unpack_local(&t[..], &dest.path().join("d"));
            let mut names: Vec<_> = std::fs::read_dir(outside.path())
                .unwrap()
                .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                .collect();
            names.sort();
            assert_eq!(names, vec!["target"], "case {i} wrote outside");
            assert_eq!(
                std::fs::read(outside.path().join("target")).unwrap(),
                b"keep"
            );
            // Nothing above the destination either.
            let mut above: Vec<_> = std::fs::read_dir(dest.path())
                .unwrap()
                .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                .collect();
            above.sort();
            assert_eq!(above, vec!["d"], "case {i}");
        }
        // Set-id bits and devices do not come through; files and directories do.
        let t2 = raw_tar_with(
            &[
                ("bin", T::Directory, "", b""),
                ("bin/su", T::Regular, "", b"#!"),
                ("null", T::Char, "", b""),
            ],
            |p| if p == "bin/su" { 0o4755 } else { 0o755 },
        );
        let dest = tempfile::tempdir().unwrap();
        assert_eq!(unpack_local(&t2[..], dest.path()).unwrap(), 2);
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(dest.path().join("bin/su"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o7777, 0o755);
        assert!(!dest.path().join("null").exists());
    }

    #[test]
    fn every_file_type_is_packed_with_its_own_name() {
        use std::os::unix::fs::MetadataExt;
        let d = tempfile::tempdir().unwrap();
        let r = d.path();
        std::fs::create_dir_all(r.join("dev")).unwrap();
        std::fs::write(r.join("a"), b"hello").unwrap();
        std::fs::hard_link(r.join("a"), r.join("b")).unwrap();
        std::os::unix::fs::symlink("a", r.join("s")).unwrap();
        rustix::fs::mknodat(
            rustix::fs::CWD,
            r.join("dev/null"),
            rustix::fs::FileType::CharacterDevice,
            rustix::fs::Mode::from_raw_mode(0o666),
            rustix::fs::makedev(1, 3),
        )
        .ok(); // needs root; the other entries are checked either way
        rustix::fs::mknodat(
            rustix::fs::CWD,
            r.join("dev/fifo"),
            rustix::fs::FileType::Fifo,
            rustix::fs::Mode::from_raw_mode(0o600),
            0,
        )
        .unwrap();
        let _sock = std::os::unix::net::UnixListener::bind(r.join("sock")).unwrap();
        let skipped = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let s2 = skipped.clone();
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let bytes: Vec<u8> = rt.block_on(async {
            let chunks: Vec<_> = tar_dir_with(r, move |p, _| {
                s2.lock().unwrap().push(p.display().to_string())
            })
            .collect()
            .await;
            chunks
                .into_iter()
                .flat_map(|c| c.unwrap().to_vec())
                .collect()
        });
        assert_eq!(*skipped.lock().unwrap(), vec!["sock".to_string()]);
        let mut ar = tar::Archive::new(&bytes[..]);
        let mut seen = Vec::new();
        for e in ar.entries().unwrap() {
            let e = e.unwrap();
            let h = e.header();
            let link = e
                .link_name()
                .unwrap()
                .map(|l| l.display().to_string())
                .unwrap_or_default();
            seen.push(format!(
                "{} {:?} {link} {:?}",
                e.path().unwrap().display(),
                h.entry_type(),
                h.device_major().unwrap()
            ));
        }
        let mut want = vec![
            "a Regular  Some(0)".to_string(),
            "b Link a Some(0)".into(),
            "dev Directory  Some(0)".into(),
            "dev/fifo Fifo  Some(0)".into(),
            "s Symlink a Some(0)".into(),
        ];
        if std::fs::symlink_metadata(r.join("dev/null")).is_ok() {
            want.insert(4, "dev/null Char  Some(1)".into());
            assert_eq!(
                std::fs::symlink_metadata(r.join("dev/null"))
                    .unwrap()
                    .rdev(),
                rustix::fs::makedev(1, 3)
            );
        }
        assert_eq!(seen, want);
    }

    #[test]
    fn directories_are_packed_with_their_extended_attributes() {
        let d = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(d.path().join("etc/sub")).unwrap();
        std::fs::write(d.path().join("etc/sub/f"), b"x").unwrap();
        std::os::unix::fs::symlink("../nowhere", d.path().join("etc/link")).unwrap();
        rustix::fs::setxattr(
            d.path().join("etc/sub"),
            "trusted.overlay.opaque",
            b"y",
            rustix::fs::XattrFlags::empty(),
        )
        .unwrap();
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let bytes: Vec<u8> = rt.block_on(async {
            let chunks: Vec<_> = tar_dir(d.path()).collect().await;
            chunks
                .into_iter()
                .flat_map(|c| c.unwrap().to_vec())
                .collect()
        });
        let mut ar = tar::Archive::new(&bytes[..]);
        let mut seen = Vec::new();
        for e in ar.entries().unwrap() {
            let mut e = e.unwrap();
            let path = e.path().unwrap().display().to_string();
            let attrs: Vec<String> = e
                .pax_extensions()
                .unwrap()
                .into_iter()
                .flatten()
                .map(|x| {
                    let x = x.unwrap();
                    format!(
                        "{}={}",
                        x.key().unwrap(),
                        String::from_utf8_lossy(x.value_bytes())
                    )
                })
                .collect();
            seen.push((path, attrs));
        }
        assert_eq!(
            seen,
            vec![
                ("etc".to_string(), vec![]),
                ("etc/link".to_string(), vec![]),
                (
                    "etc/sub".to_string(),
                    vec!["SCHILY.xattr.trusted.overlay.opaque=y".to_string()]
                ),
                ("etc/sub/f".to_string(), vec![]),
            ]
        );
        assert_eq!(pax_record("k", b"v"), b"6 k=v\n");
        // The length counts its own digits, also where they tip over to one more digit.
        assert_eq!(pax_record("kkkk", b"v"), b"9 kkkk=v\n");
        assert_eq!(pax_record("kkkkk", b"v"), b"11 kkkkk=v\n");
    }
}
