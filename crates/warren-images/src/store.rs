//! The layer store on disk (see the crate documentation for its layout).

use std::fs;
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};
use std::process::Command;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use warren_types::api::Layer;

use crate::ImageError;
use crate::names::check_digest;

/// The EROFS super block's magic number, at byte 1024 of a layer file.
const EROFS_MAGIC: [u8; 4] = 0xE0F5_E1E2u32.to_le_bytes();

/// Layer metadata kept next to the layer file.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct LayerMeta {
    digest: String,
    size: u64,
    created_ms: u64,
    creator: String,
    source: String,
}

/// A layer store rooted at a directory.
#[derive(Debug, Clone)]
pub struct Store {
    root: PathBuf,
}

fn hostname() -> String {
    rustix::system::uname()
        .nodename()
        .to_string_lossy()
        .replace(['.', '/'], "_")
}

impl Store {
    /// Opens (creating) the store at `root`, and removes temporary files that processes of
    /// this host which no longer run left behind.
    pub fn open(root: &Path) -> Result<Store, ImageError> {
        for d in ["layers", "tmp"] {
            fs::create_dir_all(root.join(d))
                .map_err(|e| ImageError::io(format!("creating {}", root.join(d).display()), e))?;
        }
        let store = Store {
            root: root.to_path_buf(),
        };
        store.clean_tmp();
        Ok(store)
    }

    fn clean_tmp(&self) {
        let host = hostname();
        let Ok(rd) = fs::read_dir(self.root.join("tmp")) else {
            return;
        };
        for e in rd.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            let mut parts = name.split('.');
            let (Some(h), Some(pid)) = (parts.next(), parts.next()) else {
                continue;
            };
            let alive = pid
                .parse::<u32>()
                .is_ok_and(|p| Path::new(&format!("/proc/{p}")).exists());
            if h == host && !alive {
                let p = e.path();
                let r = if p.is_dir() {
                    fs::remove_dir_all(&p)
                } else {
                    fs::remove_file(&p)
                };
                match r {
                    Ok(()) => tracing::info!(path = %p.display(), "removed an interrupted import"),
                    Err(e) => tracing::warn!(path = %p.display(), "removing leftovers: {e}"),
                }
            }
        }
        // Metadata without its layer file: a write interrupted between the two renames.
        if let Ok(rd) = fs::read_dir(self.root.join("layers")) {
            for e in rd.flatten() {
                let p = e.path();
                if p.extension().is_some_and(|x| x == "json") && !p.with_extension("erofs").exists()
                {
                    let _ = fs::remove_file(&p);
                }
            }
        }
    }

    /// A new temporary directory in the store (same file system as the layers, so finished
    /// files are renamed into place).
    pub fn tmp(&self) -> Result<tempfile::TempDir, ImageError> {
        tempfile::Builder::new()
            .prefix(&format!("{}.{}.", hostname(), std::process::id()))
            .tempdir_in(self.root.join("tmp"))
            .map_err(|e| ImageError::io("making a temporary directory in the image store", e))
    }

    /// The path of a layer's file (whether or not it exists).
    pub fn layer_path(&self, digest: &str) -> Result<PathBuf, ImageError> {
        let hex = check_digest(digest)?;
        Ok(self.root.join(format!("layers/sha256-{hex}.erofs")))
    }

    /// Writes the staging directory `dir` as a new EROFS layer (or finds the identical one
    /// there is). The same content always gives the same layer (see [`mkfs`]).
    pub fn add_layer_dir(
        &self,
        dir: &Path,
        source: &str,
        creator: &str,
    ) -> Result<Layer, ImageError> {
        self.add_layer_dir_owned(dir, source, creator, None)
    }

    /// [`Store::add_layer_dir`], every entry owned by `owner` when one is given.
    pub fn add_layer_dir_owned(
        &self,
        dir: &Path,
        source: &str,
        creator: &str,
        owner: Option<Owner>,
    ) -> Result<Layer, ImageError> {
        let tmp = self.tmp()?;
        let out = tmp.path().join("layer.erofs");
        mkfs(dir, &out, owner)?;
        self.add_layer_file(&out, source, creator)
    }

    /// Moves the EROFS file `file` (in this store's `tmp`) into the store under its digest.
    pub fn add_layer_file(
        &self,
        file: &Path,
        source: &str,
        creator: &str,
    ) -> Result<Layer, ImageError> {
        check_erofs(file)?;
        let (digest, size) = sha256_file(file)?;
        let dest = self.layer_path(&digest)?;
        let meta_path = dest.with_extension("json");
        if !dest.exists() {
            let meta = LayerMeta {
                digest: digest.clone(),
                size,
                created_ms: crate::now_ms(),
                creator: creator.into(),
                source: source.into(),
            };
            write_atomic(
                &meta_path,
                &serde_json::to_vec_pretty(&meta).unwrap_or_default(),
            )?;
            let f = fs::File::open(file).map_err(|e| ImageError::io("syncing the layer", e))?;
            f.sync_all()
                .map_err(|e| ImageError::io("syncing the layer", e))?;
            fs::rename(file, &dest)
                .map_err(|e| ImageError::io(format!("storing layer {digest}"), e))?;
            // Writing and hashing the layer left it in the page cache; dropped, the read
            // statistics count what sandboxes read, not what the import wrote.
            forget_pages(&f);
        }
        self.layer(&digest)
    }

    /// One layer's metadata.
    pub fn layer(&self, digest: &str) -> Result<Layer, ImageError> {
        let path = self.layer_path(digest)?;
        let md = fs::metadata(&path).map_err(|_| {
            ImageError::NotFound(format!(
                "layer {digest} is not in the image store; `warren image ls` lists images"
            ))
        })?;
        let meta: Option<LayerMeta> = fs::read(path.with_extension("json"))
            .ok()
            .and_then(|b| serde_json::from_slice(&b).ok());
        Ok(match meta {
            Some(m) => Layer {
                digest: m.digest,
                size: m.size,
                created_at: crate::rfc3339(m.created_ms),
                creator: m.creator,
                source: m.source,
            },
            None => Layer {
                digest: digest.into(),
                size: md.len(),
                created_at: crate::rfc3339(0),
                creator: String::new(),
                source: "unknown".into(),
            },
        })
    }

    /// Every layer in the store.
    pub fn layers(&self) -> Vec<Layer> {
        let mut out = Vec::new();
        if let Ok(rd) = fs::read_dir(self.root.join("layers")) {
            for e in rd.flatten() {
                let name = e.file_name().to_string_lossy().into_owned();
                if let Some(hex) = name
                    .strip_prefix("sha256-")
                    .and_then(|n| n.strip_suffix(".erofs"))
                    && let Ok(l) = self.layer(&format!("sha256:{hex}"))
                {
                    out.push(l);
                }
            }
        }
        out.sort_by(|a, b| a.digest.cmp(&b.digest));
        out
    }

    /// Deletes a layer file. The caller checks that nothing uses it.
    pub fn remove_layer(&self, digest: &str) -> Result<(), ImageError> {
        let path = self.layer_path(digest)?;
        fs::remove_file(&path).map_err(|e| ImageError::io(format!("removing {digest}"), e))?;
        let _ = fs::remove_file(path.with_extension("json"));
        Ok(())
    }
}

