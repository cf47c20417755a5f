//! Files: download, upload, list, stat, mkdir, rename, remove.
//!
//! Every operation acts as a user inside the sandbox (default `user`): files it creates belong
//! to them and permission checks are theirs. Paths are absolute or relative to the user's home;
//! paths with `..` are refused.

use axum::body::Body;
use axum::http::{HeaderMap, Method, Uri};
use axum::response::Response;
use warren_http::{Error, Json, Path};
use warren_types::api::{FileEntry, FileList, MkdirRequest, RenameRequest};
use warren_types::error::{ApiError, ErrorBody, ErrorCode};

use super::{S, pass, pass_json};

/// Download a file's bytes.
#[utoipa::path(get, path = "/v1/sandboxes/{id}/files", tag = "files",
    params(("id" = String, Path, description = "Sandbox id."),
        ("path" = String, Query, description = "File path."),
        ("user" = Option<String>, Query, description = "Acting user; default `user`.")),
    responses((status = 200, description = "The bytes.", content_type = "application/octet-stream"),
        (status = 400, body = ErrorBody), (status = 403, body = ErrorBody), (status = 404, body = ErrorBody)),
    security(("api_key" = [])))]
pub async fn read(
    axum::extract::State(c): S,
    Path(id): Path<String>,
    uri: Uri,
    headers: HeaderMap,
) -> Result<Response, Error> {
    pass(&c, &id, Method::GET, &uri, &headers, Body::empty()).await
}

/// Upload a file (the body is its bytes), creating parent directories. The file appears under
/// its name only once complete; an interrupted upload changes nothing.
#[utoipa::path(put, path = "/v1/sandboxes/{id}/files", tag = "files",
    params(("id" = String, Path, description = "Sandbox id."),
        ("path" = String, Query, description = "File path."),
        ("user" = Option<String>, Query, description = "Acting user (owner of the file); default `user`."),
        ("mode" = Option<String>, Query, description = "Permission bits in octal, e.g. 755."),
        ("metadata" = Option<String>, Query, description = "Metadata to set on the file, a JSON object of strings (at most 64 keys of letters, digits and !#$%&'*+-.^_`|~, lower-cased; printable ASCII values of at most 4096 bytes), kept as `user.e2b.<key>` extended attributes and shown in the file's entry.")),
    request_body(content = Vec<u8>, content_type = "application/octet-stream"),
    responses((status = 200, body = FileEntry), (status = 400, body = ErrorBody), (status = 403, body = ErrorBody),
        (status = 413, description = "Larger than max_upload.", body = ErrorBody)),
    security(("api_key" = [])))]
pub async fn write(
    axum::extract::State(c): S,
    Path(id): Path<String>,
    uri: Uri,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, Error> {
    let body = refuse_oversized(&c, &id, &headers, body).await?;
    pass(&c, &id, Method::PUT, &uri, &headers, body).await
}

/// Remove a file, or a directory (`recursive=true` for a non-empty one).
#[utoipa::path(delete, path = "/v1/sandboxes/{id}/files", tag = "files",
    params(("id" = String, Path, description = "Sandbox id."),
        ("path" = String, Query, description = "Path."),
        ("user" = Option<String>, Query, description = "Acting user."),
        ("recursive" = Option<bool>, Query, description = "Remove a directory and its contents.")),
    responses((status = 204, description = "Removed."), (status = 404, body = ErrorBody), (status = 409, body = ErrorBody)),
    security(("api_key" = [])))]
pub async fn remove(
    axum::extract::State(c): S,
    Path(id): Path<String>,
    uri: Uri,
    headers: HeaderMap,
) -> Result<Response, Error> {
    pass(&c, &id, Method::DELETE, &uri, &headers, Body::empty()).await
}

/// List a directory.
#[utoipa::path(get, path = "/v1/sandboxes/{id}/files/list", tag = "files",
    params(("id" = String, Path, description = "Sandbox id."),
        ("path" = String, Query, description = "Directory."),
        ("user" = Option<String>, Query, description = "Acting user.")),
    responses((status = 200, body = FileList), (status = 404, body = ErrorBody)),
    security(("api_key" = [])))]
