//! The guest agent binary the node runs: its own copy, named by its digest.
//!
//! ```text
//! <state-dir>/guest/
//!   <sha256 hex>/warren-guest    a copy of the configured `guest_binary` (0755, the daemon's)
//!   .tmp-<random>                a copy being made (removed at the next start if a crash left it)
//! ```
//!
//! Every init (warm or not) executes the copy, never the configured file itself: that file is a
//! build output (`target/release/warren-guest`) which a rebuild may write in place, and a file
//! that a running init executes cannot be written (`ETXTBSY`). At start the node copies the
//! configured file (read once: what it hashes is what it copies) unless a copy of that digest is
//! there already, and renames it into place whole. A sandbox's record names the digest it runs;
//! copies that neither the current start nor an adopted sandbox names are removed after
//! adoption (a copy in use by a process is safe to unlink: the process keeps the inode).
//!
//! The copy's file name stays `warren-guest` (the digest is its directory): the kernel names a
//! process after the file it executes, and tools count guests by that name.
//!
//! The state directory is host-only (no sandbox can reach it), so plain paths are used; still,
//! nothing here follows a symbolic link it finds in the directory, and only entries of the exact
//! shapes above are ever removed.

use std::collections::HashSet;
use std::fs;
use std::io::{self, Read, Write};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

/// The name of the copy inside its digest's directory.
pub const FILE_NAME: &str = "warren-guest";
/// Prefix of copies being made.
const TMP_PREFIX: &str = ".tmp-";

/// The guest binary this node runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GuestBinary {
    /// The node's copy, which every init executes.
    pub path: PathBuf,
    /// Its digest, `sha256:<hex>`.
    pub digest: String,
}

/// Why the guest binary could not be installed.
#[derive(Debug, thiserror::Error)]
pub enum GuestBinError {
    /// The configured binary cannot be read.
    #[error(
        "guest agent binary {path}: {source}: build it (cargo build -p warren-guest) or set guest_binary"
    )]
    Source {
        /// The configured path.
        path: PathBuf,
        /// What failed.
        #[source]
        source: io::Error,
    },
    /// The configured path is not a regular file.
    #[error(
        "guest agent binary {0} is not a regular file: set guest_binary to the warren-guest executable"
    )]
    NotAFile(PathBuf),
    /// The copy in the state directory could not be made.
    #[error("copying the guest agent binary into {path}: {source}")]
    Copy {
        /// Where.
        path: PathBuf,
        /// What failed.
        #[source]
        source: io::Error,
    },
}

/// Copies `source` into `dir` under its digest (unless an intact copy of that digest is there),
/// and returns the copy. Removes copies a crash left half-made. Blocking.
pub fn install(source: &Path, dir: &Path) -> Result<GuestBinary, GuestBinError> {
    fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(copy_err(dir))?;
    remove_temporaries(dir);
    let source_err = |e| GuestBinError::Source {
        path: source.to_path_buf(),
        source: e,
    };
    let mut src = fs::File::open(source).map_err(source_err)?;
    if !src.metadata().map_err(source_err)?.is_file() {
        return Err(GuestBinError::NotAFile(source.to_path_buf()));
    }
    let tmp = dir.join(format!("{TMP_PREFIX}{}", crate::state::random_name(12)));
    let installed = copy_into_place(&mut src, source, dir, &tmp);
    // Renamed into place, or not needed, or half-made: it goes (gone already after a rename).
    let _ = fs::remove_file(&tmp);
    installed
}

/// Copies `src` to `tmp` while hashing it, then renames it to its digest's place unless an
/// intact copy is there.
fn copy_into_place(
    src: &mut fs::File,
    source: &Path,
    dir: &Path,
    tmp: &Path,
) -> Result<GuestBinary, GuestBinError> {
    let mut out = fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o700)
        .open(tmp)
        .map_err(copy_err(tmp))?;
    let mut hash = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = match src.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => {
                return Err(GuestBinError::Source {
                    path: source.to_path_buf(),
                    source: e,
                });
            }
        };
        hash.update(&buf[..n]);
        out.write_all(&buf[..n]).map_err(copy_err(tmp))?;
    }
    let hex = format!("{:x}", hash.finalize());
    let home = dir.join(&hex);
    let path = home.join(FILE_NAME);
    let digest = format!("sha256:{hex}");
    if intact(&path, &hex) {
        return Ok(GuestBinary { path, digest });
    }
    out.set_permissions(fs::Permissions::from_mode(0o755))
        .map_err(copy_err(tmp))?;
    out.sync_all().map_err(copy_err(tmp))?;
    drop(out);
    match fs::DirBuilder::new().mode(0o755).create(&home) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(copy_err(&home)(e)),
    }
    // A directory, not a link to one.
    if !fs::symlink_metadata(&home).is_ok_and(|m| m.is_dir()) {
        return Err(copy_err(&home)(io::Error::other(
            "it is there but is not a directory: remove it",
        )));
    }
    fs::rename(tmp, &path).map_err(copy_err(&path))?;
    for d in [home.as_path(), dir] {
        fs::File::open(d)
            .and_then(|f| f.sync_all())
            .map_err(copy_err(d))?;
    }
    Ok(GuestBinary { path, digest })
}