/// Writes `bytes` to `path` through a temporary file and a rename.
fn write_atomic(path: &Path, bytes: &[u8]) -> Result<(), ImageError> {
    let dir = path.parent().unwrap_or(Path::new("."));
    let mut tmp = tempfile::NamedTempFile::new_in(dir)
        .map_err(|e| ImageError::io(format!("writing {}", path.display()), e))?;
    tmp.write_all(bytes)
        .and_then(|()| tmp.as_file().sync_all())
        .map_err(|e| ImageError::io(format!("writing {}", path.display()), e))?;
    tmp.persist(path)
        .map_err(|e| ImageError::io(format!("writing {}", path.display()), e.error))?;
    Ok(())
}

/// Who owns every entry of a layer written with an owner.
pub use warren_types::owner::Owner;

/// [`Owner::parse`], its error an [`ImageError::Invalid`].
pub fn parse_owner(s: &str) -> Result<Owner, ImageError> {
    Owner::parse(s).map_err(ImageError::Invalid)
}

/// The time every layer's super block records, and the latest modification time a layer
/// keeps (later ones are clamped to it): 2100-01-01. A fixed build time and UUID make a layer
/// a function of its content, so the same content is the same digest and is stored once.
const LAYER_EPOCH: &str = "4102444800";
const LAYER_UUID: &str = "00000000-0000-0000-0000-000000000000";

/// Drops a file's pages from the page cache (advice only: nothing is lost if it fails).
fn forget_pages(f: &fs::File) {
    let _ = rustix::fs::fadvise(f, 0, None, rustix::fs::Advice::DontNeed);
}