pub async fn list(
    axum::extract::State(c): S,
    Path(id): Path<String>,
    uri: Uri,
    headers: HeaderMap,
) -> Result<Response, Error> {
    pass(&c, &id, Method::GET, &uri, &headers, Body::empty()).await
}

/// Describe a path (not following a final symlink).
#[utoipa::path(get, path = "/v1/sandboxes/{id}/files/stat", tag = "files",
    params(("id" = String, Path, description = "Sandbox id."),
        ("path" = String, Query, description = "Path."),
        ("user" = Option<String>, Query, description = "Acting user.")),
    responses((status = 200, body = FileEntry), (status = 404, body = ErrorBody)),
    security(("api_key" = [])))]
pub async fn stat(
    axum::extract::State(c): S,
    Path(id): Path<String>,
    uri: Uri,
    headers: HeaderMap,
) -> Result<Response, Error> {
    pass(&c, &id, Method::GET, &uri, &headers, Body::empty()).await
}

/// Make a directory (and missing parents, by default).
#[utoipa::path(post, path = "/v1/sandboxes/{id}/files/mkdir", tag = "files",
    params(("id" = String, Path, description = "Sandbox id.")),
    request_body = MkdirRequest,
    responses((status = 200, body = FileEntry), (status = 400, body = ErrorBody), (status = 409, body = ErrorBody)),
    security(("api_key" = [])))]
pub async fn mkdir(
    axum::extract::State(c): S,
    Path(id): Path<String>,
    uri: Uri,
    headers: HeaderMap,
    Json(req): Json<MkdirRequest>,
) -> Result<Response, Error> {
    pass_json(&c, &id, &uri, &headers, &req).await
}

/// Rename (move) a path, making missing parents of the destination.
#[utoipa::path(post, path = "/v1/sandboxes/{id}/files/rename", tag = "files",
    params(("id" = String, Path, description = "Sandbox id.")),
    request_body = RenameRequest,
    responses((status = 200, body = FileEntry), (status = 400, body = ErrorBody), (status = 404, body = ErrorBody)),
    security(("api_key" = [])))]
pub async fn rename(
    axum::extract::State(c): S,
    Path(id): Path<String>,
    uri: Uri,
    headers: HeaderMap,
    Json(req): Json<RenameRequest>,
) -> Result<Response, Error> {
    pass_json(&c, &id, &uri, &headers, &req).await
}

/// Watch a directory (and, with `recursive`, every directory below it, those made later
/// included) for changes: creates, writes, removals, renames, permission changes. Collect them
/// with `.../watches/{watch_id}/events`. A sandbox keeps at most 64 watches, watching at most
/// 10,000 directories together; each keeps at most 10,000 uncollected events (1 MiB of their
/// paths; past that it reports `overflowed`); a watch not polled for 10 minutes is removed.
#[utoipa::path(post, path = "/v1/sandboxes/{id}/watches", tag = "files",
    params(("id" = String, Path, description = "Sandbox id.")),
    request_body = warren_types::api::WatchRequest,
    responses((status = 201, body = warren_types::api::WatchInfo), (status = 400, body = ErrorBody),
        (status = 404, body = ErrorBody), (status = 429, body = ErrorBody)),
    security(("api_key" = [])))]
pub async fn watch_create(
    axum::extract::State(c): S,
    Path(id): Path<String>,
    uri: Uri,
    headers: HeaderMap,
    Json(req): Json<warren_types::api::WatchRequest>,
) -> Result<Response, Error> {
    pass_json(&c, &id, &uri, &headers, &req).await
}