/// Removes the copies of every digest in `dir` but those in `keep` (`sha256:<hex>`); returns
/// how many. Touches only `<hex>/warren-guest` regular files and their then empty directories;
/// anything else (a link, another name) is left alone. Blocking.
pub fn collect(dir: &Path, keep: &HashSet<String>) -> usize {
    let mut removed = 0;
    for entry in fs::read_dir(dir).into_iter().flatten().flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if !is_hex_digest(&name) || keep.contains(&format!("sha256:{name}")) {
            continue;
        }
        let home = entry.path();
        if !fs::symlink_metadata(&home).is_ok_and(|m| m.is_dir()) {
            continue;
        }
        let file = home.join(FILE_NAME);
        if fs::symlink_metadata(&file).is_ok_and(|m| m.is_file())
            && let Err(e) = fs::remove_file(&file)
        {
            tracing::warn!(
                "removing an unused guest agent copy {}: {e}",
                file.display()
            );
            continue;
        }
        match fs::remove_dir(&home) {
            Ok(()) => removed += 1,
            Err(e) => tracing::warn!(
                "removing the unused guest agent directory {}: {e}",
                home.display()
            ),
        }
    }
    removed
}

fn copy_err(path: &Path) -> impl FnOnce(io::Error) -> GuestBinError {
    let path = path.to_path_buf();
    move |source| GuestBinError::Copy { path, source }
}

/// Whether `path` is a regular file, mode 0755, whose content hashes to `hex`.
fn intact(path: &Path, hex: &str) -> bool {
    let Ok(meta) = fs::symlink_metadata(path) else {
        return false;
    };
    if !meta.is_file() || meta.permissions().mode() & 0o7777 != 0o755 {
        return false;
    }
    let Ok(mut f) = fs::File::open(path) else {
        return false;
    };
    let mut hash = Sha256::new();
    io::copy(&mut f, &mut hash).is_ok() && format!("{:x}", hash.finalize()) == hex
}

/// Removes the regular files a crash left half-copied.
fn remove_temporaries(dir: &Path) {
    for entry in fs::read_dir(dir).into_iter().flatten().flatten() {
        let left = entry.file_name().to_string_lossy().starts_with(TMP_PREFIX)
            && fs::symlink_metadata(entry.path()).is_ok_and(|m| m.is_file());
        if left && let Err(e) = fs::remove_file(entry.path()) {
            tracing::warn!("removing {}: {e}", entry.path().display());
        }
    }
}

