//! Moving files in and out of a sandbox through its guest agent.

use bytes::Bytes;
use futures_util::{Stream, StreamExt};
use warren_types::ByteSize;
use warren_types::api::FileEntry;
use warren_types::guest::{FrameKind, Op, Reply};
use warren_types::id::SandboxId;

use crate::error::NodeError;
use crate::exec::{guest_failure, unexpected};
use crate::guest_client::{GuestError, Incoming};
use crate::node::Node;
use crate::trajectory::log::{Key, Outcome};

fn user_or_default(user: Option<String>) -> String {
    user.unwrap_or_else(|| "user".to_string())
}

fn too_large(limit: u64) -> NodeError {
    NodeError::TooLarge(format!(
        "the upload is larger than the {} allowed (max_upload)",
        ByteSize(limit)
    ))
}

fn check(path: &str) -> Result<(), NodeError> {
    warren_types::path::check_user_path(path).map_err(NodeError::Invalid)
}

/// A file being downloaded: its entry, then its content as a stream.
pub type Download = (
    FileEntry,
    std::pin::Pin<Box<dyn Stream<Item = Result<Bytes, std::io::Error>> + Send>>,
);

impl Node {
    /// Opens a file for download.
    pub async fn read_file(
        &self,
        id: &SandboxId,
        path: String,
        user: Option<String>,
    ) -> Result<Download, NodeError> {
        check(&path)?;
        self.download(
            id,
            Op::ReadFile {
                path,
                user: user_or_default(user),
            },
        )
        .await
    }

    /// Packs a directory as a tar stream.
    pub async fn download_tar(
        &self,
        id: &SandboxId,
        path: String,
        user: Option<String>,
    ) -> Result<Download, NodeError> {
        check(&path)?;
        self.download(
            id,
            Op::DownloadTar {
                path,
                user: user_or_default(user),
            },
        )
        .await
    }

    /// An operation answered by an entry, then data frames ended by an empty one.
    async fn download(&self, id: &SandboxId, op: Op) -> Result<Download, NodeError> {
        let (sb, mut conn) = self.open(id, op).await?;
        let entry = match conn.reply().await.map_err(|e| guest_failure(&sb, e))? {
            Reply::Entry(e) => e,
            other => return Err(unexpected(other)),
        };
        let stream = futures_util::stream::unfold(Some(conn), |conn| async move {
            let mut conn = conn?;
            match conn.next().await {
                Ok(Some(Incoming::Data(FrameKind::Data, d))) if d.is_empty() => None,
                Ok(Some(Incoming::Data(FrameKind::Data, d))) => {
                    Some((Ok(Bytes::from(d)), Some(conn)))
                }
                Ok(Some(Incoming::Reply(Reply::Error { message, .. }))) => {
                    Some((Err(std::io::Error::other(message)), None))
                }
                Ok(_) => Some((Err(std::io::Error::other("the transfer ended early")), None)),
                Err(e) => Some((Err(std::io::Error::other(e.to_string())), None)),
            }
        });
        Ok((entry, Box::pin(stream)))
    }

