//! envd's files: `GET`/`POST /files` (a file's bytes; multipart, octet-stream and gzip
//! uploads) and the `filesystem.Filesystem` service (`Stat`, `MakeDir`, `Move`, `ListDir`,
//! `Remove`, and watches: the `WatchDir` stream and the `CreateWatcher`/`GetWatcherEvents`/
//! `RemoveWatcher` calls), onto Warren's file operations and directory watches as the acting
//! user. Relative paths are under the user's home, as envd has them.

use std::collections::VecDeque;

use axum::body::{Body, Bytes};
use axum::extract::Multipart;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::{Value, json};
use warren_sdk::{FileEntry, FileKind, Sandbox};

use crate::connect::{Code, Error};
use crate::process::{unary, warren_error};

/// Largest upload, per request (streamed to Warren, never held whole).
pub const MAX_UPLOAD: usize = 8 << 30;
/// Most entries one `ListDir` answers.
const MAX_ENTRIES: usize = 10_000;

/// The user's home, where relative paths and `~` lead.
fn home(sb: &Sandbox) -> String {
    match sb.user() {
        Some("root") => "/root".into(),
        Some(u) if !u.contains('/') => format!("/home/{u}"),
        _ => "/home/user".into(),
    }
}

/// `path` made absolute the way envd does.
pub(crate) fn resolve(sb: &Sandbox, path: &str) -> String {
    if path.starts_with('/') {
        path.to_string()
    } else if path == "~" {
        home(sb)
    } else if let Some(rest) = path.strip_prefix("~/") {
        format!("{}/{rest}", home(sb))
    } else if path.is_empty() {
        home(sb)
    } else {
        format!("{}/{path}", home(sb))
    }
}

fn owner(id: u32) -> String {
    match id {
        0 => "root".into(),
        1000 => "user".into(),
        n => n.to_string(),
    }
}

fn permissions(kind: FileKind, mode: u32) -> String {
    let mut s = String::with_capacity(10);
    s.push(match kind {
        FileKind::Dir => 'd',
        FileKind::Symlink => 'l',
        _ => '-',
    });
    for shift in [6, 3, 0] {
        let m = (mode >> shift) & 7;
        s.push(if m & 4 != 0 { 'r' } else { '-' });
        s.push(if m & 2 != 0 { 'w' } else { '-' });
        s.push(if m & 1 != 0 { 'x' } else { '-' });
    }
    s
}

pub(crate) fn rfc3339(secs: i64) -> String {
    // Days from the civil date algorithm (proleptic Gregorian, UTC).
    let days = secs.div_euclid(86_400);
    let rem = secs.rem_euclid(86_400);
    let (h, mi, s) = (rem / 3600, (rem % 3600) / 60, rem % 60);
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!("{y:04}-{m:02}-{d:02}T{h:02}:{mi:02}:{s:02}Z")
}

/// envd's `EntryInfo`.
fn entry(e: &FileEntry) -> Value {
    let kind = match e.kind {
        FileKind::Dir => "FILE_TYPE_DIRECTORY",
        _ => "FILE_TYPE_FILE",
    };
    let mut v = json!({
        "name": e.name,
        "type": kind,
        "path": e.path,
        "size": e.size.to_string(),
        "mode": e.mode,
        "permissions": permissions(e.kind, e.mode),
        "owner": owner(e.uid),
        "group": owner(e.gid),
        "modifiedTime": rfc3339(e.modified),
    });
    if let Some(t) = &e.link_target {
        v["symlinkTarget"] = json!(t);
    }
    if !e.metadata.is_empty() {
        v["metadata"] = json!(e.metadata);
    }
    v
}

/// Upload metadata: the `X-Metadata-<key>` headers (keys lower-cased, as envd stores them).
pub(crate) type Metadata = std::collections::BTreeMap<String, String>;

/// envd's `WriteInfo` for a file written.
fn write_info(path: &str, metadata: &Metadata) -> Value {
    let name = path.rsplit('/').next().unwrap_or("");
    let mut v = json!({"path": path, "name": name, "type": "file"});
    if !metadata.is_empty() {
        v["metadata"] = json!(metadata);
    }
    v
}

#[derive(Debug, Deserialize)]
struct PathRequest {
    path: String,
    #[serde(default)]
    depth: Option<u32>,
}

#[derive(Debug, Deserialize)]
struct MoveRequest {
    source: String,
    destination: String,
}

/// `WatchDir` and `CreateWatcher`.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct WatchRequest {
    path: String,
    #[serde(default)]
    recursive: bool,
    #[serde(default)]
    include_entry: bool,
    /// Accepted: Warren watches whatever the path is on (a sandbox sees no network mounts
    /// unless it made them itself).
    #[serde(default)]
    #[allow(dead_code)]
    allow_network_mounts: bool,
}

