//! Files in a sandbox: read, write, upload and download, list, stat, mkdir, rename, remove.
//!
//! Paths are absolute or relative to the acting user's home; operations act as the
//! sandbox's `user` unless the handle was made with [`Sandbox::as_user`].

use std::path::Path;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use futures_util::{Stream, StreamExt, TryStreamExt};
use reqwest::Method;
use reqwest::header::{CONTENT_LENGTH, CONTENT_TYPE};
use tokio::io::AsyncWriteExt;
use warren_types::api::{FileEntry, FileList, MkdirRequest, RenameRequest};

use crate::Sandbox;
use crate::client::read_json;
use crate::error::{Error, Result};

/// Chunk size for reading a local file during an upload.
const UPLOAD_CHUNK: usize = 256 * 1024;

/// A file's contents as they arrive, with what the server said about the file.
pub struct FileStream {
    size: Option<u64>,
    mode: Option<u32>,
    inner: Pin<Box<dyn Stream<Item = Result<Bytes>> + Send>>,
}

impl std::fmt::Debug for FileStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FileStream")
            .field("size", &self.size)
            .field("mode", &self.mode)
            .finish_non_exhaustive()
    }
}

impl FileStream {
    /// The file's size in bytes, as the server announced it.
    pub fn size(&self) -> Option<u64> {
        self.size
    }

    /// The file's permission bits, e.g. `0o644`, as the server announced them.
    pub fn mode(&self) -> Option<u32> {
        self.mode
    }
}

impl Stream for FileStream {
    type Item = Result<Bytes>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.inner.as_mut().poll_next(cx)
    }
}

impl Sandbox {
    /// A file's contents (`GET /v1/sandboxes/{id}/files`), all in memory; for large files use
    /// [`read_file_stream`](Self::read_file_stream) or [`download_file`](Self::download_file).
    pub async fn read_file(&self, path: &str) -> Result<Bytes> {
        let resp = self.file_request(Method::GET, "", path, &[]).await?;
        resp.bytes().await.map_err(Error::Transport)
    }

    /// A file's contents as a stream of chunks.
    pub async fn read_file_stream(&self, path: &str) -> Result<FileStream> {
        let resp = self.file_request(Method::GET, "", path, &[]).await?;
        let header = |name: &str| {
            resp.headers()
                .get(name)
                .and_then(|v| v.to_str().ok())
                .map(str::to_string)
        };
        let size = header("x-warren-file-size").and_then(|v| v.parse().ok());
        let mode = header("x-warren-file-mode").and_then(|v| u32::from_str_radix(&v, 8).ok());
        let inner = resp.bytes_stream().map_err(Error::Transport);
        Ok(FileStream {
            size,
            mode,
            inner: Box::pin(inner),
        })
    }

    /// Downloads a file to a local path, streaming; returns the bytes written. The local
    /// file is removed again if the download fails part way.
    pub async fn download_file(&self, path: &str, local: impl AsRef<Path>) -> Result<u64> {
        let local = local.as_ref();
        let mut stream = self.read_file_stream(path).await?;
        let mut file = tokio::fs::File::create(local)
            .await
            .map_err(|e| local_error("create", local, e))?;
        let mut written = 0u64;
        let copied: Result<()> = async {
            while let Some(chunk) = stream.next().await {
                let chunk = chunk?;
                file.write_all(&chunk)
                    .await
                    .map_err(|e| local_error("write", local, e))?;
                written += chunk.len() as u64;
            }
            file.flush()
                .await
                .map_err(|e| local_error("write", local, e))
        }
        .await;
        if let Err(e) = copied {
            drop(file);
            let _ = tokio::fs::remove_file(local).await;
            return Err(e);
        }
        Ok(written)
    }

    /// Writes a file (`PUT /v1/sandboxes/{id}/files`), replacing it if it exists and making
    /// missing parent directories.
    pub async fn write_file(&self, path: &str, data: impl Into<Bytes>) -> Result<FileEntry> {
        self.put_file(path, None, reqwest::Body::from(data.into()), None)
            .await
    }

    /// Like [`write_file`](Self::write_file), with permission bits such as `0o755`.
    pub async fn write_file_with_mode(
        &self,
        path: &str,
        data: impl Into<Bytes>,
        mode: u32,
    ) -> Result<FileEntry> {
        self.put_file(path, Some(mode), reqwest::Body::from(data.into()), None)
            .await
    }

