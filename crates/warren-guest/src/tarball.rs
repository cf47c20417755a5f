//! Whole directories in and out of a sandbox as tar streams, with the acting user's identity.
//!
//! Packing and unpacking run on a blocking thread (as the user, see [`crate::files::as_user`]);
//! the connection's data frames reach it through a bounded channel, so a large tree streams
//! without being held in memory.

use std::io::{self, Read, Write};
use std::path::Path;

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

/// Unpacks `input` into `dir` (made if missing). An entry that would land outside `dir` (a
/// `..` path, or a path through a symlink unpacked earlier) is refused; symlinks themselves may
/// point anywhere, as any the user makes with `ln -s` can. It all happens as the user, so
/// nothing is written that they could not write.
pub fn unpack(input: impl Read, dir: &str) -> Result<(), OpError> {
    std::fs::create_dir_all(dir).map_err(|e| OpError::io(&e, "creating", dir))?;
    let mut archive = tar::Archive::new(input);
    archive.set_preserve_permissions(true);
    archive.set_preserve_mtime(true);
    archive.set_overwrite(true);
    let entries = archive
        .entries()
        .map_err(|e| OpError::invalid(format!("not a tar stream: {e}")))?;
    for entry in entries {
        let mut entry = entry.map_err(|e| OpError::invalid(format!("corrupt tar stream: {e}")))?;
        let name = entry
            .path()
            .map(|p| p.display().to_string())
            .unwrap_or_default();
        let unpacked = entry
            .unpack_in(dir)
            .map_err(|e| OpError::io(&e, &format!("unpacking {name} into"), dir))?;
        if !unpacked {
            return Err(OpError::invalid(format!(
                "tar entry {name} would land outside {dir}: refused"
            )));
        }
    }
    Ok(())
}

/// Packs the contents of `dir` into `out`.
pub fn pack(dir: &str, out: impl Write) -> Result<(), OpError> {
    if !Path::new(dir).is_dir() {
        return Err(OpError::invalid(format!("{dir} is not a directory")));
    }
    let mut b = tar::Builder::new(out);
    b.follow_symlinks(false);
    b.append_dir_all(".", dir)
        .map_err(|e| OpError::io(&e, "packing", dir))?;
    let mut out = b
        .into_inner()
        .map_err(|e| OpError::io(&e, "packing", dir))?;
    out.flush().map_err(|e| OpError::io(&e, "sending", dir))
}
