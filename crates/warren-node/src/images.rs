//! Images a sandbox's root file system is built from.
//!
//! For now there is one built-in image, `host`: the host's own `/usr` (and `/bin`, `/lib*`
//! where they are not symlinks into it) read-only, over a small skeleton with a minimal `/etc`
//! (an unprivileged `user`, uid 1000, home `/home/user`) and what common tools need from the
//! host's `/etc` (alternatives, the ld.so cache, CA certificates), read-only. It needs no
//! network and runs bash, coreutils and python3 on any Debian machine.
//!
//! A root file system is described as [`Rootfs`]: read-only layers (top first) stacked under a
//! per-sandbox writable layer, plus host bind mounts. Every other image comes from the layer
//! store (`warren-images`): its layers are mounted by [`crate::layers`] and stacked over a
//! tiny runtime skeleton that provides mount points and a fallback `/etc/passwd`.

use std::fs;
use std::io;
use std::os::unix::fs::{DirBuilderExt, PermissionsExt, symlink};
use std::path::{Path, PathBuf};

use warren_types::guest::BindMount;

/// How a sandbox's root is made.
#[derive(Debug, Clone)]
pub struct Rootfs {
    /// Read-only layer directories on the host, top first.
    pub layers: Vec<PathBuf>,
    /// Host paths bound in after the overlay is mounted.
    pub binds: Vec<BindMount>,
}

/// Version of the skeleton's contents; a new version gets a new directory, so running
/// sandboxes keep the lower layer they were started with.
const HOST_SKELETON_VERSION: u32 = 2;

const PASSWD: &str = "\
root:x:0:0:root:/root:/bin/bash
user:x:1000:1000:user:/home/user:/bin/bash
nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin
";

const GROUP: &str = "\
root:x:0:
tty:x:5:
users:x:100:user
user:x:1000:
nogroup:x:65534:
";

const HOSTS: &str = "127.0.0.1\tlocalhost sandbox\n::1\tlocalhost ip6-localhost ip6-loopback\n";

const NSSWITCH: &str = "\
passwd:         files
group:          files
shadow:         files
hosts:          files dns
networks:       files
protocols:      files
services:       files
";

/// Directories at the top of `/` that may be real directories on the host (non-merged /usr)
/// or symlinks into /usr (merged /usr, Debian 12).
const TOP_LEVEL_SYSTEM: &[&str] = &["bin", "sbin", "lib", "lib32", "lib64", "libx32"];

/// Parts of the host's /etc bound read-only into the `host` image when they exist. Only
/// public certificates from /etc/ssl: never `/etc/ssl/private` (the host's TLS keys).
const HOST_ETC: &[&str] = &[
    "etc/alternatives",
    "etc/ld.so.cache",
    "etc/ssl/certs",
    "etc/ssl/openssl.cnf",
    "etc/ca-certificates",
];

/// The images this node knows: the built-in `host`, and the layer store's.
#[derive(Debug)]
pub struct Images {
    host: Rootfs,
    /// The bottom of every layered image: mount points (/proc, /sys, /dev, /tmp) and a
    /// fallback /etc/passwd with `user`, for images that lack them. The image's own files win.
    runtime: PathBuf,
    /// The layer store.
    pub store: Option<warren_images::Store>,
}

/// What an image name resolves to.
#[derive(Debug, Clone)]
pub enum Resolved {
    /// The built-in `host` image.
    Host(Rootfs),
    /// Layers from the store, as the control plane's catalog resolved them.
    Layered(warren_types::api::ResolvedImage),
}

impl Images {
    /// Prepares the built-in images under `dir` and opens the layer store at `store` (an
    /// unusable store is logged: the `host` image still works).
    pub fn prepare(dir: &Path, store: Option<&Path>) -> io::Result<Images> {
        let host = prepare_host(dir, Path::new("/"))?;
        let runtime = prepare_runtime(dir)?;
        let store = store.and_then(|p| match warren_images::Store::open(p) {
            Ok(s) => Some(s),
            Err(e) => {
                tracing::error!(path = %p.display(), "the image store cannot be opened: {e}");
                None
            }
        });
        Ok(Images {
            host,
            runtime,
            store,
        })
    }

    /// Resolves an image: `host`, or a list of names (`a,b,c`, bottom first) that the control
    /// plane resolved into layers (`resolved`).
    pub fn resolve(
        &self,
        spec: &str,
        resolved: Option<&warren_types::api::ResolvedImage>,
    ) -> Result<Resolved, warren_images::ImageError> {
        use warren_images::ImageError;
        if spec == "host" {
            return Ok(Resolved::Host(self.host.clone()));
        }
        if spec.split(',').any(|n| n.trim() == "host") {
            return Err(ImageError::Invalid(
                "the built-in image `host` cannot be combined with other images".into(),
            ));
        }
        let Some(r) = resolved else {
            return Err(ImageError::NotFound(format!(
                "image {spec:?} not found: a node knows only the built-in `host` image by name; \
                 create sandboxes of other images through the control plane, whose catalog \
                 resolves them (`warren image ls` lists them)"
            )));
        };
        if self.store.is_none() {
            return Err(ImageError::io(
                "the image store",
                io::Error::other("this node's image store cannot be opened (see its log)"),
            ));
        }
        if r.layers.is_empty() {
            return Err(ImageError::Invalid(format!(
                "image {spec:?} resolved to no layers"
            )));
        }
        for d in &r.layers {
            warren_images::names::check_digest(d)?;
        }
        Ok(Resolved::Layered(r.clone()))
    }