impl WatchRequest {
    /// Warren's watch for this request, of `path` resolved.
    fn warren(&self, sb: &Sandbox) -> warren_sdk::WatchRequest {
        warren_sdk::WatchRequest {
            path: resolve(sb, &self.path),
            recursive: self.recursive,
            user: None,
            entries: self.include_entry,
        }
    }
}

/// `GetWatcherEvents` and `RemoveWatcher`.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct WatcherRequest {
    watcher_id: String,
}

impl WatcherRequest {
    fn id(&self) -> Result<u64, Error> {
        self.watcher_id.parse().map_err(|_| {
            Error::new(
                Code::NotFound,
                format!("watcher {:?} not found", self.watcher_id),
            )
        })
    }
}

/// envd's `FilesystemEvent`.
fn fs_event(e: &warren_sdk::FsEvent) -> Value {
    use warren_sdk::FsEventKind::*;
    let kind = match e.kind {
        Create => "EVENT_TYPE_CREATE",
        Write => "EVENT_TYPE_WRITE",
        Remove => "EVENT_TYPE_REMOVE",
        Rename => "EVENT_TYPE_RENAME",
        Chmod => "EVENT_TYPE_CHMOD",
    };
    let mut v = json!({ "name": e.path, "type": kind });
    if let Some(entry_info) = &e.entry {
        v["entry"] = entry(entry_info);
    }
    v
}

/// `WatchDir`: a watch as a stream (`start`, then each change, keepalives on silence); the
/// watch is removed when the client leaves.
pub(crate) async fn watch_stream(
    sb: Sandbox,
    keepalive: std::time::Duration,
    body: Bytes,
) -> Response {
    let r: WatchRequest = match crate::connect::stream_request(&body) {
        Ok(r) => r,
        Err(e) => return crate::process::stream_error(e),
    };
    let id = match sb.watch(&r.warren(&sb)).await {
        Ok(id) => id,
        Err(e) => return crate::process::stream_error(warren_error(e)),
    };
    let (tx, rx) = tokio::sync::mpsc::channel::<Bytes>(16);
    tokio::spawn(async move {
        let send = |v: Value| {
            let tx = tx.clone();
            async move { tx.send(crate::connect::message(&v)).await.is_ok() }
        };
        // `WatchDirResponse` holds its oneof (`start`, `filesystem`, `keepalive`) directly: no
        // `event` field around it, unlike a process's events.
        let mut end = None;
        if send(json!({"start": {}})).await {
            loop {
                let got = tokio::select! {
                    g = sb.watch_events(id, Some(keepalive)) => g,
                    () = tx.closed() => break,
                };
                match got {
                    Ok(got) if got.events.is_empty() => {
                        if !send(json!({"keepalive": {}})).await {
                            break;
                        }
                    }
                    Ok(got) => {
                        let mut open = true;
                        for e in &got.events {
                            open = send(json!({"filesystem": fs_event(e)})).await;
                            if !open {
                                break;
                            }
                        }
                        if !open {
                            break;
                        }
                    }
                    Err(e) => {
                        end = Some(warren_error(e));
                        break;
                    }
                }
            }
        }
        let _ = tx.send(crate::connect::end_stream(end.as_ref())).await;
        drop(tx);
        let _ = sb.unwatch(id).await;
    });
    crate::process::stream_body(rx)
}