    /// Writes a file from a stream of bytes, at most `max_upload` of them. The file appears
    /// under its name only when complete.
    pub async fn write_file<S, E>(
        &self,
        id: &SandboxId,
        path: String,
        user: Option<String>,
        mode: Option<u32>,
        metadata: std::collections::BTreeMap<String, String>,
        mut body: S,
    ) -> Result<FileEntry, NodeError>
    where
        S: Stream<Item = Result<Bytes, E>> + Unpin,
        E: std::fmt::Display,
    {
        check(&path)?;
        if mode.is_some_and(|m| m > 0o7777) {
            return Err(NodeError::Invalid(
                "mode must be permission bits, at most 0o7777 (4095)".into(),
            ));
        }
        let sb = self.get(id)?;
        if !sb.record.trajectory {
            return self
                .write_file_live(id, path, user, mode, metadata, body)
                .await;
        }
        // Recorded: the upload is streamed into a blob file beside the log (never held in
        // memory), hashed on the way, then written into the sandbox from that file.
        let limit = self.cfg.max_upload.bytes();
        let host = |e: std::io::Error| NodeError::host("keeping the upload for the trajectory", e);
        let (blob, file) = sb.trajectory.blob_file().map_err(host)?;
        let mut file = tokio::fs::File::from_std(file);
        let mut hash = <sha2::Sha256 as sha2::Digest>::new();
        let mut size = 0u64;
        let copied: Result<(), NodeError> = async {
            use tokio::io::AsyncWriteExt;
            while let Some(chunk) = body.next().await {
                let chunk =
                    chunk.map_err(|e| NodeError::Invalid(format!("reading the upload: {e}")))?;
                size += chunk.len() as u64;
                if size > limit {
                    drain(&mut body, limit.saturating_mul(2).max(DRAIN_MIN)).await;
                    return Err(too_large(limit));
                }
                sha2::Digest::update(&mut hash, &chunk);
                file.write_all(&chunk).await.map_err(host)?;
            }
            file.flush().await.map_err(host)
        }
        .await;
        drop(file);
        if let Err(e) = copied {
            let _ = std::fs::remove_file(&blob);
            return Err(e);
        }
        let digest: String = sha2::Digest::finalize(hash)
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        let user = user_or_default(user);
        let key = Key::WriteFile {
            path: &path,
            user: &user,
            mode,
            sha256: &digest,
        };
        if let Some(Outcome::Hit(_)) = sb.trajectory.replay_step(&key) {
            // Written already when the trajectory was re-applied.
            sb.trajectory.record_write(&key, &blob, size);
            return self.stat(id, path.clone(), Some(user.clone())).await;
        }
        let from = tokio::fs::File::open(&blob).await.map_err(host)?;
        let stream = tokio_util::io::ReaderStream::new(from);
        let entry = self
            .write_file_live(id, path.clone(), Some(user.clone()), mode, metadata, stream)
            .await;
        match entry {
            Ok(entry) => {
                sb.trajectory.record_write(&key, &blob, size);
                Ok(entry)
            }
            Err(e) => {
                let _ = std::fs::remove_file(&blob);
                Err(e)
            }
        }
    }

    /// Writes a file from a stream, with no trajectory bookkeeping.
    pub(crate) async fn write_file_live<S, E>(
        &self,
        id: &SandboxId,
        path: String,
        user: Option<String>,
        mode: Option<u32>,
        metadata: std::collections::BTreeMap<String, String>,
        body: S,
    ) -> Result<FileEntry, NodeError>
    where
        S: Stream<Item = Result<Bytes, E>> + Unpin,
        E: std::fmt::Display,
    {
        let op = Op::WriteFile {
            path,
            user: user_or_default(user),
            mode,
            metadata,
        };
        self.upload(id, op, body).await
    }

    /// Unpacks a tar stream into a directory (not recorded in the trajectory log).
    pub async fn upload_tar<S, E>(
        &self,
        id: &SandboxId,
        path: String,
        user: Option<String>,
        body: S,
    ) -> Result<FileEntry, NodeError>
    where
        S: Stream<Item = Result<Bytes, E>> + Unpin,
        E: std::fmt::Display,
    {
        check(&path)?;
        self.upload(
            id,
            Op::UploadTar {
                path,
                user: user_or_default(user),
            },
            body,
        )
        .await
    }

    /// An operation fed by data frames (at most `max_upload` bytes, ended by an empty one) and
    /// answered by an entry.
    async fn upload<S, E>(
        &self,
        id: &SandboxId,
        op: Op,
        mut body: S,
    ) -> Result<FileEntry, NodeError>
    where
        S: Stream<Item = Result<Bytes, E>> + Unpin,
        E: std::fmt::Display,
    {
        let limit = self.cfg.max_upload.bytes();
        let (sb, mut conn) = self.open(id, op).await?;
        let mut total = 0u64;
        while let Some(chunk) = body.next().await {
            let chunk =
                chunk.map_err(|e| NodeError::Invalid(format!("reading the upload: {e}")))?;
            total += chunk.len() as u64;
            if total > limit {
                // Dropping the connection without the end frame discards a partial file.
                drop(conn);
                drain(&mut body, limit.saturating_mul(2).max(DRAIN_MIN)).await;
                return Err(too_large(limit));
            }
            if !chunk.is_empty() && conn.send(FrameKind::Data, &chunk).await.is_err() {
                // The guest refused early (permission denied, disk quota exceeded) and hung
                // up: its reply says why, once the client has finished sending.
                drain(&mut body, (limit - total).max(DRAIN_MIN)).await;
                break;
            }
        }
        let _ = conn.send(FrameKind::Data, &[]).await;
        match conn.reply().await.map_err(|e| guest_failure(&sb, e))? {
            Reply::Entry(e) => Ok(e),
            other => Err(unexpected(other)),
        }
    }