    /// Writes a file from a body as it comes (a stream of chunks: `reqwest::Body::wrap_stream`),
    /// replacing it if it exists; `len`, when known, lets the server refuse an upload over
    /// its limit before any byte is sent.
    pub async fn write_file_body(
        &self,
        path: &str,
        body: reqwest::Body,
        len: Option<u64>,
    ) -> Result<FileEntry> {
        self.put_file(path, None, body, len).await
    }

    /// Starts watching directory `path` (and, `recursive`, the directories below it) for
    /// changes; returns the watch's id.
    pub async fn watch_dir(&self, path: &str, recursive: bool) -> Result<u64> {
        self.watch(&warren_types::api::WatchRequest {
            path: path.to_string(),
            recursive,
            user: None,
            entries: false,
        })
        .await
    }

    /// Starts a watch as `req` says (the handle's user when it names none); returns its id.
    pub async fn watch(&self, req: &warren_types::api::WatchRequest) -> Result<u64> {
        let mut body = req.clone();
        if body.user.is_none() {
            body.user = self.user().map(str::to_string);
        }
        let rb = self
            .client()
            .request(reqwest::Method::POST, self.endpoint("/watches", &[])?)
            .json(&body);
        let w: warren_types::api::WatchInfo = self.client().json(rb).await?;
        Ok(w.watch_id)
    }

    /// A watch's changes since the last call, waiting up to `wait` (at most a minute) for
    /// the first when there is none.
    pub async fn watch_events(
        &self,
        watch_id: u64,
        wait: Option<std::time::Duration>,
    ) -> Result<warren_types::api::WatchEvents> {
        let secs = wait.map(|t| t.as_secs_f64().min(60.0).to_string());
        let query: Vec<(&str, &str)> = secs.iter().map(|s| ("wait", s.as_str())).collect();
        let url = self.endpoint(&format!("/watches/{watch_id}/events"), &query)?;
        let rb = self.client().request(reqwest::Method::GET, url);
        self.client().json(rb).await
    }

    /// Stops a watch.
    pub async fn unwatch(&self, watch_id: u64) -> Result<()> {
        let url = self.endpoint(&format!("/watches/{watch_id}"), &[])?;
        let rb = self.client().request(reqwest::Method::DELETE, url);
        self.client().empty(rb).await
    }

    /// Uploads a local file to `path`, streaming it, with permission bits `mode` (the
    /// server's default when `None`). A directory is refused: copy its files one by one.
    pub async fn upload_file(
        &self,
        local: impl AsRef<Path>,
        path: &str,
        mode: Option<u32>,
    ) -> Result<FileEntry> {
        let local = local.as_ref();
        let file = tokio::fs::File::open(local)
            .await
            .map_err(|e| local_error("open", local, e))?;
        let meta = file
            .metadata()
            .await
            .map_err(|e| local_error("read", local, e))?;
        if meta.is_dir() {
            return Err(Error::Invalid(format!(
                "{} is a directory: uploading directories is not supported yet; upload its \
                 files one by one, or pack it into a tar file first",
                local.display()
            )));
        }
        let len = meta.is_file().then_some(meta.len());
        let stream = tokio_util::io::ReaderStream::with_capacity(file, UPLOAD_CHUNK);
        self.put_file(path, mode, reqwest::Body::wrap_stream(stream), len)
            .await
    }

    /// Unpacks a tar archive (`body`) into the directory `path` in the sandbox, creating it
    /// (`PUT .../files/tar`). Files belong to the acting user.
    pub async fn upload_tar(&self, path: &str, body: reqwest::Body) -> Result<()> {
        let url = self.file_url("/tar", path, &[])?;
        let rb = self
            .client()
            .request(Method::PUT, url)
            .header(CONTENT_TYPE, "application/x-tar")
            .body(body);
        self.client().empty(rb).await
    }

    /// Copies a local directory's contents into the directory `path` in the sandbox (made if
    /// missing), as one tar stream: modes, links, times; the files belong to the acting user.
    /// Sockets, device nodes and FIFOs are not copied into a sandbox.
    pub async fn upload_dir(&self, local: impl AsRef<Path>, path: &str) -> Result<()> {
        let local = local.as_ref();
        let md = std::fs::metadata(local).map_err(|e| local_error("read", local, e))?;
        if !md.is_dir() {
            return Err(Error::Invalid(format!(
                "{} is not a directory: use upload_file for a file",
                local.display()
            )));
        }
        let tar = crate::tarball::tar_dir(local);
        self.upload_tar(path, reqwest::Body::wrap_stream(tar)).await
    }

