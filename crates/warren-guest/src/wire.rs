//! Reading and writing protocol frames on a connection.

use std::io;

use serde::Serialize;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use warren_types::error::ErrorCode;
use warren_types::guest::{self, FrameKind, Reply};

/// Reads one frame: its kind and payload. `None` at a clean end of stream.
pub async fn read_frame<R: AsyncRead + Unpin>(
    r: &mut R,
) -> io::Result<Option<(FrameKind, Vec<u8>)>> {
    let mut h = [0u8; guest::HEADER_LEN];
    match r.read_exact(&mut h).await {
        Ok(_) => {}
        Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(None),
        Err(e) => return Err(e),
    }
    let (kind, len) =
        guest::decode_header(h).map_err(|m| io::Error::new(io::ErrorKind::InvalidData, m))?;
    let mut payload = vec![0u8; len];
    r.read_exact(&mut payload).await?;
    Ok(Some((kind, payload)))
}

/// Writes one frame.
pub async fn write_frame<W: AsyncWrite + Unpin>(
    w: &mut W,
    kind: FrameKind,
    payload: &[u8],
) -> io::Result<()> {
    w.write_all(&guest::encode_header(kind, payload.len()))
        .await?;
    w.write_all(payload).await
}

/// Writes a JSON message frame.
pub async fn write_msg<W: AsyncWrite + Unpin, T: Serialize>(w: &mut W, msg: &T) -> io::Result<()> {
    w.write_all(&guest::encode_message(msg)).await
}

/// A failed operation, as the guest reports it.
#[derive(Debug)]
pub struct OpError {
    pub code: ErrorCode,
    pub message: String,
}

impl OpError {
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        OpError {
            code,
            message: message.into(),
        }
    }

    pub fn invalid(message: impl Into<String>) -> Self {
        Self::new(ErrorCode::InvalidArgument, message)
    }

    /// An I/O error on `path`, with a code that says whose fault it was.
    pub fn io(e: &io::Error, what: &str, path: &str) -> Self {
        let code = match e.kind() {
            io::ErrorKind::NotFound => ErrorCode::FileNotFound,
            io::ErrorKind::PermissionDenied => ErrorCode::PermissionDenied,
            io::ErrorKind::AlreadyExists | io::ErrorKind::DirectoryNotEmpty => ErrorCode::Conflict,
            io::ErrorKind::NotADirectory
            | io::ErrorKind::IsADirectory
            | io::ErrorKind::InvalidInput
            | io::ErrorKind::InvalidFilename
            | io::ErrorKind::ReadOnlyFilesystem
            | io::ErrorKind::CrossesDevices => ErrorCode::InvalidArgument,
            io::ErrorKind::StorageFull
            | io::ErrorKind::QuotaExceeded
            | io::ErrorKind::FileTooLarge => ErrorCode::PayloadTooLarge,
            _ => ErrorCode::Internal,
        };
        OpError::new(code, format!("{what} {path}: {e}"))
    }

    pub fn reply(self) -> Reply {
        Reply::Error {
            code: self.code,
            message: self.message,
        }
    }
}
