//! Whole directories in and out of a sandbox as tar streams, with the acting user's identity.
//!
//! Packing and unpacking run on a blocking thread (as the user, see [`crate::files::as_user`]);
//! the connection's data frames reach it through a bounded channel, so a large tree streams
//! without being held in memory.

use std::ffi::{OsStr, OsString};
use std::io::{self, Read, Write};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::PathBuf;

use rustix::fs::{FileType, Mode, OFlags};

use tokio::sync::mpsc;

use crate::wire::OpError;

/// Chunks queued between the connection and the tar thread.
const QUEUE: usize = 16;
/// Size of a chunk the packer sends.
const CHUNK: usize = 256 * 1024;

/// A `Read` over chunks arriving from the connection.
pub struct ChunkReader {
    rx: mpsc::Receiver<Vec<u8>>,
    buf: Vec<u8>,
    pos: usize,
}

impl Read for ChunkReader {
    fn read(&mut self, out: &mut [u8]) -> io::Result<usize> {
        while self.pos == self.buf.len() {
            match self.rx.blocking_recv() {
                Some(chunk) => {
                    self.buf = chunk;
                    self.pos = 0;
                }
                None => return Ok(0),
            }
        }
        let n = out.len().min(self.buf.len() - self.pos);
        out[..n].copy_from_slice(&self.buf[self.pos..self.pos + n]);
        self.pos += n;
        Ok(n)
    }
}

/// A `Write` that sends chunks to the connection.
pub struct ChunkWriter {
    tx: mpsc::Sender<Vec<u8>>,
    buf: Vec<u8>,
}