    /// Copies the sandbox directory `path`'s contents into the local directory `local` (made
    /// if missing), as one tar stream; returns the bytes of file data written. The archive
    /// comes from the sandbox, so it is unpacked with care: only files, directories and links
    /// are made, none outside `local`, none through a link, without owners or set-id bits.
    pub async fn download_dir(&self, path: &str, local: impl AsRef<Path>) -> Result<u64> {
        let local = local.as_ref().to_path_buf();
        let resp = self.file_request(Method::GET, "/tar", path, &[]).await?;
        let (tx, rx) = tokio::sync::mpsc::channel::<Bytes>(8);
        let dest = local.clone();
        let unpacking = tokio::task::spawn_blocking(move || {
            crate::tarball::unpack_local(ChanReader::new(rx), &dest)
        });
        let mut stream = resp.bytes_stream();
        let mut fed: Result<()> = Ok(());
        while let Some(chunk) = stream.next().await {
            match chunk {
                Ok(c) => {
                    if tx.send(c).await.is_err() {
                        break; // the unpacking stopped: its error says why
                    }
                }
                Err(e) => {
                    fed = Err(Error::Transport(e));
                    break;
                }
            }
        }
        drop(tx);
        let unpacked = unpacking
            .await
            .map_err(|e| Error::Invalid(format!("unpacking into {}: {e}", local.display())))?;
        fed?;
        unpacked.map_err(|e| local_error("unpack into", &local, e))
    }

    /// What a directory holds (`GET .../files/list`), sorted by name.
    pub async fn list_dir(&self, path: &str) -> Result<Vec<FileEntry>> {
        let resp = self.file_request(Method::GET, "/list", path, &[]).await?;
        let list: FileList = read_json(resp).await?;
        Ok(list.entries)
    }

    /// What is at `path` (`GET .../files/stat`); a symlink is described, not followed.
    pub async fn stat(&self, path: &str) -> Result<FileEntry> {
        let resp = self.file_request(Method::GET, "/stat", path, &[]).await?;
        read_json(resp).await
    }

    /// Makes a directory and any missing parents (`POST .../files/mkdir`).
    pub async fn mkdir(&self, path: &str) -> Result<FileEntry> {
        let body = MkdirRequest {
            path: path.to_string(),
            parents: true,
            user: self.user().map(str::to_string),
        };
        let rb = self
            .client()
            .request(Method::POST, self.endpoint("/files/mkdir", &[])?)
            .json(&body);
        self.client().json(rb).await
    }

    /// Renames (moves) a file or directory (`POST .../files/rename`).
    pub async fn rename(&self, from: &str, to: &str) -> Result<FileEntry> {
        let body = RenameRequest {
            from: from.to_string(),
            to: to.to_string(),
            user: self.user().map(str::to_string),
        };
        let rb = self
            .client()
            .request(Method::POST, self.endpoint("/files/rename", &[])?)
            .json(&body);
        self.client().json(rb).await
    }

    /// Removes a file, or with `recursive` a directory and everything in it.
    pub async fn remove(&self, path: &str, recursive: bool) -> Result<()> {
        let extra: &[(&str, &str)] = if recursive {
            &[("recursive", "true")]
        } else {
            &[]
        };
        self.file_request(Method::DELETE, "", path, extra)
            .await
            .map(drop)
    }

    async fn put_file(
        &self,
        path: &str,
        mode: Option<u32>,
        body: reqwest::Body,
        len: Option<u64>,
    ) -> Result<FileEntry> {
        self.put_file_with(path, mode, &Default::default(), body, len)
            .await
    }

    /// Writes a file from a streamed body, setting `metadata` on it (see
    /// [`FileEntry::metadata`](warren_types::api::FileEntry)).
    pub async fn write_file_body_with_metadata(
        &self,
        path: &str,
        metadata: &std::collections::BTreeMap<String, String>,
        body: reqwest::Body,
    ) -> Result<FileEntry> {
        self.put_file_with(path, None, metadata, body, None).await
    }

    async fn put_file_with(
        &self,
        path: &str,
        mode: Option<u32>,
        metadata: &std::collections::BTreeMap<String, String>,
        body: reqwest::Body,
        len: Option<u64>,
    ) -> Result<FileEntry> {
        let mode = mode.map(mode_param).transpose()?;
        let meta = (!metadata.is_empty())
            .then(|| serde_json::to_string(metadata))
            .transpose()
            .map_err(|e| Error::Invalid(format!("metadata: {e}")))?;
        let mut extra: Vec<(&str, &str)> = mode.iter().map(|m| ("mode", m.as_str())).collect();
        extra.extend(meta.iter().map(|m| ("metadata", m.as_str())));
        let url = self.file_url("", path, &extra)?;
        let mut rb = self
            .client()
            .request(Method::PUT, url)
            .header(CONTENT_TYPE, "application/octet-stream")
            .body(body);
        if let Some(len) = len {
            // Lets the server refuse an upload over its limit before any byte is sent.
            rb = rb.header(CONTENT_LENGTH, len);
        }
        self.client().json(rb).await
    }