/// `POST /filesystem.Filesystem/<method>`.
pub(crate) async fn filesystem(sb: Sandbox, method: &str, body: Bytes) -> Response {
    let body: &[u8] = if body.is_empty() { b"{}" } else { &body };
    unary(
        async {
            match method {
                "Stat" => {
                    let r: PathRequest = crate::connect::json(body)?;
                    let e = sb
                        .stat(&resolve(&sb, &r.path))
                        .await
                        .map_err(warren_error)?;
                    Ok(json!({ "entry": entry(&e) }))
                }
                "MakeDir" => {
                    let r: PathRequest = crate::connect::json(body)?;
                    let path = resolve(&sb, &r.path);
                    match sb.stat(&path).await {
                        Ok(_) => {
                            return Err(Error::new(
                                Code::AlreadyExists,
                                format!("{path} already exists"),
                            ));
                        }
                        Err(e) if e.is_not_found() => {}
                        Err(e) => return Err(warren_error(e)),
                    }
                    let e = sb.mkdir(&path).await.map_err(warren_error)?;
                    Ok(json!({ "entry": entry(&e) }))
                }
                "Move" => {
                    let r: MoveRequest = crate::connect::json(body)?;
                    let e = sb
                        .rename(&resolve(&sb, &r.source), &resolve(&sb, &r.destination))
                        .await
                        .map_err(warren_error)?;
                    Ok(json!({ "entry": entry(&e) }))
                }
                "Remove" => {
                    let r: PathRequest = crate::connect::json(body)?;
                    sb.remove(&resolve(&sb, &r.path), true)
                        .await
                        .map_err(warren_error)?;
                    Ok(json!({}))
                }
                "ListDir" => {
                    let r: PathRequest = crate::connect::json(body)?;
                    let depth = r.depth.unwrap_or(1).max(1);
                    let mut out = Vec::new();
                    let mut queue = VecDeque::from([(resolve(&sb, &r.path), 1u32)]);
                    while let Some((dir, level)) = queue.pop_front() {
                        for e in sb.list_dir(&dir).await.map_err(warren_error)? {
                            if out.len() >= MAX_ENTRIES {
                                return Err(Error::new(
                                    Code::FailedPrecondition,
                                    format!(
                                        "more than {MAX_ENTRIES} entries: list less deep, or a \
                                         smaller directory"
                                    ),
                                ));
                            }
                            if e.kind == FileKind::Dir && level < depth {
                                queue.push_back((e.path.clone(), level + 1));
                            }
                            out.push(entry(&e));
                        }
                    }
                    Ok(json!({ "entries": out }))
                }
                "CreateWatcher" => {
                    let r: WatchRequest = crate::connect::json(body)?;
                    let id = sb.watch(&r.warren(&sb)).await.map_err(warren_error)?;
                    Ok(json!({ "watcherId": id.to_string() }))
                }
                "GetWatcherEvents" => {
                    let r: WatcherRequest = crate::connect::json(body)?;
                    let got = sb.watch_events(r.id()?, None).await.map_err(warren_error)?;
                    let events: Vec<Value> = got.events.iter().map(fs_event).collect();
                    Ok(json!({ "events": events }))
                }
                "RemoveWatcher" => {
                    let r: WatcherRequest = crate::connect::json(body)?;
                    sb.unwatch(r.id()?).await.map_err(warren_error)?;
                    Ok(json!({}))
                }
                other => Err(Error::new(
                    Code::Unimplemented,
                    format!("filesystem.Filesystem has no method {other:?}"),
                )),
            }
        }
        .await,
    )
}

use crate::json_error as http_error;

fn from_warren(e: warren_sdk::Error) -> Response {
    // A call made on behalf of a token's key: Warren's 401 is that key gone (revoked,
    // expired), the caller's to fix, and its message says so.
    let status = match &e {
        warren_sdk::Error::Api { status: 401, .. } => axum::http::StatusCode::UNAUTHORIZED,
        _ => crate::warren_status(&e),
    };
    http_error(status, e.to_string())
}

/// `GET /files?path=`: the file's bytes.
pub(crate) async fn read(sb: Sandbox, path: Option<String>) -> Response {
    let Some(path) = path.filter(|p| !p.is_empty()) else {
        return http_error(StatusCode::BAD_REQUEST, "name the file: ?path=...");
    };
    // Streamed: a file as large as the sandbox's disk never sits in the gateway's memory.
    match sb.read_file_stream(&resolve(&sb, &path)).await {
        Ok(stream) => (
            StatusCode::OK,
            [(header::CONTENT_TYPE, "application/octet-stream")],
            Body::from_stream(stream),
        )
            .into_response(),
        Err(e) => from_warren(e),
    }
}