impl Write for ChunkWriter {
    fn write(&mut self, data: &[u8]) -> io::Result<usize> {
        self.buf.extend_from_slice(data);
        if self.buf.len() >= CHUNK {
            self.flush()?;
        }
        Ok(data.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        if !self.buf.is_empty() {
            let chunk = std::mem::take(&mut self.buf);
            self.tx
                .blocking_send(chunk)
                .map_err(|_| io::Error::new(io::ErrorKind::BrokenPipe, "the client went away"))?;
        }
        Ok(())
    }
}

/// A channel for an upload: the sender for the connection, the reader for the unpacker.
pub fn upload_channel() -> (mpsc::Sender<Vec<u8>>, ChunkReader) {
    let (tx, rx) = mpsc::channel(QUEUE);
    (
        tx,
        ChunkReader {
            rx,
            buf: Vec::new(),
            pos: 0,
        },
    )
}

/// A channel for a download: the writer for the packer, the receiver for the connection.
pub fn download_channel() -> (ChunkWriter, mpsc::Receiver<Vec<u8>>) {
    let (tx, rx) = mpsc::channel(QUEUE);
    (
        ChunkWriter {
            tx,
            buf: Vec::new(),
        },
        rx,
    )
}

/// Unpacks `input` into `dir` (made if missing), by descriptor: each entry is made relative
/// to its directory, opened from `dir` one component at a time, so an entry that climbs out
/// (`..`, an absolute name) or goes through a symbolic link (one the archive made a moment
/// before, or one the agent swaps in meanwhile) is refused with a 400. Symbolic links
/// themselves may point anywhere, as any the user makes with `ln -s` can; hard links must
/// name an entry inside `dir`; device nodes are refused. Files replace what was there
/// (removed first, never written through). An upload that fails removes the entries it had
/// made (what it replaced stays replaced; parent directories it made for them stay).
/// Directories get their modes once everything is in (a read-only one would refuse its own
/// entries), through descriptors opened the same way. It all happens as the user, so nothing is written that
/// they could not write.
pub fn unpack(input: impl Read, dir: &str) -> Result<(), OpError> {
    std::fs::create_dir_all(dir).map_err(|e| OpError::io(&e, "creating", dir))?;
    let mut root = warren_fs::Beneath::open(std::path::Path::new(dir))
        .map_err(|e| OpError::io(&e, "opening", dir))?;
    let fs = rustix::fs::fstatfs(root.root()).map_err(|e| OpError::io(&e.into(), "statfs", dir))?;
    if fs.f_type as i64 == PROCFS {
        return Err(OpError::invalid(format!(
            "{dir} is in /proc, which the files API does not write"
        )));
    }
    let mut made: Vec<PathBuf> = Vec::new();
    let result = unpack_entries(input, dir, &mut root, &mut made);
    if result.is_err() {
        for rel in made.iter().rev() {
            if let Ok((parent, name)) = root.parent(rel, None) {
                let _ = rustix::fs::unlinkat(parent, name, rustix::fs::AtFlags::empty()).or_else(
                    |_| rustix::fs::unlinkat(parent, name, rustix::fs::AtFlags::REMOVEDIR),
                );
            }
            root.forget();
        }
    }
    result
}

fn unpack_entries(
    input: impl Read,
    dir: &str,
    root: &mut warren_fs::Beneath,
    made: &mut Vec<PathBuf>,
) -> Result<(), OpError> {
    let mut archive = tar::Archive::new(input);
    let entries = archive
        .entries()
        .map_err(|e| OpError::invalid(format!("not a tar stream: {e}")))?;
    let mut dir_modes: Vec<(PathBuf, u32)> = Vec::new();
    for entry in entries {
        let mut entry = entry.map_err(|e| OpError::invalid(format!("corrupt tar stream: {e}")))?;
        let raw = entry
            .path()
            .map_err(|e| OpError::invalid(format!("a tar entry has a bad name: {e}")))?
            .into_owned();
        let name = raw.display().to_string();
        let outside = || {
            OpError::invalid(format!(
                "tar entry {name} would land outside {dir}: refused"
            ))
        };
        let rel = warren_fs::check_relative(&raw).map_err(|_| outside())?;
        if rel.as_os_str().is_empty() {
            continue; // "./": the directory itself
        }
        let header = entry.header();
        let kind = header.entry_type();
        let mode = header.mode().unwrap_or(0o644) & 0o7777;
        let mtime = header.mtime().ok();
        let link = match kind {
            tar::EntryType::Symlink | tar::EntryType::Link => Some(
                entry
                    .link_name()
                    .ok()
                    .flatten()
                    .map(|l| l.into_owned())
                    .ok_or_else(|| OpError::invalid(format!("tar link {name} names no target")))?,
            ),
            _ => None,
        };
        // A hard link's target: an entry already inside, reached without links.
        let link_dir = match (kind, &link) {
            (tar::EntryType::Link, Some(target)) => {
                let t = warren_fs::check_relative(target).map_err(|_| {
                    OpError::invalid(format!(
                        "tar hard link {name} points outside {dir}: refused"
                    ))
                })?;
                let parent = t.parent().unwrap_or(std::path::Path::new(""));
                let fd = warren_fs::open_dir_beneath(root.root(), parent).map_err(|e| {
                    OpError::invalid(format!("tar hard link {name}: {}: {e}", t.display()))
                })?;
                let file = t.file_name().map(|n| n.to_os_string()).ok_or_else(|| {
                    OpError::invalid(format!("tar hard link {name} names no file"))
                })?;
                Some((fd, file))
            }
            _ => None,
        };
        let content_err = |e: io::Error| {
            if e.kind() == io::ErrorKind::InvalidInput {
                OpError::invalid(format!("tar entry {name}: {e}"))
            } else {
                OpError::io(&e, &format!("unpacking {name} into"), dir)
            }
        };
        let (parent, file) = root.parent(&rel, Some(0o755)).map_err(content_err)?;
        let existing = rustix::fs::statat(parent, file, rustix::fs::AtFlags::SYMLINK_NOFOLLOW)
            .ok()
            .map(|st| FileType::from_raw_mode(st.st_mode));
        let errno = |e: rustix::io::Errno| content_err(e.into());
        if kind == tar::EntryType::Directory {
            match existing {
                Some(FileType::Directory) => {}
                Some(_) => {
                    return Err(OpError::invalid(format!(
                        "tar entry {name} is a directory where {dir} has something else"
                    )));
                }
                None => {
                    rustix::fs::mkdirat(parent, file, Mode::from_raw_mode(0o700)).map_err(errno)?;
                    made.push(rel.clone());
                    dir_modes.push((rel, mode));
                }
            }
            continue;
        }
        // Anything else replaces what is there (never written through), but not a directory.
        match existing {
            Some(FileType::Directory) => {
                return Err(OpError::invalid(format!(
                    "tar entry {name} would replace a directory of {dir}: refused"
                )));
            }
            Some(_) => {
                rustix::fs::unlinkat(parent, file, rustix::fs::AtFlags::empty()).map_err(errno)?
            }
            None => {}
        }
        let times = |when: Option<u64>| {
            when.map(|t| {
                let ts = rustix::fs::Timespec {
                    tv_sec: t as i64,
                    tv_nsec: 0,
                };
                rustix::fs::Timestamps {
                    last_access: ts,
                    last_modification: ts,
                }
            })
        };
        match kind {
            tar::EntryType::Regular | tar::EntryType::Continuous | tar::EntryType::GNUSparse => {
                let fd = rustix::fs::openat(
                    parent,
                    file,
                    OFlags::WRONLY
                        | OFlags::CREATE
                        | OFlags::EXCL
                        | OFlags::NOFOLLOW
                        | OFlags::CLOEXEC,
                    Mode::from_raw_mode(0o600),
                )
                .map_err(errno)?;
                made.push(rel.clone());
                let mut f = std::fs::File::from(fd);
                io::copy(&mut entry, &mut f).map_err(content_err)?;
                rustix::fs::fchmod(&f, Mode::from_raw_mode(mode)).map_err(errno)?;
                if let Some(ts) = times(mtime) {
                    rustix::fs::futimens(&f, &ts).map_err(errno)?;
                }
            }
            tar::EntryType::Symlink => {
                let target = link.unwrap_or_default();
                rustix::fs::symlinkat(target.as_os_str(), parent, file).map_err(errno)?;
                made.push(rel.clone());
                if let Some(ts) = times(mtime) {
                    let _ = rustix::fs::utimensat(
                        parent,
                        file,
                        &ts,
                        rustix::fs::AtFlags::SYMLINK_NOFOLLOW,
                    );
                }
            }
            tar::EntryType::Link => {
                let Some((from_dir, from)) = link_dir else {
                    return Err(OpError::invalid(format!(
                        "tar hard link {name} names no target"
                    )));
                };
                rustix::fs::linkat(&from_dir, &from, parent, file, rustix::fs::AtFlags::empty())
                    .map_err(|e| {
                        OpError::invalid(format!(
                            "tar hard link {name}: {}: {}",
                            from.to_string_lossy(),
                            io::Error::from(e)
                        ))
                    })?;
                made.push(rel.clone());
            }
            tar::EntryType::Fifo => {
                rustix::fs::mknodat(parent, file, FileType::Fifo, Mode::from_raw_mode(mode), 0)
                    .map_err(errno)?;
                made.push(rel.clone());
            }
            tar::EntryType::Char | tar::EntryType::Block => {
                return Err(OpError::invalid(format!(
                    "tar entry {name} is a device node, which uploads do not make"
                )));
            }
            // Headers tar reads itself (long names, pax records) and kinds with no file.
            _ => {}
        }
    }
    // Deepest first, so that a read-only parent is the last to close.
    for (rel, mode) in dir_modes.iter().rev() {
        root.forget();
        let fd = root
            .dir(rel, None)
            .map_err(|e| OpError::invalid(format!("tar directory {}: {e}", rel.display())))?;
        rustix::fs::fchmod(fd, Mode::from_raw_mode(*mode)).map_err(|e| {
            OpError::io(&e.into(), "setting the mode of", &rel.display().to_string())
        })?;
    }
    Ok(())
}

/// `PROC_SUPER_MAGIC`.
const PROCFS: i64 = 0x9fa0;

/// One directory being packed: its descriptor, its name in the archive, the names still to do.
struct Level {
    fd: OwnedFd,
    name: PathBuf,
    pending: Vec<OsString>,
}

/// Packs the contents of `dir` into `out`, by descriptor: each entry is looked at and opened
/// relative to its directory without following a link, and a file is read only if it is, at
/// open, the regular file that was looked at. An agent swapping entries for links to the
/// guest's own `/proc` files (which the guest's identity could read) gets its links packed
/// as links; a FIFO packs as a FIFO, never read.
pub fn pack(dir: &str, out: impl Write) -> Result<(), OpError> {
    let top = rustix::fs::open(
        dir,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| {
        if e == rustix::io::Errno::NOTDIR || e == rustix::io::Errno::LOOP {
            OpError::invalid(format!("{dir} is not a directory"))
        } else {
            OpError::io(&e.into(), "opening", dir)
        }
    })?;
    let fs = rustix::fs::fstatfs(&top).map_err(|e| OpError::io(&e.into(), "statfs", dir))?;
    if fs.f_type as i64 == PROCFS {
        return Err(OpError::invalid(format!(
            "{dir} is in /proc, which the files API does not read (read it with a command)"
        )));
    }
    let io_err = |e: io::Error| OpError::io(&e, "packing", dir);
    let mut b = tar::Builder::new(out);
    let st = rustix::fs::fstat(&top).map_err(|e| io_err(e.into()))?;
    let mut h = header(&st, tar::EntryType::Directory, 0);
    b.append_data(&mut h, "./", io::empty()).map_err(io_err)?;
    let mut stack = vec![Level {
        pending: names(top.as_fd()).map_err(io_err)?,
        fd: top,
        name: PathBuf::from("."),
    }];
    while let Some(level) = stack.last_mut() {
        let Some(name) = level.pending.pop() else {
            stack.pop();
            continue;
        };
        let d = level.fd.as_fd();
        let path = level.name.join(&name);
        // Gone meanwhile: skipped, as a walk of a changing tree would.
        let Ok(entry) = warren_fs::meta::open_entry(d, &name) else {
            continue;
        };
        let st = rustix::fs::fstat(&entry).map_err(|e| io_err(e.into()))?;
        match FileType::from_raw_mode(st.st_mode) {
            FileType::Directory => {
                let Ok(fd) = rustix::fs::openat(
                    d,
                    &name,
                    OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
                    Mode::empty(),
                ) else {
                    continue;
                };
                let mut h = header(&st, tar::EntryType::Directory, 0);
                b.append_data(&mut h, &path, io::empty()).map_err(io_err)?;
                let pending = names(fd.as_fd()).map_err(io_err)?;
                stack.push(Level {
                    fd,
                    name: path,
                    pending,
                });
            }
            FileType::RegularFile => {
                let Ok(fd) = rustix::fs::openat(
                    d,
                    &name,
                    OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::CLOEXEC,
                    Mode::empty(),
                ) else {
                    continue;
                };
                let now = rustix::fs::fstat(&fd).map_err(|e| io_err(e.into()))?;
                if FileType::from_raw_mode(now.st_mode) != FileType::RegularFile
                    || (now.st_dev, now.st_ino) != (st.st_dev, st.st_ino)
                {
                    continue; // swapped between the look and the open
                }
                let size = now.st_size as u64;
                let mut h = header(&now, tar::EntryType::Regular, size);
                let data = Exactly {
                    inner: std::fs::File::from(fd).take(size),
                    left: size,
                };
                b.append_data(&mut h, &path, data).map_err(io_err)?;
            }
            FileType::Symlink => {
                let Ok(target) = rustix::fs::readlinkat(d, &name, Vec::new()) else {
                    continue;
                };
                let mut h = header(&st, tar::EntryType::Symlink, 0);
                let target = OsStr::from_bytes(target.as_bytes());
                b.append_link(&mut h, &path, target).map_err(io_err)?;
            }
            kind @ (FileType::Fifo | FileType::CharacterDevice | FileType::BlockDevice) => {
                let t = match kind {
                    FileType::Fifo => tar::EntryType::Fifo,
                    FileType::CharacterDevice => tar::EntryType::Char,
                    _ => tar::EntryType::Block,
                };
                let mut h = header(&st, t, 0);
                let dev = st.st_rdev;
                h.set_device_major(rustix::fs::major(dev))
                    .and_then(|()| h.set_device_minor(rustix::fs::minor(dev)))
                    .map_err(io_err)?;
                b.append_data(&mut h, &path, io::empty()).map_err(io_err)?;
            }
            // Sockets mean nothing outside the sandbox.
            _ => {}
        }
    }
    let mut out = b.into_inner().map_err(io_err)?;
    out.flush().map_err(|e| OpError::io(&e, "sending", dir))
}

/// A tar header for an entry of `kind` with `st`'s owner, mode and time.
fn header(st: &rustix::fs::Stat, kind: tar::EntryType, size: u64) -> tar::Header {
    let mut h = tar::Header::new_gnu();
    h.set_entry_type(kind);
    h.set_size(size);
    h.set_mode(st.st_mode & 0o7777);
    h.set_uid(u64::from(st.st_uid));
    h.set_gid(u64::from(st.st_gid));
    h.set_mtime(st.st_mtime.max(0) as u64);
    h
}

/// The names in a directory, sorted, in reverse for popping.
fn names(dir: BorrowedFd<'_>) -> io::Result<Vec<OsString>> {
    let mut out = warren_fs::names(dir)?;
    out.sort_unstable_by(|a, b| b.cmp(a));
    Ok(out)
}

/// Exactly `left` bytes: a file that shrank while it was read is padded with zeros (the
/// header already promised its size), one that grew is cut at it.
struct Exactly<R> {
    inner: R,
    left: u64,
}

impl<R: Read> Read for Exactly<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if self.left == 0 {
            return Ok(0);
        }
        let want = buf.len().min(self.left as usize);
        let n = match self.inner.read(&mut buf[..want])? {
            0 => {
                buf[..want].fill(0);
                want
            }
            n => n,
        };
        self.left -= n as u64;
        Ok(n)
    }
}
