//! File operations, performed with the acting user's file system identity.
//!
//! Each operation runs on a blocking thread that switches its fsuid/fsgid to the user
//! ([`warren_sys::creds::ActAs`]) for the duration: files it creates belong to that user, and
//! permission checks are theirs, so a path that a sandbox process planted (a symlink to
//! somewhere the user may not write) gives the user no more than they already had.

use std::fs;
use std::io;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::Path;

use warren_types::api::{FileEntry, FileKind};
use warren_types::path;

use crate::users::{self, User};
use crate::wire::OpError;

/// Checks a user-supplied path and resolves it against the user's home.
pub fn resolve(user: &User, p: &str) -> Result<String, OpError> {
    path::check_user_path(p).map_err(OpError::invalid)?;
    Ok(path::resolve(&user.home, p))
}

/// Runs `f` on a blocking thread as `user`.
pub async fn as_user<T: Send + 'static>(
    who: String,
    f: impl FnOnce(&User) -> Result<T, OpError> + Send + 'static,
) -> Result<T, OpError> {
    tokio::task::spawn_blocking(move || {
        let user = users::lookup(&who)?;
        let _as = warren_sys::creds::ActAs::new(user.uid, user.gid)
            .map_err(|e| OpError::io(&e, "switching to user", &who))?;
        f(&user)
    })
    .await
    .map_err(|e| {
        OpError::new(
            warren_types::ErrorCode::Internal,
            format!("file task failed: {e}"),
        )
    })?
}

/// Describes `path` without following a final symlink.
pub fn entry(path: &str) -> Result<FileEntry, OpError> {
    let md = fs::symlink_metadata(path).map_err(|e| OpError::io(&e, "stat", path))?;
    Ok(entry_from(path, &md))
}

fn entry_from(path: &str, md: &fs::Metadata) -> FileEntry {
    let ft = md.file_type();
    let kind = if ft.is_file() {
        FileKind::File
    } else if ft.is_dir() {
        FileKind::Dir
    } else if ft.is_symlink() {
        FileKind::Symlink
    } else {
        FileKind::Other
    };
    let link_target = ft
        .is_symlink()
        .then(|| {
            fs::read_link(path)
                .ok()
                .map(|t| t.to_string_lossy().into_owned())
        })
        .flatten();
    let name = Path::new(path)
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "/".to_string());
    FileEntry {
        name,
        path: path.to_string(),
        kind,
        size: md.len(),
        mode: md.mode() & 0o7777,
        uid: md.uid(),
        gid: md.gid(),
        modified: md.mtime(),
        link_target,
        metadata: metadata_of(path),
    }
}

/// The extended attributes that hold file metadata: `user.e2b.<key>` (E2B's envd names).
pub const METADATA_PREFIX: &str = "user.e2b.";

/// A file's metadata (not followed through a final symlink; bounded: at most
/// [`FILE_METADATA_MAX_KEYS`] keys, values longer than [`FILE_METADATA_MAX_VALUE`] or not
/// UTF-8 left out).
fn metadata_of(path: &str) -> std::collections::BTreeMap<String, String> {
    use warren_types::api::{FILE_METADATA_MAX_KEYS, FILE_METADATA_MAX_VALUE};
    let mut out = std::collections::BTreeMap::new();
    // Every entry of a listing comes here: most have few attributes or none, so a small
    // buffer first, the most a list can be (64 KiB) only when that is too small.
    let mut small = [0u8; 1024];
    let names = match rustix::fs::llistxattr(path, &mut small[..]) {
        Ok(n) => small[..n.min(small.len())].to_vec(),
        Err(rustix::io::Errno::RANGE) => {
            let mut big = vec![0u8; 64 * 1024];
            match rustix::fs::llistxattr(path, &mut big[..]) {
                Ok(n) => {
                    big.truncate(n.min(big.len()));
                    big
                }
                Err(_) => return out,
            }
        }
        Err(_) => return out,
    };
    if !names
        .windows(METADATA_PREFIX.len())
        .any(|w| w == METADATA_PREFIX.as_bytes())
    {
        return out;
    }
    let mut value = vec![0u8; FILE_METADATA_MAX_VALUE];
    for name in names.split(|b| *b == 0) {
        let Some(key) = name.strip_prefix(METADATA_PREFIX.as_bytes()) else {
            continue;
        };
        if key.is_empty() || out.len() >= FILE_METADATA_MAX_KEYS {
            continue;
        }
        if let Ok(m) = rustix::fs::lgetxattr(path, name, &mut value[..])
            && let (Ok(k), Ok(v)) = (std::str::from_utf8(key), std::str::from_utf8(&value[..m]))
        {
            out.insert(k.to_string(), v.to_string());
        }
    }
    out
}