    /// The built-in `host` image's root.
    pub fn host_rootfs(&self) -> Rootfs {
        self.host.clone()
    }

    /// The file of a layer in the image store.
    pub fn layer_file(&self, digest: &str) -> io::Result<PathBuf> {
        let store = self
            .store
            .as_ref()
            .ok_or_else(|| io::Error::other("this node's image store is unusable (see its log)"))?;
        store
            .layer_path(digest)
            .map_err(|e| io::Error::other(e.to_string()))
    }

    /// The root file system made of mounted layers (bottom first), over the runtime skeleton.
    pub fn layered_rootfs(&self, mounts_bottom_first: &[PathBuf]) -> Rootfs {
        let mut layers: Vec<PathBuf> = mounts_bottom_first.iter().rev().cloned().collect();
        layers.push(self.runtime.clone());
        Rootfs {
            layers,
            binds: Vec::new(),
        }
    }
}

/// Version of the runtime skeleton's contents.
const RUNTIME_SKELETON_VERSION: u32 = 1;

fn prepare_runtime(dir: &Path) -> io::Result<PathBuf> {
    let skel = dir.join(format!("runtime-v{RUNTIME_SKELETON_VERSION}"));
    if skel.join(".complete").exists() {
        return Ok(skel);
    }
    let tmp = dir.join(format!(".runtime-v{RUNTIME_SKELETON_VERSION}.tmp"));
    let _ = fs::remove_dir_all(&tmp);
    fs::create_dir_all(&tmp)?;
    for (d, mode) in [
        ("etc", 0o755),
        ("home", 0o755),
        ("home/user", 0o755),
        ("root", 0o700),
        ("tmp", 0o1777),
        ("proc", 0o555),
        ("sys", 0o555),
        ("dev", 0o755),
    ] {
        mkdir(&tmp, d, mode)?;
    }
    std::os::unix::fs::chown(tmp.join("home/user"), Some(1000), Some(1000))?;
    for (f, content) in [
        ("etc/passwd", PASSWD),
        ("etc/group", GROUP),
        ("etc/hosts", HOSTS),
        ("etc/hostname", "sandbox\n"),
        ("etc/resolv.conf", ""),
    ] {
        fs::write(tmp.join(f), content)?;
        fs::set_permissions(tmp.join(f), fs::Permissions::from_mode(0o644))?;
    }
    fs::write(tmp.join(".complete"), b"")?;
    let _ = fs::remove_dir_all(&skel);
    fs::rename(&tmp, &skel)?;
    Ok(skel)
}

fn prepare_host(dir: &Path, host_root: &Path) -> io::Result<Rootfs> {
    // Java's configuration lives in /etc (`/etc/java-17-openjdk`, linked from the JDK): the
    // host's Java runtimes need theirs to start.
    let mut java: Vec<String> = fs::read_dir(host_root.join("etc"))
        .map(|rd| {
            rd.filter_map(Result::ok)
                .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
                .filter_map(|e| e.file_name().into_string().ok())
                .filter(|n| n.starts_with("java-") && n.len() <= 64)
                .map(|n| format!("etc/{n}"))
                .collect()
        })
        .unwrap_or_default();
    java.sort();
    // The skeleton holds a mount point for each /etc path bound: one per set of them.
    let set: String = java.iter().map(|j| format!("{j};")).collect();
    let tag = {
        use std::hash::{Hash, Hasher};
        let mut h = std::collections::hash_map::DefaultHasher::new();
        set.hash(&mut h);
        format!("{:08x}", h.finish() as u32)
    };
    let skel = if java.is_empty() {
        dir.join(format!("host-v{HOST_SKELETON_VERSION}"))
    } else {
        dir.join(format!("host-v{HOST_SKELETON_VERSION}-{tag}"))
    };
    let mut binds = vec![BindMount {
        source: host_root.join("usr").to_string_lossy().into_owned(),
        target: "/usr".into(),
        readonly: true,
    }];
    let mut real_dirs = Vec::new();
    for name in TOP_LEVEL_SYSTEM {
        let p = host_root.join(name);
        match fs::symlink_metadata(&p) {
            Ok(md) if md.is_dir() => {
                real_dirs.push(*name);
                binds.push(BindMount {
                    source: p.to_string_lossy().into_owned(),
                    target: format!("/{name}"),
                    readonly: true,
                });
            }
            _ => {}
        }
    }
    let etc: Vec<&str> = HOST_ETC
        .iter()
        .copied()
        .chain(java.iter().map(String::as_str))
        .filter(|p| host_root.join(p).exists())
        .collect();
    for p in &etc {
        binds.push(BindMount {
            source: host_root.join(p).to_string_lossy().into_owned(),
            target: format!("/{p}"),
            readonly: true,
        });
    }
    if !skel.join(".complete").exists() {
        // Build in a temporary directory and rename, so a crash never leaves half a skeleton
        // under the real name.
        let tmp = dir.join(format!(".host-v{HOST_SKELETON_VERSION}.tmp"));
        let _ = fs::remove_dir_all(&tmp);
        fs::create_dir_all(&tmp)?;
        build_skeleton(&tmp, host_root, &real_dirs, &etc)?;
        fs::write(tmp.join(".complete"), b"")?;
        let _ = fs::remove_dir_all(&skel);
        fs::rename(&tmp, &skel)?;
    }
    Ok(Rootfs {
        layers: vec![skel],
        binds,
    })
}