/// `POST /files[?path=]` with a multipart body: each `file` part is written to `path`, or,
/// without one, to the path its file name gives (several files at once).
pub(crate) async fn write(
    sb: Sandbox,
    path: Option<String>,
    metadata: Metadata,
    mut form: Multipart,
) -> Response {
    let mut written = Vec::new();
    let mut total = 0usize;
    loop {
        let field = match form.next_field().await {
            Ok(Some(f)) => f,
            Ok(None) => break,
            Err(e) => {
                return http_error(StatusCode::BAD_REQUEST, format!("the multipart body: {e}"));
            }
        };
        let dest = match (&path, field.file_name()) {
            (Some(p), _) if !p.is_empty() => p.clone(),
            (_, Some(name)) if !name.is_empty() => name.to_string(),
            _ => {
                return http_error(
                    StatusCode::BAD_REQUEST,
                    "no destination: give ?path= or a file name on the part",
                );
            }
        };
        let dest = resolve(&sb, &dest);
        if written.iter().any(|(p, _): &(String, String)| *p == dest) {
            return http_error(
                StatusCode::BAD_REQUEST,
                format!("{dest} is given twice in one upload"),
            );
        }
        // Each part goes to Warren as it arrives, through a small channel: the pump reads the
        // part, the request sends what the pump passed on.
        let (tx, rx) = tokio::sync::mpsc::channel::<Result<Bytes, std::io::Error>>(4);
        let body = reqwest::Body::wrap_stream(futures_util::stream::unfold(rx, |mut rx| async {
            rx.recv().await.map(|c| (c, rx))
        }));
        let total_ref = &mut total;
        let pump = async move {
            let mut field = field;
            let tx = tx;
            loop {
                match field.chunk().await {
                    Ok(Some(c)) => {
                        *total_ref += c.len();
                        if *total_ref > MAX_UPLOAD {
                            let _ = tx
                                .send(Err(std::io::Error::other("over the upload limit")))
                                .await;
                            return Err(http_error(
                                StatusCode::PAYLOAD_TOO_LARGE,
                                format!("an upload may hold {MAX_UPLOAD} bytes at most"),
                            ));
                        }
                        if tx.send(Ok(c)).await.is_err() {
                            return Ok(());
                        }
                    }
                    Ok(None) => return Ok(()),
                    Err(e) => {
                        let _ = tx.send(Err(std::io::Error::other(e.to_string()))).await;
                        return Err(http_error(
                            StatusCode::BAD_REQUEST,
                            format!("a file part: {e}"),
                        ));
                    }
                }
            }
        };
        let (pumped, put) = tokio::join!(
            pump,
            sb.write_file_body_with_metadata(&dest, &metadata, body)
        );
        if let Err(r) = pumped {
            return r;
        }
        if let Err(e) = put {
            return from_warren(e);
        }
        let name = dest.rsplit('/').next().unwrap_or("").to_string();
        written.push((dest, name));
    }
    if written.is_empty() {
        return http_error(StatusCode::BAD_REQUEST, "the upload holds no file part");
    }
    let out: Vec<Value> = written
        .into_iter()
        .map(|(path, _)| write_info(&path, &metadata))
        .collect();
    axum::Json(out).into_response()
}

/// `POST /files?path=` with an `application/octet-stream` body: the body is the file
/// (gzip-compressed with `Content-Encoding: gzip`, decompressed here as it streams), passed on
/// to Warren as it arrives; at most [`MAX_UPLOAD`] bytes once decompressed.
pub(crate) async fn write_raw(
    sb: Sandbox,
    path: Option<String>,
    gzip: bool,
    metadata: Metadata,
    body: Body,
) -> Response {
    use futures_util::StreamExt;
    use tokio::io::AsyncRead;
    let Some(path) = path.filter(|p| !p.is_empty()) else {
        return http_error(
            StatusCode::BAD_REQUEST,
            "name the file: ?path=... (an octet-stream upload is one file)",
        );
    };
    let dest = resolve(&sb, &path);
    let raw = tokio_util::io::StreamReader::new(
        body.into_data_stream()
            .map(|r| r.map_err(std::io::Error::other)),
    );
    let reader: std::pin::Pin<Box<dyn AsyncRead + Send>> = if gzip {
        Box::pin(async_compression::tokio::bufread::GzipDecoder::new(raw))
    } else {
        Box::pin(raw)
    };
    // Why the stream stopped, when it was this side's doing: answered instead of Warren's
    // error about a body that broke off.
    let why: std::sync::Arc<std::sync::Mutex<Option<Response>>> = Default::default();
    let seen = why.clone();
    let mut total = 0usize;
    let chunks = tokio_util::io::ReaderStream::new(reader).map(move |c| {
        let fail = |r: Response| {
            *seen.lock().unwrap_or_else(|p| p.into_inner()) = Some(r);
        };
        match c {
            Ok(c) => {
                total += c.len();
                if total > MAX_UPLOAD {
                    fail(http_error(
                        StatusCode::PAYLOAD_TOO_LARGE,
                        format!("an upload may hold {MAX_UPLOAD} bytes at most"),
                    ));
                    return Err(std::io::Error::other("over the upload limit"));
                }
                Ok(c)
            }
            Err(e) => {
                let what = if gzip {
                    "the gzip body (Content-Encoding: gzip)"
                } else {
                    "the body"
                };
                fail(http_error(
                    StatusCode::BAD_REQUEST,
                    format!("reading {what}: {e}"),
                ));
                Err(e)
            }
        }
    });
    let put = sb
        .write_file_body_with_metadata(&dest, &metadata, reqwest::Body::wrap_stream(chunks))
        .await;
    if let Some(r) = why.lock().unwrap_or_else(|p| p.into_inner()).take() {
        return r;
    }
    match put {
        Ok(_) => axum::Json(json!([write_info(&dest, &metadata)])).into_response(),
        Err(e) => from_warren(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_and_permissions_read_as_envd_writes_them() {
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00Z");
        assert_eq!(rfc3339(1_735_689_600), "2025-01-01T00:00:00Z");
        assert_eq!(rfc3339(951_782_400), "2000-02-29T00:00:00Z");
        assert_eq!(permissions(FileKind::File, 0o644), "-rw-r--r--");
        assert_eq!(permissions(FileKind::Dir, 0o755), "drwxr-xr-x");
    }
}