/// Whether `name` is 64 lower-case hex digits.
fn is_hex_digest(name: &str) -> bool {
    name.len() == 64 && name.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::MetadataExt;

    use super::*;

    fn digest_of(data: &[u8]) -> String {
        format!("sha256:{:x}", Sha256::digest(data))
    }

    fn entries(dir: &Path) -> Vec<String> {
        let mut v: Vec<String> = fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    }

    #[test]
    fn copies_by_digest_once_and_a_new_content_gets_a_new_copy() {
        let t = tempfile::tempdir().unwrap();
        let (src, dir) = (t.path().join("warren-guest"), t.path().join("guest"));
        fs::write(&src, b"one").unwrap();
        // A copy a crash left half-made goes; a link or a directory of that shape stays.
        fs::create_dir_all(&dir).unwrap();
        fs::write(dir.join(".tmp-leftover"), b"on").unwrap();
        std::os::unix::fs::symlink(&src, dir.join(".tmp-link")).unwrap();

        let a = install(&src, &dir).unwrap();
        assert_eq!(a.digest, digest_of(b"one"));
        let hex = a.digest.strip_prefix("sha256:").unwrap();
        assert_eq!(a.path, dir.join(hex).join("warren-guest"));
        assert_eq!(fs::read(&a.path).unwrap(), b"one");
        let meta = fs::metadata(&a.path).unwrap();
        assert_eq!(meta.mode() & 0o7777, 0o755);
        assert!(fs::read(&src).is_ok(), "the source is left as it was");
        assert_eq!(entries(&dir), [".tmp-link", hex]);
        assert_eq!(
            fs::read(&src).unwrap(),
            b"one",
            "the link's target is untouched"
        );

        // The same content: the same copy, not made again.
        let again = install(&src, &dir).unwrap();
        assert_eq!(again, a);
        assert_eq!(fs::metadata(&again.path).unwrap().ino(), meta.ino());
        assert_eq!(entries(&dir), [".tmp-link", hex]);

        // The source written in place (the copy is another file): a second copy.
        fs::write(&src, b"two").unwrap();
        assert_eq!(fs::read(&a.path).unwrap(), b"one");
        let b = install(&src, &dir).unwrap();
        assert_eq!(b.digest, digest_of(b"two"));
        assert_ne!(b.path, a.path);
        assert_eq!(fs::read(&b.path).unwrap(), b"two");
        assert_eq!(entries(&dir).len(), 3);
    }

    #[test]
    fn a_damaged_copy_is_replaced() {
        let t = tempfile::tempdir().unwrap();
        let (src, dir) = (t.path().join("warren-guest"), t.path().join("guest"));
        fs::write(&src, b"agent").unwrap();
        let a = install(&src, &dir).unwrap();
        fs::write(&a.path, b"damaged").unwrap();
        assert_eq!(install(&src, &dir).unwrap(), a);
        assert_eq!(fs::read(&a.path).unwrap(), b"agent");
        // Writable by others: replaced too.
        fs::set_permissions(&a.path, fs::Permissions::from_mode(0o777)).unwrap();
        install(&src, &dir).unwrap();
        assert_eq!(
            fs::metadata(&a.path).unwrap().permissions().mode() & 0o7777,
            0o755
        );
    }

    #[test]
    fn a_missing_or_odd_source_is_a_clear_error() {
        let t = tempfile::tempdir().unwrap();
        let dir = t.path().join("guest");
        let missing = t.path().join("nope");
        match install(&missing, &dir) {
            Err(e @ GuestBinError::Source { .. }) => {
                let m = e.to_string();
                assert!(m.contains("nope") && m.contains("guest_binary"), "{m}");
            }
            other => panic!("{other:?}"),
        }
        match install(t.path(), &dir) {
            Err(e @ GuestBinError::NotAFile(_)) => assert!(e.to_string().contains("regular")),
            other => panic!("{other:?}"),
        }
        assert!(entries(&dir).is_empty(), "no temporary file left");
    }

    #[test]
    fn collect_keeps_named_copies_and_touches_nothing_else() {
        let t = tempfile::tempdir().unwrap();
        let (src, dir) = (t.path().join("warren-guest"), t.path().join("guest"));
        let mut copies = Vec::new();
        for content in [&b"old"[..], b"adopted", b"current"] {
            fs::write(&src, content).unwrap();
            copies.push(install(&src, &dir).unwrap());
        }
        // Shapes collect must leave alone: a link with a digest's name (to a directory outside,
        // whose file must survive), other names, a digest directory holding more.
        let outside = t.path().join("outside");
        fs::create_dir(&outside).unwrap();
        fs::write(outside.join("warren-guest"), b"not ours").unwrap();
        let link = "c".repeat(64);
        std::os::unix::fs::symlink(&outside, dir.join(&link)).unwrap();
        fs::write(dir.join("notes"), b"").unwrap();
        let crowded = "d".repeat(64);
        fs::create_dir(dir.join(&crowded)).unwrap();
        fs::write(dir.join(&crowded).join("other"), b"").unwrap();

        let keep: HashSet<String> = [copies[1].digest.clone(), copies[2].digest.clone()].into();
        assert_eq!(collect(&dir, &keep), 1);
        assert!(!copies[0].path.exists());
        assert!(!copies[0].path.parent().unwrap().exists());
        assert!(copies[1].path.exists() && copies[2].path.exists());
        assert_eq!(fs::read(outside.join("warren-guest")).unwrap(), b"not ours");
        assert!(fs::symlink_metadata(dir.join(&link)).unwrap().is_symlink());
        assert!(dir.join("notes").exists() && dir.join(&crowded).join("other").exists());
        // Nothing more to do.
        assert_eq!(collect(&dir, &keep), 0);
    }
}