/// Runs `mkfs.erofs` over the staging directory `dir`, writing `out`: deterministically (fixed
/// build time and UUID; `mkfs.erofs` writes entries in name order), each entry owned by
/// `owner` when one is given. The staging root's own mode and time (a temporary directory's)
/// are set to `0755` and the epoch first, so they do not differ from one import to the next.
pub fn mkfs(dir: &Path, out: &Path, owner: Option<Owner>) -> Result<(), ImageError> {
    use std::os::unix::fs::PermissionsExt;
    fs::set_permissions(dir, fs::Permissions::from_mode(0o755))
        .map_err(|e| ImageError::io("preparing the staging directory", e))?;
    let epoch = rustix::fs::Timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    rustix::fs::utimensat(
        rustix::fs::CWD,
        dir,
        &rustix::fs::Timestamps {
            last_access: epoch,
            last_modification: epoch,
        },
        rustix::fs::AtFlags::SYMLINK_NOFOLLOW,
    )
    .map_err(|e| ImageError::io("preparing the staging directory", e.into()))?;
    let mut cmd = Command::new("mkfs.erofs");
    cmd.env("SOURCE_DATE_EPOCH", LAYER_EPOCH)
        .arg(format!("-U{LAYER_UUID}"))
        .arg("-zlz4hc")
        .arg("--quiet");
    if let Some(o) = owner {
        cmd.arg(format!("--force-uid={}", o.uid))
            .arg(format!("--force-gid={}", o.gid));
    }
    let r = cmd.arg(out).arg(dir).output();
    match r {
        Err(e) if e.kind() == io::ErrorKind::NotFound => Err(ImageError::io(
            "running mkfs.erofs",
            io::Error::other("mkfs.erofs is not installed: install erofs-utils (`make up` does)"),
        )),
        Err(e) => Err(ImageError::io("running mkfs.erofs", e)),
        Ok(o) if !o.status.success() => {
            let msg = String::from_utf8_lossy(&o.stderr);
            let msg = msg.lines().rev().take(3).collect::<Vec<_>>().join("; ");
            if msg.contains("No space left") {
                return Err(ImageError::NoSpace("writing the layer".into()));
            }
            Err(ImageError::io(
                "writing the layer with mkfs.erofs",
                io::Error::other(format!("{}: {msg}", o.status)),
            ))
        }
        Ok(_) => Ok(()),
    }
}

/// Checks an EROFS file made elsewhere with `fsck.erofs` (every inode and every compressed
/// extent decoded), so a corrupt or truncated one is refused at import, not at a mount.
pub fn fsck(file: &Path) -> Result<(), ImageError> {
    let out = Command::new("fsck.erofs")
        .arg("--extract")
        .arg(file)
        .output()
        .map_err(|e| ImageError::io("running fsck.erofs (install erofs-utils)", e))?;
    if out.status.success() {
        return Ok(());
    }
    let msg = String::from_utf8_lossy(&out.stderr);
    let msg = msg.lines().rev().take(2).collect::<Vec<_>>().join("; ");
    Err(ImageError::Invalid(format!(
        "the EROFS file is corrupt or truncated (fsck.erofs: {msg})"
    )))
}

/// Checks that `file` is an EROFS image.
pub fn check_erofs(file: &Path) -> Result<(), ImageError> {
    let mut f = fs::File::open(file).map_err(|e| ImageError::io("opening the layer", e))?;
    let mut head = [0u8; 1028];
    if f.read_exact(&mut head).is_ok() && is_erofs(&head) {
        Ok(())
    } else {
        Err(ImageError::Invalid(
            "the file is not an EROFS image (no EROFS super block at byte 1024)".into(),
        ))
    }
}

/// Whether the first bytes of a file say EROFS.
pub fn is_erofs(head: &[u8]) -> bool {
    head.len() >= 1028 && head[1024..1028] == EROFS_MAGIC
}

fn sha256_file(path: &Path) -> Result<(String, u64), ImageError> {
    let mut f = fs::File::open(path).map_err(|e| ImageError::io("hashing the layer", e))?;
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    let mut n = 0u64;
    loop {
        let k = f
            .read(&mut buf)
            .map_err(|e| ImageError::io("hashing the layer", e))?;
        if k == 0 {
            break;
        }
        h.update(&buf[..k]);
        n += k as u64;
    }
    Ok((format!("sha256:{:x}", h.finalize()), n))
}