/// `PROC_SUPER_MAGIC`.
const PROCFS: u32 = 0x9fa0;

/// Opens `path` for reading without waiting on it (a FIFO or a device planted there must not
/// hang the guest) and without following magic links (`/proc/*/fd/*`, `/proc/*/root`).
fn open_nonblocking(path: &str) -> Result<fs::File, OpError> {
    use std::os::fd::AsFd;
    let root = fs::File::open("/").map_err(|e| OpError::io(&e, "open", "/"))?;
    let rel = path.trim_start_matches('/');
    let rel = if rel.is_empty() { "." } else { rel };
    let fd = rustix::fs::openat2(
        root.as_fd(),
        rel,
        rustix::fs::OFlags::RDONLY
            | rustix::fs::OFlags::NONBLOCK
            | rustix::fs::OFlags::NOCTTY
            | rustix::fs::OFlags::CLOEXEC,
        rustix::fs::Mode::empty(),
        rustix::fs::ResolveFlags::NO_MAGICLINKS,
    )
    .map_err(|e| {
        if e == rustix::io::Errno::LOOP || e == rustix::io::Errno::XDEV {
            OpError::invalid(format!(
                "{path} goes through a /proc link, which the files API does not follow"
            ))
        } else {
            OpError::io(&e.into(), "open", path)
        }
    })?;
    Ok(fs::File::from(fd))
}

/// Opens a regular file for reading. Directories, FIFOs, devices and sockets are refused
/// before anything is read, and so is the kernel's `/proc` (read it with a command).
pub fn open_read(path: &str) -> Result<(fs::File, FileEntry), OpError> {
    let f = open_nonblocking(path)?;
    let md = f.metadata().map_err(|e| OpError::io(&e, "stat", path))?;
    if md.is_dir() {
        return Err(OpError::invalid(format!(
            "{path} is a directory: list it, or download a file inside it"
        )));
    }
    if !md.is_file() {
        return Err(OpError::invalid(format!(
            "{path} is not a regular file ({}): the files API reads regular files only",
            kind_name(&md)
        )));
    }
    if rustix::fs::fstatfs(&f).is_ok_and(|s| s.f_type as u32 == PROCFS) {
        return Err(OpError::invalid(format!(
            "{path} is in /proc: read the kernel's files with a command (cat), not the files API"
        )));
    }
    Ok((f, entry_from(path, &md)))
}

/// What kind of file `md` is, in words.
fn kind_name(md: &fs::Metadata) -> &'static str {
    use std::os::unix::fs::FileTypeExt;
    let t = md.file_type();
    if t.is_fifo() {
        "a FIFO"
    } else if t.is_char_device() {
        "a character device"
    } else if t.is_block_device() {
        "a block device"
    } else if t.is_socket() {
        "a socket"
    } else if t.is_dir() {
        "a directory"
    } else {
        "not a regular file"
    }
}

/// Refuses to write over anything but a regular file (or nothing, or a link, which is
/// replaced).
pub fn check_writable(path: &str) -> Result<(), OpError> {
    match fs::symlink_metadata(path) {
        Ok(md) if md.is_file() || md.file_type().is_symlink() => Ok(()),
        Ok(md) => Err(OpError::invalid(format!(
            "{path} is {}: the files API writes regular files only",
            kind_name(&md)
        ))),
        Err(_) => Ok(()),
    }
}