/// A watch's changes since the last call (taken), oldest first; with `wait`, waits up to that
/// many seconds for the first when there is none.
#[utoipa::path(get, path = "/v1/sandboxes/{id}/watches/{watch_id}/events", tag = "files",
    params(("id" = String, Path, description = "Sandbox id."), ("watch_id" = u64, Path, description = "Watch id."),
        ("wait" = Option<f64>, Query, minimum = 0, maximum = 60, description = "Seconds to wait for a change when there is none (default 0).")),
    responses((status = 200, body = warren_types::api::WatchEvents), (status = 400, body = ErrorBody), (status = 404, body = ErrorBody)),
    security(("api_key" = [])))]
pub async fn watch_events(
    axum::extract::State(c): S,
    Path((id, _watch)): Path<(String, u64)>,
    uri: Uri,
    headers: HeaderMap,
) -> Result<Response, Error> {
    pass(&c, &id, Method::GET, &uri, &headers, Body::empty()).await
}

/// Stop a watch.
#[utoipa::path(delete, path = "/v1/sandboxes/{id}/watches/{watch_id}", tag = "files",
    params(("id" = String, Path, description = "Sandbox id."), ("watch_id" = u64, Path, description = "Watch id.")),
    responses((status = 204, description = "Stopped."), (status = 404, body = ErrorBody)),
    security(("api_key" = [])))]
pub async fn watch_remove(
    axum::extract::State(c): S,
    Path((id, _watch)): Path<(String, u64)>,
    uri: Uri,
    headers: HeaderMap,
) -> Result<Response, Error> {
    pass(&c, &id, Method::DELETE, &uri, &headers, Body::empty()).await
}

/// Refuses an upload the node would refuse, before sending a byte of it to the node. (The
/// refused body is read and dropped by `warren_http::drain`, so a client still sending it reads
/// the 413 rather than a broken connection.)
async fn refuse_oversized(
    c: &crate::Control,
    id: &str,
    headers: &HeaderMap,
    body: Body,
) -> Result<Body, Error> {
    let (_, node) = super::forward::route(c, id)?;
    let limit = node.info().max_upload;
    let declared = headers
        .get(axum::http::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|len| len > limit.bytes()) {
        return Err(Error(ApiError::new(
            ErrorCode::PayloadTooLarge,
            format!("the upload is larger than the {limit} allowed (max_upload)"),
        )));
    }
    Ok(body)
}

/// Download a directory's contents as a tar stream (symlinks as symlinks).
#[utoipa::path(get, path = "/v1/sandboxes/{id}/files/tar", tag = "files",
    params(("id" = String, Path, description = "Sandbox id."),
        ("path" = String, Query, description = "Directory."),
        ("user" = Option<String>, Query, description = "Acting user; default `user`.")),
    responses((status = 200, description = "A tar stream of the directory's contents.", content_type = "application/x-tar"),
        (status = 400, body = ErrorBody), (status = 404, body = ErrorBody)),
    security(("api_key" = [])))]
pub async fn download_tar(
    axum::extract::State(c): S,
    Path(id): Path<String>,
    uri: Uri,
    headers: HeaderMap,
) -> Result<Response, Error> {
    pass(&c, &id, Method::GET, &uri, &headers, Body::empty()).await
}

/// Upload a directory: the body is a tar stream, unpacked into `path` (made if missing) as the
/// acting user. Entries that would land outside `path` are refused. Not recorded in the
/// trajectory log.
#[utoipa::path(put, path = "/v1/sandboxes/{id}/files/tar", tag = "files",
    params(("id" = String, Path, description = "Sandbox id."),
        ("path" = String, Query, description = "Directory to unpack into."),
        ("user" = Option<String>, Query, description = "Acting user (owner of the files); default `user`.")),
    request_body(content = Vec<u8>, content_type = "application/x-tar"),
    responses((status = 200, body = FileEntry), (status = 400, body = ErrorBody), (status = 413, body = ErrorBody)),
    security(("api_key" = [])))]
pub async fn upload_tar(
    axum::extract::State(c): S,
    Path(id): Path<String>,
    uri: Uri,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, Error> {
    let body = refuse_oversized(&c, &id, &headers, body).await?;
    pass(&c, &id, Method::PUT, &uri, &headers, body).await
}