/// Makes a layer from a sandbox's writable layer `upper` (a directory the sandbox controls),
/// without changing it: a copy made by descriptor, following no link, without overlay
/// bookkeeping attributes (`trusted.overlay.*` but `opaque`), then stored. The live layer keeps
/// everything it had.
pub fn commit_upper(
    store: &Store,
    upper: &Path,
    source: &str,
    creator: &str,
) -> Result<Layer, ImageError> {
    let staging = store.tmp()?;
    let root = staging.path().join("root");
    fs::create_dir(&root).map_err(|e| ImageError::io("making the staging directory", e))?;
    let from = warren_fs::Beneath::open(upper)
        .map_err(|e| ImageError::io("opening the writable layer", e))?;
    let to = warren_fs::Beneath::open(&root)
        .map_err(|e| ImageError::io("opening the staging directory", e))?;
    let keep =
        |name: &str| !name.starts_with("trusted.overlay.") || name == "trusted.overlay.opaque";
    warren_fs::copy_tree(from.root(), to.root(), &keep)
        .map_err(|e| ImageError::io("copying the writable layer", e))?;
    store.add_layer_dir(&root, source, creator)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn store() -> (tempfile::TempDir, Store) {
        let d = tempfile::tempdir().unwrap();
        let s = Store::open(d.path()).unwrap();
        (d, s)
    }

    fn layer_of(s: &Store, files: &[(&str, &str)]) -> Layer {
        let src = tempfile::tempdir().unwrap();
        for (p, c) in files {
            let p = src.path().join(p);
            fs::create_dir_all(p.parent().unwrap()).unwrap();
            fs::write(p, c).unwrap();
        }
        s.add_layer_dir(src.path(), "directory", "test").unwrap()
    }

    #[test]
    fn layers_are_content_addressed() {
        let (_d, s) = store();
        let a = layer_of(&s, &[("etc/marker", "a")]);
        // The digest is the file's: adding the same file again finds it.
        let again = s.tmp().unwrap();
        fs::copy(s.layer_path(&a.digest).unwrap(), again.path().join("l")).unwrap();
        let a2 = s
            .add_layer_file(&again.path().join("l"), "erofs", "t")
            .unwrap();
        assert_eq!(a.digest, a2.digest);
        assert_eq!(a2.source, "directory", "the first writer's metadata stays");
        let b = layer_of(&s, &[("etc/marker", "b")]);
        assert_ne!(a.digest, b.digest);
        assert_eq!(s.layers().len(), 2);
        s.remove_layer(&a.digest).unwrap();
        assert_eq!(s.layers().len(), 1);
        assert!(matches!(s.layer(&a.digest), Err(ImageError::NotFound(_))));
    }

    #[test]
    fn a_truncated_erofs_file_fails_its_check() {
        let (_d, s) = store();
        let l = layer_of(&s, &[("etc/a", &"x".repeat(100_000))]);
        let path = s.layer_path(&l.digest).unwrap();
        fsck(&path).unwrap();
        let tmp = s.tmp().unwrap();
        let cut = tmp.path().join("cut.erofs");
        let bytes = fs::read(&path).unwrap();
        fs::write(&cut, &bytes[..bytes.len() / 2]).unwrap();
        assert!(matches!(fsck(&cut), Err(ImageError::Invalid(_))));
    }

    #[test]
    fn a_file_that_is_not_erofs_is_refused() {
        let (_d, s) = store();
        let tmp = s.tmp().unwrap();
        let f = tmp.path().join("x");
        fs::write(&f, vec![0u8; 4096]).unwrap();
        assert!(matches!(
            s.add_layer_file(&f, "erofs", "t"),
            Err(ImageError::Invalid(_))
        ));
        assert!(s.layers().is_empty());
    }

    #[test]
    fn leftovers_of_dead_processes_are_removed_at_open() {
        let (d, s) = store();
        let dead = d
            .path()
            .join(format!("tmp/{}.{}.abc", hostname(), u32::MAX - 1));
        fs::create_dir_all(dead.join("x")).unwrap();
        let live = s.tmp().unwrap();
        fs::write(
            d.path()
                .join(format!("layers/sha256-{}.json", "0".repeat(64))),
            b"{}",
        )
        .unwrap();
        let _s2 = Store::open(d.path()).unwrap();
        assert!(!dead.exists());
        assert!(live.path().exists(), "a live process's work is kept");
        assert!(s.layers().is_empty());
        assert_eq!(fs::read_dir(d.path().join("layers")).unwrap().count(), 0);
    }
}