    async fn file_request(
        &self,
        method: Method,
        rest: &str,
        path: &str,
        extra: &[(&str, &str)],
    ) -> Result<reqwest::Response> {
        let url = self.file_url(rest, path, extra)?;
        self.client().send(self.client().request(method, url)).await
    }

    /// `.../files{rest}?path=...&user=...` plus `extra`.
    fn file_url(&self, rest: &str, path: &str, extra: &[(&str, &str)]) -> Result<reqwest::Url> {
        if path.is_empty() {
            return Err(Error::Invalid(
                "no path given: name a file in the sandbox, e.g. /tmp/out.txt".into(),
            ));
        }
        let mut query = vec![("path", path)];
        if let Some(user) = self.user() {
            query.push(("user", user));
        }
        query.extend_from_slice(extra);
        self.endpoint(&format!("/files{rest}"), &query)
    }
}

/// Reads what a channel of chunks brings, until it closes (on a blocking thread).
struct ChanReader {
    rx: tokio::sync::mpsc::Receiver<Bytes>,
    cur: Bytes,
}

impl ChanReader {
    fn new(rx: tokio::sync::mpsc::Receiver<Bytes>) -> ChanReader {
        ChanReader {
            rx,
            cur: Bytes::new(),
        }
    }
}

impl std::io::Read for ChanReader {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        while self.cur.is_empty() {
            match self.rx.blocking_recv() {
                Some(c) => self.cur = c,
                None => return Ok(0),
            }
        }
        let n = buf.len().min(self.cur.len());
        buf[..n].copy_from_slice(&self.cur[..n]);
        bytes::Buf::advance(&mut self.cur, n);
        Ok(n)
    }
}

/// The `mode` parameter for permission bits: octal, e.g. `755`.
fn mode_param(mode: u32) -> Result<String> {
    if mode > 0o7777 {
        return Err(Error::Invalid(format!(
            "mode {mode:#o} is not permission bits: give at most 0o7777, e.g. 0o644 or 0o755"
        )));
    }
    Ok(format!("{mode:o}"))
}

fn local_error(op: &'static str, path: &Path, source: std::io::Error) -> Error {
    Error::Local {
        op,
        path: path.to_path_buf(),
        source,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sandbox() -> Sandbox {
        let client = crate::Client::new("http://127.0.0.1:1", None).unwrap();
        client.sandbox("abcdef0123456789wxyz").unwrap()
    }

    fn query(url: &reqwest::Url) -> Vec<(String, String)> {
        url.query_pairs().into_owned().collect()
    }

    #[test]
    fn file_urls_carry_path_user_and_extras() {
        let url = sandbox().file_url("/stat", "/tmp/a b", &[]).unwrap();
        assert_eq!(url.path(), "/v1/sandboxes/abcdef0123456789wxyz/files/stat");
        assert_eq!(query(&url), vec![("path".into(), "/tmp/a b".into())]);

        let url = sandbox()
            .as_user("root")
            .file_url("", "x", &[("recursive", "true")])
            .unwrap();
        assert_eq!(
            query(&url),
            vec![
                ("path".into(), "x".into()),
                ("user".into(), "root".into()),
                ("recursive".into(), "true".into())
            ]
        );
        assert!(matches!(
            sandbox().file_url("", "", &[]),
            Err(Error::Invalid(_))
        ));
    }

    #[test]
    fn modes_are_sent_in_octal() {
        assert_eq!(mode_param(0o755).unwrap(), "755");
        assert_eq!(mode_param(0o4755).unwrap(), "4755");
        assert_eq!(mode_param(0).unwrap(), "0");
        assert!(matches!(mode_param(0o10000), Err(Error::Invalid(_))));
    }

    #[tokio::test]
    async fn uploading_a_directory_is_refused_before_any_request() {
        let dir = std::env::temp_dir();
        let err = sandbox()
            .upload_file(&dir, "/tmp/x", None)
            .await
            .unwrap_err();
        assert!(matches!(err, Error::Invalid(_)), "{err:?}");
        assert!(err.to_string().contains("is a directory"), "{err}");
        let missing = dir.join("warren-sdk-no-such-file");
        let err = sandbox()
            .upload_file(&missing, "/tmp/x", None)
            .await
            .unwrap_err();
        assert!(err.to_string().starts_with("cannot open "), "{err}");
    }
}