    /// Lists a directory.
    pub async fn list_dir(
        &self,
        id: &SandboxId,
        path: String,
        user: Option<String>,
    ) -> Result<Vec<FileEntry>, NodeError> {
        check(&path)?;
        match self
            .one(
                id,
                Op::List {
                    path,
                    user: user_or_default(user),
                },
            )
            .await?
        {
            Reply::Entries { entries } => Ok(entries),
            other => Err(unexpected(other)),
        }
    }

    /// Describes a path.
    pub async fn stat(
        &self,
        id: &SandboxId,
        path: String,
        user: Option<String>,
    ) -> Result<FileEntry, NodeError> {
        check(&path)?;
        self.entry(
            id,
            Op::Stat {
                path,
                user: user_or_default(user),
            },
        )
        .await
    }

    /// Makes a directory.
    pub async fn mkdir(
        &self,
        id: &SandboxId,
        path: String,
        user: Option<String>,
        parents: bool,
    ) -> Result<FileEntry, NodeError> {
        check(&path)?;
        self.entry(
            id,
            Op::Mkdir {
                path,
                user: user_or_default(user),
                parents,
            },
        )
        .await
    }

    /// Starts watching a directory.
    pub async fn watch_create(
        &self,
        id: &SandboxId,
        req: warren_types::api::WatchRequest,
    ) -> Result<u64, NodeError> {
        check(&req.path)?;
        if req.path.is_empty() {
            return Err(NodeError::Invalid(
                "path: name the directory to watch".into(),
            ));
        }
        let op = Op::WatchCreate {
            path: req.path,
            user: user_or_default(req.user),
            recursive: req.recursive,
            entries: req.entries,
        };
        let (sb, mut conn) = self.open(id, op).await?;
        match conn.reply().await.map_err(|e| guest_failure(&sb, e))? {
            Reply::Watch { watch } => Ok(watch),
            other => Err(unexpected(other)),
        }
    }

    /// A watch's events since the last call, waiting up to `wait_ms` for the first.
    pub async fn watch_events(
        &self,
        id: &SandboxId,
        watch: u64,
        wait_ms: u64,
    ) -> Result<warren_types::api::WatchEvents, NodeError> {
        let (sb, mut conn) = self.open(id, Op::WatchEvents { watch, wait_ms }).await?;
        match conn.reply().await.map_err(|e| guest_failure(&sb, e))? {
            Reply::FsEvents { events, overflowed } => {
                Ok(warren_types::api::WatchEvents { events, overflowed })
            }
            other => Err(unexpected(other)),
        }
    }

    /// Stops a watch.
    pub async fn watch_remove(&self, id: &SandboxId, watch: u64) -> Result<(), NodeError> {
        self.simple(id, Op::WatchRemove { watch }).await
    }

    /// Renames a path.
    pub async fn rename(
        &self,
        id: &SandboxId,
        from: String,
        to: String,
        user: Option<String>,
    ) -> Result<FileEntry, NodeError> {
        check(&from)?;
        check(&to)?;
        self.entry(
            id,
            Op::Rename {
                from,
                to,
                user: user_or_default(user),
            },
        )
        .await
    }

    /// Removes a path.
    pub async fn remove(
        &self,
        id: &SandboxId,
        path: String,
        user: Option<String>,
        recursive: bool,
    ) -> Result<(), NodeError> {
        check(&path)?;
        self.simple(
            id,
            Op::Remove {
                path,
                user: user_or_default(user),
                recursive,
            },
        )
        .await
    }

    async fn entry(&self, id: &SandboxId, op: Op) -> Result<FileEntry, NodeError> {
        match self.one(id, op).await? {
            Reply::Entry(e) => Ok(e),
            other => Err(unexpected(other)),
        }
    }

    async fn one(&self, id: &SandboxId, op: Op) -> Result<Reply, NodeError> {
        let (sb, mut conn) = self.open(id, op).await?;
        conn.reply()
            .await
            .map_err(|e: GuestError| guest_failure(&sb, e))
    }
}

/// The least of an upload refused midway that is read (and discarded) before answering.
const DRAIN_MIN: u64 = 64 << 20;

/// Reads and discards what is left of an upload (at most `up_to` more bytes), so that a client
/// still sending gets the answer rather than a broken connection.
async fn drain<S, E>(body: &mut S, up_to: u64)
where
    S: Stream<Item = Result<Bytes, E>> + Unpin,
{
    let mut left = up_to;
    while let Some(Ok(chunk)) = body.next().await {
        match left.checked_sub(chunk.len() as u64) {
            Some(l) => left = l,
            None => break,
        }
    }
}
