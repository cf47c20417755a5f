//! Directories as tar streams: what `import_image` and a build's copy step upload.

use std::io::{self, Write};
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

/// Appends `dir`'s contents under `rel`, depth first, each entry with its extended attributes.
fn append_tree<W: Write>(b: &mut tar::Builder<W>, root: &Path, rel: &Path) -> io::Result<()> {
    let path = root.join(rel);
    let md = std::fs::symlink_metadata(&path)?;
    if !rel.as_os_str().is_empty() {
        let pax = xattr_records(&path);
        if !pax.is_empty() {
            let mut h = tar::Header::new_ustar();
            h.set_entry_type(tar::EntryType::XHeader);
            h.set_size(pax.len() as u64);
            h.set_mode(0o644);
            h.set_cksum();
            b.append(&h, &pax[..])?;
        }
        b.append_path_with_name(&path, rel)?;
    }
    if md.is_dir() {
        let mut names: Vec<_> = std::fs::read_dir(&path)?
            .map(|e| e.map(|e| e.file_name()))
            .collect::<io::Result<_>>()?;
        names.sort();
        for n in names {
            append_tree(b, root, &rel.join(n))?;
        }
    }
    Ok(())
}

/// A tar stream of `dir` (owners, modes, links, devices and extended attributes; symbolic
/// links not followed).
pub fn tar_dir(dir: &Path) -> impl futures_util::Stream<Item = io::Result<Bytes>> + Send + 'static {
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
        let r = append_tree(&mut b, &dir, Path::new(""))
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

#[cfg(test)]
mod tests {
    use super::*;
    use futures_util::StreamExt;

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
