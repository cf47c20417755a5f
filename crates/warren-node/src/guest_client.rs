//! The node's side of the guest protocol: one connection per operation.

use std::io;
use std::path::Path;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::UnixStream;
use tokio::net::unix::{OwnedReadHalf, OwnedWriteHalf};
use warren_types::guest::{self, FrameKind, Hello, Op, PROTOCOL_VERSION, Reply, Request};

/// How long the guest may take to greet us.
const HELLO_TIMEOUT: Duration = Duration::from_secs(10);

/// Something the guest sent.
#[derive(Debug)]
pub enum Incoming {
    /// A JSON reply.
    Reply(Reply),
    /// Raw bytes: output or file data.
    Data(FrameKind, Vec<u8>),
}

/// Why talking to the guest failed.
#[derive(Debug, thiserror::Error)]
pub enum GuestError {
    /// The socket could not be reached (the sandbox is gone or its init died).
    #[error("cannot reach the guest agent: {0}")]
    Connect(#[source] io::Error),
    /// The guest broke the protocol or speaks another version.
    #[error("guest protocol: {0}")]
    Protocol(String),
    /// The connection ended early.
    #[error("the guest agent closed the connection")]
    Closed,
    /// The guest did not greet in time (a node under load, or a guest starved of CPU).
    #[error("no hello from the guest agent within {0} s")]
    NoHello(u64),
}

/// An open operation on a guest.
pub struct GuestConn {
    r: BufReader<OwnedReadHalf>,
    w: OwnedWriteHalf,
    /// Keeps the sandbox marked busy (for the idle timeout) while the operation runs.
    busy: Option<crate::node::Busy>,
}

impl GuestConn {
    /// Connects, sends `op`, and checks the guest's hello.
    pub async fn open(socket: &Path, op: Op) -> Result<GuestConn, GuestError> {
        let stream = UnixStream::connect(socket)
            .await
            .map_err(GuestError::Connect)?;
        let (r, mut w) = stream.into_split();
        let req = Request {
            protocol: PROTOCOL_VERSION,
            op,
        };
        // Sent before the hello arrives: the handshake costs no round trip.
        w.write_all(&guest::encode_message(&req))
            .await
            .map_err(|_| GuestError::Closed)?;
        let mut conn = GuestConn {
            r: BufReader::with_capacity(64 * 1024, r),
            w,
            busy: None,
        };
        let hello = tokio::time::timeout(HELLO_TIMEOUT, conn.frame())
            .await
            .map_err(|_| GuestError::NoHello(10))??;
        match hello {
            Some((FrameKind::Message, payload)) => {
                let h: Hello = serde_json::from_slice(&payload)
                    .map_err(|e| GuestError::Protocol(format!("bad hello: {e}")))?;
                if h.protocol != PROTOCOL_VERSION {
                    return Err(GuestError::Protocol(format!(
                        "the guest agent speaks protocol {} (agent {}), this node speaks {PROTOCOL_VERSION}",
                        h.protocol, h.agent
                    )));
                }
                Ok(conn)
            }
            Some(_) => Err(GuestError::Protocol(
                "the guest did not start with a hello".into(),
            )),
            None => Err(GuestError::Closed),
        }
    }

    /// Counts the operation as the sandbox's activity for as long as it runs.
    pub(crate) fn hold(mut self, busy: crate::node::Busy) -> Self {
        self.busy = Some(busy);
        self
    }

    async fn frame(&mut self) -> Result<Option<(FrameKind, Vec<u8>)>, GuestError> {
        let mut header = [0u8; guest::HEADER_LEN];
        if let Err(e) = self.r.read_exact(&mut header).await {
            return if e.kind() == io::ErrorKind::UnexpectedEof {
                Ok(None)
            } else {
                Err(GuestError::Closed)
            };
        }
        let (kind, len) = guest::decode_header(header).map_err(GuestError::Protocol)?;
        let mut payload = vec![0u8; len];
        self.r
            .read_exact(&mut payload)
            .await
            .map_err(|_| GuestError::Closed)?;
        Ok(Some((kind, payload)))
    }

    /// The next thing the guest sends; `None` when it closed the connection.
    pub async fn next(&mut self) -> Result<Option<Incoming>, GuestError> {
        match self.frame().await? {
            None => Ok(None),
            Some((FrameKind::Message, payload)) => serde_json::from_slice(&payload)
                .map(|r| Some(Incoming::Reply(r)))
                .map_err(|e| GuestError::Protocol(format!("bad reply: {e}"))),
            Some((kind, data)) => Ok(Some(Incoming::Data(kind, data))),
        }
    }

    /// The next reply, skipping nothing: data here is a protocol error.
    pub async fn reply(&mut self) -> Result<Reply, GuestError> {
        match self.next().await? {
            Some(Incoming::Reply(r)) => Ok(r),
            Some(Incoming::Data(..)) => {
                Err(GuestError::Protocol("expected a reply, got data".into()))
            }
            None => Err(GuestError::Closed),
        }
    }

    /// Sends a data frame (stdin or file content; empty = end).
    pub async fn send(&mut self, kind: FrameKind, data: &[u8]) -> Result<(), GuestError> {
        for chunk in data
            .chunks(guest::MAX_FRAME)
            .chain(data.is_empty().then_some(&[][..]))
        {
            self.w
                .write_all(&guest::encode_header(kind, chunk.len()))
                .await
                .map_err(|_| GuestError::Closed)?;
            self.w
                .write_all(chunk)
                .await
                .map_err(|_| GuestError::Closed)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use tokio::io::AsyncWriteExt;
    use warren_types::guest::{Hello, Op, encode_message};

    use super::*;

    /// A guest that speaks another protocol version is refused with both versions named.
    #[tokio::test]
    async fn a_guest_of_another_protocol_version_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("g.sock");
        let listener = tokio::net::UnixListener::bind(&path).unwrap();
        tokio::spawn(async move {
            let (mut s, _) = listener.accept().await.unwrap();
            let hello = Hello {
                protocol: PROTOCOL_VERSION + 1,
                agent: "9.9.9".into(),
            };
            s.write_all(&encode_message(&hello)).await.unwrap();
        });
        let err = GuestConn::open(&path, Op::Ping)
            .await
            .err()
            .expect("refused");
        let msg = err.to_string();
        assert!(
            msg.contains(&format!("protocol {}", PROTOCOL_VERSION + 1)) && msg.contains("9.9.9"),
            "{msg}"
        );
    }
}