/// Reads a small regular file whole (at most `max` bytes), for the guest's own lookups
/// (`/etc/passwd`): a FIFO, device or huge file planted there is refused, never waited on.
pub fn read_small(path: &str, max: u64) -> Result<String, OpError> {
    use std::io::Read;
    let f = open_nonblocking(path)?;
    let md = f.metadata().map_err(|e| OpError::io(&e, "stat", path))?;
    if !md.is_file() {
        return Err(OpError::invalid(format!(
            "{path} is {}, not a regular file",
            kind_name(&md)
        )));
    }
    let mut s = String::new();
    f.take(max)
        .read_to_string(&mut s)
        .map_err(|e| OpError::io(&e, "read", path))?;
    Ok(s)
}

/// Opens (creating or truncating) a file for writing, making missing parent directories.
pub fn open_write(path: &str, mode: Option<u32>) -> Result<fs::File, OpError> {
    if let Some(parent) = Path::new(path).parent() {
        fs::DirBuilder::new()
            .recursive(true)
            .mode(0o755)
            .create(parent)
            .map_err(|e| OpError::io(&e, "creating parent directories of", path))?;
    }
    let f = fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(mode.unwrap_or(0o644))
        .open(path)
        .map_err(|e| OpError::io(&e, "open for writing", path))?;
    if let Some(m) = mode {
        // An existing file keeps its mode on open; apply the requested one.
        f.set_permissions(fs::Permissions::from_mode(m))
            .map_err(|e| OpError::io(&e, "chmod", path))?;
    }
    Ok(f)
}

/// Lists a directory, sorted by name.
pub fn list(path: &str) -> Result<Vec<FileEntry>, OpError> {
    let rd = fs::read_dir(path).map_err(|e| OpError::io(&e, "list", path))?;
    let mut out = Vec::new();
    for de in rd {
        let de = de.map_err(|e| OpError::io(&e, "list", path))?;
        let child = format!(
            "{}/{}",
            path.trim_end_matches('/'),
            de.file_name().to_string_lossy()
        );
        if let Ok(md) = fs::symlink_metadata(&child) {
            out.push(entry_from(&child, &md));
        }
    }
    out.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(out)
}

/// Removes a file, a symlink, or (with `recursive`) a directory tree.
pub fn remove(path: &str, recursive: bool) -> Result<(), OpError> {
    if path == "/" {
        return Err(OpError::invalid("refusing to remove /"));
    }
    let md = fs::symlink_metadata(path).map_err(|e| OpError::io(&e, "remove", path))?;
    let r = if md.is_dir() {
        if recursive {
            // Iterative, by descriptor: a tree 100,000 directories deep neither overflows the
            // guest's stack nor runs it out of descriptors.
            warren_fs::remove_path(Path::new(path))
        } else {
            fs::remove_dir(path)
        }
    } else {
        fs::remove_file(path)
    };
    r.map_err(|e| match e.kind() {
        io::ErrorKind::DirectoryNotEmpty => OpError::new(
            warren_types::ErrorCode::Conflict,
            format!("{path} is a directory that is not empty: pass recursive=true to remove it and its contents"),
        ),
        _ => OpError::io(&e, "remove", path),
    })
}

/// Makes a directory (and its parents with `parents`).
pub fn mkdir(path: &str, parents: bool) -> Result<FileEntry, OpError> {
    let r = fs::DirBuilder::new()
        .recursive(parents)
        .mode(0o755)
        .create(path);
    match r {
        Ok(()) => {}
        // `mkdir -p` semantics: an existing directory is fine when making parents.
        Err(e)
            if parents
                && e.kind() == io::ErrorKind::AlreadyExists
                && fs::metadata(path).is_ok_and(|m| m.is_dir()) => {}
        Err(e) => return Err(OpError::io(&e, "mkdir", path)),
    }
    entry(path)
}

/// Renames `from` to `to`, making missing parents of `to`.
pub fn rename(from: &str, to: &str) -> Result<FileEntry, OpError> {
    fs::symlink_metadata(from).map_err(|e| OpError::io(&e, "rename", from))?;
    if let Some(parent) = Path::new(to).parent() {
        fs::DirBuilder::new()
            .recursive(true)
            .mode(0o755)
            .create(parent)
            .map_err(|e| OpError::io(&e, "creating parent directories of", to))?;
    }
    fs::rename(from, to).map_err(|e| OpError::io(&e, &format!("rename {from} to"), to))?;
    entry(to)
}