fn mkdir(root: &Path, p: &str, mode: u32) -> io::Result<()> {
    let path = root.join(p);
    fs::DirBuilder::new()
        .recursive(true)
        .mode(mode)
        .create(&path)?;
    fs::set_permissions(&path, fs::Permissions::from_mode(mode))
}

fn build_skeleton(
    root: &Path,
    host_root: &Path,
    real_dirs: &[&str],
    etc: &[&str],
) -> io::Result<()> {
    for (d, mode) in [
        ("usr", 0o755),
        ("etc", 0o755),
        ("home", 0o755),
        ("home/user", 0o755),
        ("root", 0o700),
        ("tmp", 0o1777),
        ("var", 0o755),
        ("var/tmp", 0o1777),
        ("var/lib", 0o755),
        ("var/cache", 0o755),
        ("var/log", 0o755),
        ("run", 0o755),
        ("proc", 0o555),
        ("sys", 0o555),
        ("dev", 0o755),
        ("mnt", 0o755),
        ("opt", 0o755),
        ("srv", 0o755),
    ] {
        mkdir(root, d, mode)?;
    }
    std::os::unix::fs::chown(root.join("home/user"), Some(1000), Some(1000))?;
    for name in TOP_LEVEL_SYSTEM {
        let hp = host_root.join(name);
        if real_dirs.contains(name) {
            mkdir(root, name, 0o755)?;
        } else if let Ok(target) = fs::read_link(&hp) {
            symlink(target, root.join(name))?;
        }
    }
    for (f, content) in [
        ("etc/passwd", PASSWD),
        ("etc/group", GROUP),
        ("etc/hosts", HOSTS),
        ("etc/hostname", "sandbox\n"),
        ("etc/nsswitch.conf", NSSWITCH),
        ("etc/resolv.conf", ""),
        ("etc/shells", "/bin/sh\n/bin/bash\n/usr/bin/bash\n"),
    ] {
        fs::write(root.join(f), content)?;
        fs::set_permissions(root.join(f), fs::Permissions::from_mode(0o644))?;
    }
    // os-release and localtime are symlinks into /usr on Debian; keep them so.
    for link in ["etc/os-release", "etc/localtime"] {
        if let Ok(target) = fs::read_link(host_root.join(link)) {
            symlink(target, root.join(link))?;
        }
    }
    // Mount points for the host's /etc parts: same kind (file or directory) as on the host.
    for p in etc {
        if host_root.join(p).is_dir() {
            mkdir(root, p, 0o755)?;
        } else {
            if let Some(parent) = Path::new(p).parent() {
                mkdir(root, &parent.to_string_lossy(), 0o755)?;
            }
            fs::write(root.join(p), b"")?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_skeleton_has_an_unprivileged_user_and_mount_points() {
        let dir = tempfile::tempdir().unwrap();
        let images = Images::prepare(dir.path(), None).unwrap();
        let Resolved::Host(root) = images.resolve("host", None).unwrap() else {
            panic!("host is built in")
        };
        let skel = &root.layers[0];
        let passwd = fs::read_to_string(skel.join("etc/passwd")).unwrap();
        assert!(passwd.contains("user:x:1000:1000:user:/home/user:/bin/bash"));
        assert!(skel.join("home/user").is_dir());
        assert!(root.binds.iter().any(|b| b.target == "/usr" && b.readonly));
        for b in &root.binds {
            let inside = skel.join(b.target.trim_start_matches('/'));
            assert!(
                inside.exists() || inside.is_symlink(),
                "no mount point for {}",
                b.target
            );
        }
        // Preparing again reuses the skeleton.
        Images::prepare(dir.path(), None).unwrap();
    }

    #[test]
    fn unknown_images_say_what_to_do() {
        let dir = tempfile::tempdir().unwrap();
        let store = dir.path().join("store");
        let images = Images::prepare(dir.path(), Some(&store)).unwrap();
        let err = images.resolve("py312", None).unwrap_err().to_string();
        assert!(err.contains("warren image ls"), "{err}");
        let err = images.resolve("host,py312", None).unwrap_err().to_string();
        assert!(err.contains("cannot be combined"), "{err}");
        let runtime = &images.layered_rootfs(&[]).layers[0];
        assert!(runtime.join("proc").is_dir() && runtime.join("etc/passwd").is_file());
    }
}
