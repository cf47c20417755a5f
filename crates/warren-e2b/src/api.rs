//! E2B's control-plane routes, translated onto Warren's API.
//!
//! | E2B | Warren |
//! |---|---|
//! | `POST /sandboxes`, `POST /v2/sandboxes` | create (template → image; `base` → the configured image) |
//! | `GET /sandboxes/{id}` | get |
//! | `GET /v2/sandboxes`, `GET /sandboxes` | list (metadata = labels, state), paginated here |
//! | `DELETE /sandboxes/{id}` | kill |
//! | `POST /sandboxes/{id}/timeout` | set the timeout |
//! | `POST /sandboxes/{id}/pause` | pause |
//! | `POST /[v2/]sandboxes/{id}/connect`, `POST /sandboxes/{id}/resume` | resume where paused |
//!
//! Answers use E2B's shapes (camelCase, `Error` = `{"code": <status>, "message"}`); Warren's
//! own refusals pass through with their status and message.

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use warren_sdk::{CreateSandbox, ListFilter, SandboxInfo, SandboxState};

use crate::{CLIENT_ID, ENVD_VERSION, Gateway, keys};

/// E2B's default sandbox lifetime, seconds.
const DEFAULT_TIMEOUT: u64 = 300;
/// Most sandboxes in one list page (E2B's limit).
const MAX_PAGE: usize = 100;

pub(crate) fn routes() -> Router<Arc<Gateway>> {
    Router::new()
        .route("/sandboxes", post(create).get(list_v1))
        .route("/v2/sandboxes", post(create).get(list))
        .route("/sandboxes/{id}", get(info).delete(kill))
        .route("/sandboxes/{id}/timeout", post(set_timeout))
        .route("/sandboxes/{id}/metrics", get(metrics))
        .route("/sandboxes/{id}/pause", post(pause))
        .route("/sandboxes/{id}/connect", post(connect))
        .route("/v2/sandboxes/{id}/connect", post(connect))
        .route("/sandboxes/{id}/resume", post(resume))
        .route("/sandboxes/{id}/network", axum::routing::put(set_network))
        .route("/templates/aliases/{alias}", get(template_alias))
        .route("/sandboxes/{id}/snapshots", post(snapshot))
        .route("/snapshots", get(snapshots))
        .route("/templates/{name}", axum::routing::delete(delete_snapshot))
}

/// An E2B error answer.
#[derive(Debug)]
pub(crate) struct ApiError(pub StatusCode, pub String);

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        crate::json_error(self.0, self.1)
    }
}

impl From<warren_sdk::Error> for ApiError {
    fn from(e: warren_sdk::Error) -> ApiError {
        let status = crate::warren_status(&e);
        if status == StatusCode::BAD_GATEWAY {
            tracing::warn!("E2B gateway: Warren: {e}");
            return ApiError(
                status,
                "Warren refused the gateway; see warren up's log".into(),
            );
        }
        ApiError(status, e.to_string())
    }
}

type Answer<T> = Result<T, ApiError>;

fn bad(message: impl Into<String>) -> ApiError {
    ApiError(StatusCode::BAD_REQUEST, message.into())
}

/// A JSON body that may be left out (its default then), or the 400 naming what it should be.
fn optional_body<T: Default + serde::de::DeserializeOwned>(body: &[u8], what: &str) -> Answer<T> {
    if body.is_empty() {
        return Ok(T::default());
    }
    serde_json::from_slice(body).map_err(|e| bad(format!("the body must be {what}: {e}")))
}

/// Warren's "not found" as E2B's 404 naming `what`; other failures as they are.
fn not_found_as(what: String) -> impl FnOnce(warren_sdk::Error) -> ApiError {
    move |e| {
        if e.is_not_found() {
            ApiError(StatusCode::NOT_FOUND, format!("{what} not found"))
        } else {
            e.into()
        }
    }
}

/// The key check of every control-plane route, before its body is read.
pub(crate) async fn require_key(
    State(gw): State<Arc<Gateway>>,
    mut req: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    match caller(&gw, req.headers()).await {
        Ok(g) => {
            req.extensions_mut().insert(g);
            next.run(req).await
        }
        Err(e) => e.into_response(),
    }
}

/// The gateway as the caller sees it: the gateway's own key acts as the gateway's identity;
/// any other key is taken to Warren as it is (an E2B-form key made with `warren key create
/// --form e2b`, or a Warren key), so Warren's IAM decides what it may do — its project, its
/// role, its quotas.
async fn caller(gw: &Arc<Gateway>, headers: &HeaderMap) -> Answer<Arc<Gateway>> {
    authorize_presence(headers)?;
    let presented = headers
        .get("x-api-key")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    if keys::matches(presented, &gw.key) {
        return Ok(gw.clone());
    }
    let warren = gw.warren.with_api_key(presented);
    // A key Warren does not know is the caller's mistake (401), not the gateway's.
    let who = match warren.whoami().await {
        Ok(w) => w,
        Err(e) if e.code() == Some(warren_sdk::ErrorCode::Unauthenticated) => {
            return Err(ApiError(
                StatusCode::UNAUTHORIZED,
                "invalid API key: use the gateway's key (<data-dir>/e2b.key) or one made with \
                 `warren key create --form e2b`"
                    .into(),
            ));
        }
        Err(e) => return Err(e.into()),
    };
    Ok(Arc::new(Gateway {
        warren,
        key: gw.key.clone(),
        base_image: gw.base_image.clone(),
        domain: gw.domain.clone(),
        caller: Some(Arc::new(who)),
        tokens: gw.tokens.clone(),
    }))
}

fn authorize_presence(headers: &HeaderMap) -> Answer<()> {
    let presented = headers
        .get("x-api-key")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    if presented.is_empty() || presented.len() > 256 {
        return Err(ApiError(
            StatusCode::UNAUTHORIZED,
            "no API key: send X-API-KEY (E2B_API_KEY; `warren up` writes the gateway's key to \
             <data-dir>/e2b.key; `warren key create --form e2b` makes one for a project)"
                .into(),
        ));
    }
    Ok(())
}

/// A sandbox id from a path: Warren's ids are E2B's form too (lower-case letters and digits).
fn sandbox_id(id: &str) -> Answer<()> {
    if id.is_empty() || id.len() > 64 || !id.bytes().all(|b| b.is_ascii_alphanumeric()) {
        return Err(ApiError(
            StatusCode::NOT_FOUND,
            format!("sandbox {id:?} not found: ids are letters and digits"),
        ));
    }
    Ok(())
}

/// The body of both create routes (`NewSandbox`, `NewSandboxV2`); unknown fields are ignored,
/// as E2B's API does.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct NewSandbox {
    #[serde(rename = "templateID")]
    template_id: Option<String>,
    timeout: Option<u64>,
    #[serde(default)]
    metadata: Option<BTreeMap<String, String>>,
    #[serde(default)]
    env_vars: Option<BTreeMap<String, String>>,
    #[serde(rename = "allow_internet_access")]
    allow_internet_access: Option<bool>,
    auto_pause: Option<bool>,
    network: Option<crate::network::E2bNetwork>,
}

/// E2B's `Sandbox` (create, connect).
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct Created {
    #[serde(rename = "templateID")]
    template_id: String,
    #[serde(rename = "sandboxID")]
    sandbox_id: String,
    #[serde(rename = "clientID")]
    client_id: &'static str,
    envd_version: &'static str,
    envd_access_token: String,
    domain: Option<String>,
}

/// The template name E2B shows for a Warren image.
fn template_of(gw: &Gateway, image: &str) -> String {
    if image == gw.base_image {
        "base".into()
    } else {
        image.to_string()
    }
}

/// E2B's `Sandbox` for `sb`, with the caller's envd access token where it may have one.
async fn created(gw: &Gateway, sb: &SandboxInfo) -> Answer<Created> {
    let token = gw.envd_token(sb).await?;
    Ok(Created {
        template_id: template_of(gw, &sb.image),
        sandbox_id: sb.id.to_string(),
        client_id: CLIENT_ID,
        envd_version: ENVD_VERSION,
        envd_access_token: token.unwrap_or_default(),
        domain: gw.domain.clone(),
    })
}

async fn create(
    axum::Extension(gw): axum::Extension<Arc<Gateway>>,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> Answer<(StatusCode, Json<Created>)> {
    let req: NewSandbox = optional_body(&body, "a NewSandbox")?;
    if req.auto_pause == Some(true) {
        return Err(bad(
            "autoPause is not supported by this gateway: a Warren sandbox is killed at its \
             timeout (pause it yourself, or leave autoPause out)",
        ));
    }
    let template = req.template_id.unwrap_or_else(|| "base".into());
    let image = if template == "base" {
        gw.base_image.clone()
    } else {
        template
    };
    // E2B's default is the internet (never the node, control plane or metadata addresses).
    let network =
        crate::network::policy(req.allow_internet_access, req.network.as_ref()).map_err(bad)?;
    let create = CreateSandbox {
        image,
        timeout: Some(req.timeout.unwrap_or(DEFAULT_TIMEOUT)),
        labels: req.metadata.unwrap_or_default(),
        env: req.env_vars.unwrap_or_default(),
        network: Some(network),
        ..Default::default()
    };
    // A retried create with the same Idempotency-Key makes one sandbox, as in Warren's API.
    let idempotency = headers
        .get("idempotency-key")
        .and_then(|v| v.to_str().ok())
        .filter(|k| !k.is_empty());
    let sb = match idempotency {
        Some(k) => gw.warren.create_idempotent(&create, k).await?,
        None => gw.warren.create(&create).await?,
    };
    let info = match sb.snapshot() {
        Some(i) => i.clone(),
        None => sb.info().await?,
    };
    Ok((StatusCode::CREATED, Json(created(&gw, &info).await?)))
}

/// E2B's `SandboxDetail` (with `token`, the caller's envd access token) and `ListedSandbox`
/// (without).
fn detail(gw: &Gateway, sb: &SandboxInfo, token: Option<String>) -> Value {
    let mut v = json!({
        "templateID": template_of(gw, &sb.image),
        "sandboxID": sb.id.to_string(),
        "clientID": CLIENT_ID,
        "startedAt": sb.created_at,
        "endAt": sb.expires_at,
        "envdVersion": ENVD_VERSION,
        "cpuCount": sb.resources.normalized().cpu_limit.div_ceil(1000).max(1),
        "memoryMB": sb.resources.normalized().memory_limit.0 >> 20,
        "diskSizeMB": sb.resources.disk.map(|d| d.0 >> 20).unwrap_or(0),
        "state": sb.state.as_str(),
        "metadata": sb.labels,
    });
    if let Some(d) = &gw.domain {
        v["domain"] = json!(d);
    }
    if let Some(t) = token {
        v["envdAccessToken"] = json!(t);
    }
    v
}

async fn info(
    axum::Extension(gw): axum::Extension<Arc<Gateway>>,
    Path(id): Path<String>,
) -> Answer<Json<Value>> {
    sandbox_id(&id)?;
    let sb = gw.warren.get(&id).await?;
    let token = gw.envd_token(&sb).await?;
    Ok(Json(detail(&gw, &sb, token)))
}

/// `GET /sandboxes/{id}/metrics[?start=&end=]`: one sample, measured now (Warren keeps no
/// history); a window (`start`, `end`, unix seconds) that does not hold now gets none.
async fn metrics(
    axum::Extension(gw): axum::Extension<Arc<Gateway>>,
    Path(id): Path<String>,
    Query(q): Query<MetricsQuery>,
) -> Answer<Json<Value>> {
    sandbox_id(&id)?;
    if let (Some(s), Some(e)) = (q.start, q.end)
        && s > e
    {
        return Err(bad("start is after end"));
    }
    let m = gw.warren.sandbox(&id)?.metrics().await?;
    let secs = (m.timestamp_ms / 1000) as i64;
    if q.start.is_some_and(|s| s > secs) || q.end.is_some_and(|e| e < secs) {
        return Ok(Json(json!([])));
    }
    Ok(Json(json!([{
        "timestamp": crate::files::rfc3339(secs),
        "timestampUnix": secs,
        "cpuCount": m.cpu_limit.div_ceil(1000),
        "cpuUsedPct": m.cpu_used_pct,
        "memUsed": m.memory_used,
        "memTotal": m.memory_limit,
        "memCache": m.memory_cache,
        "diskUsed": m.disk_used.unwrap_or(0),
        "diskTotal": m.disk_limit.unwrap_or(0),
    }])))
}

/// `GET /sandboxes/{id}/metrics` parameters (unix seconds).
#[derive(Debug, Default, Deserialize)]
struct MetricsQuery {
    start: Option<i64>,
    end: Option<i64>,
}

/// List parameters (`GET /v2/sandboxes`).
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct ListQuery {
    metadata: Option<String>,
    state: Option<String>,
    order: Option<String>,
    limit: Option<usize>,
    next_token: Option<String>,
    template: Option<String>,
    started_after: Option<String>,
}

/// `k1=v1&k2=v2`, each part URL-encoded.
fn parse_metadata(s: &str) -> Answer<Vec<(String, String)>> {
    let mut out = Vec::new();
    for pair in s.split('&').filter(|p| !p.is_empty()) {
        let (k, v) = pair
            .split_once('=')
            .ok_or_else(|| bad(format!("metadata filter {pair:?} is not key=value")))?;
        out.push((percent_decode(k)?, percent_decode(v)?));
    }
    Ok(out)
}

fn percent_decode(s: &str) -> Answer<String> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'%' => {
                let h = b
                    .get(i + 1..i + 3)
                    .filter(|h| h.iter().all(u8::is_ascii_hexdigit))
                    .and_then(|h| std::str::from_utf8(h).ok())
                    .and_then(|h| u8::from_str_radix(h, 16).ok())
                    .ok_or_else(|| bad(format!("{s:?} has a bad percent escape")))?;
                out.push(h);
                i += 3;
            }
            b'+' => {
                out.push(b' ');
                i += 1;
            }
            c => {
                out.push(c);
                i += 1;
            }
        }
    }
    String::from_utf8(out).map_err(|_| bad(format!("{s:?} is not UTF-8 once decoded")))
}

/// The v1 list (`GET /sandboxes`, SDK 1.x): every match at once, as those SDKs do not page.
async fn list_v1(
    axum::Extension(gw): axum::Extension<Arc<Gateway>>,
    Query(q): Query<ListQuery>,
) -> Answer<Response> {
    list_page(&gw, q, None).await
}

async fn list(
    axum::Extension(gw): axum::Extension<Arc<Gateway>>,
    Query(q): Query<ListQuery>,
) -> Answer<Response> {
    list_page(&gw, q, Some(MAX_PAGE)).await
}

/// One page of the list (all of it without `page`).
async fn list_page(gw: &Gateway, q: ListQuery, page: Option<usize>) -> Answer<Response> {
    if q.started_after.is_some() {
        return Err(bad(
            "startedAfter is not supported by this gateway: leave it out and filter the list",
        ));
    }
    let wanted: Vec<&str> = match &q.state {
        Some(s) => s.split(',').filter(|s| !s.is_empty()).collect(),
        None => vec!["running", "paused"],
    };
    for s in &wanted {
        if !matches!(*s, "running" | "paused") {
            return Err(bad(format!("state {s:?} is not one of running, paused")));
        }
    }
    let limit = match (q.limit, page) {
        (Some(l), Some(max)) if l == 0 || l > max => {
            return Err(bad(format!("limit must be 1 to {max}, got {l}")));
        }
        (Some(0), None) => return Err(bad("limit must be at least 1")),
        (Some(l), _) => l,
        (None, Some(max)) => max,
        (None, None) => usize::MAX,
    };
    let offset: usize = match &q.next_token {
        None => 0,
        Some(t) => t
            .parse()
            .map_err(|_| bad(format!("nextToken {t:?} is not one this gateway gave")))?,
    };
    let desc = match q.order.as_deref() {
        None | Some("desc") => true,
        Some("asc") => false,
        Some(o) => return Err(bad(format!("order {o:?} is not asc or desc"))),
    };
    let mut filter = ListFilter::default();
    for (k, v) in parse_metadata(q.metadata.as_deref().unwrap_or(""))? {
        filter = filter.label(k, v);
    }
    let mut all = gw.warren.list(&filter).await?.into_items();
    all.retain(|s| {
        wanted.contains(&s.state.as_str())
            && q.template
                .as_deref()
                .is_none_or(|t| template_of(gw, &s.image) == t)
    });
    all.sort_by(|a, b| a.created_at.cmp(&b.created_at).then(a.id.cmp(&b.id)));
    if desc {
        all.reverse();
    }
    let page: Vec<Value> = all
        .iter()
        .skip(offset)
        .take(limit)
        .map(|s| detail(gw, s, None))
        .collect();
    let mut resp = Json(page).into_response();
    let next = offset.saturating_add(limit);
    if next < all.len()
        && let Ok(v) = next.to_string().parse()
    {
        resp.headers_mut().insert("x-next-token", v);
    }
    Ok(resp)
}

async fn kill(
    axum::Extension(gw): axum::Extension<Arc<Gateway>>,
    Path(id): Path<String>,
) -> Answer<StatusCode> {
    sandbox_id(&id)?;
    gw.warren.sandbox(&id)?.kill().await?;
    Ok(StatusCode::NO_CONTENT)
}

#[derive(Debug, Deserialize)]
struct Timeout {
    timeout: u64,
}

async fn set_timeout(
    axum::Extension(gw): axum::Extension<Arc<Gateway>>,
    Path(id): Path<String>,
    body: axum::body::Bytes,
) -> Answer<StatusCode> {
    sandbox_id(&id)?;
    let t: Timeout = serde_json::from_slice(&body)
        .map_err(|e| bad(format!("the body must be {{\"timeout\": seconds}}: {e}")))?;
    gw.warren.sandbox(&id)?.set_timeout(t.timeout).await?;
    Ok(StatusCode::NO_CONTENT)
}

async fn pause(
    axum::Extension(gw): axum::Extension<Arc<Gateway>>,
    Path(id): Path<String>,
) -> Answer<StatusCode> {
    sandbox_id(&id)?;
    let sb = gw.warren.sandbox(&id)?;
    if sb.info().await?.state == SandboxState::Paused {
        return Err(ApiError(
            StatusCode::CONFLICT,
            format!("sandbox {id} is already paused"),
        ));
    }
    sb.pause().await?;
    Ok(StatusCode::NO_CONTENT)
}

#[derive(Debug, Default, Deserialize)]
struct ConnectBody {
    timeout: Option<u64>,
}

/// Resumes a paused sandbox (201) or finds it running (200), and sets its timeout when given.
async fn connect_or_resume(
    gw: &Gateway,
    id: &str,
    body: &[u8],
    running: StatusCode,
) -> Answer<(StatusCode, Json<Created>)> {
    sandbox_id(id)?;
    let b: ConnectBody = optional_body(body, "{\"timeout\": seconds}")?;
    if b.timeout == Some(0) {
        return Err(bad("timeout must be at least 1 second"));
    }
    let sb = gw.warren.sandbox(id)?;
    let mut info = sb
        .info()
        .await
        .map_err(not_found_as(format!("sandbox {id}")))?;
    let status = if info.state == SandboxState::Paused {
        info = sb.resume().await?;
        StatusCode::CREATED
    } else {
        running
    };
    if let Some(t) = b.timeout {
        info = sb.set_timeout(t).await?;
    }
    Ok((status, Json(created(gw, &info).await?)))
}

async fn connect(
    axum::Extension(gw): axum::Extension<Arc<Gateway>>,
    Path(id): Path<String>,
    body: axum::body::Bytes,
) -> Answer<(StatusCode, Json<Created>)> {
    connect_or_resume(&gw, &id, &body, StatusCode::OK).await
}

/// The deprecated resume (SDK 2.0 to 2.5): 201 either way, 409 when it was not paused.
async fn resume(
    axum::Extension(gw): axum::Extension<Arc<Gateway>>,
    Path(id): Path<String>,
    body: axum::body::Bytes,
) -> Answer<(StatusCode, Json<Created>)> {
    sandbox_id(&id)?;
    let info = gw.warren.get(&id).await?;
    if info.state != SandboxState::Paused {
        return Err(ApiError(
            StatusCode::CONFLICT,
            format!("sandbox {id} is not paused"),
        ));
    }
    connect_or_resume(&gw, &id, &body, StatusCode::CREATED).await
}

/// `PUT /sandboxes/{id}/network`: replaces the sandbox's egress rules (a field left out is
/// cleared), in effect at once.
async fn set_network(
    axum::Extension(gw): axum::Extension<Arc<Gateway>>,
    Path(id): Path<String>,
    body: axum::body::Bytes,
) -> Answer<StatusCode> {
    sandbox_id(&id)?;
    let net: crate::network::E2bNetwork = serde_json::from_slice(&body)
        .map_err(|e| bad(format!("the body is not a SandboxNetworkUpdateConfig: {e}")))?;
    let mut policy = crate::network::policy(None, Some(&net)).map_err(bad)?;
    let sb = gw.warren.sandbox(&id)?;
    // E2B's update says nothing of exposed ports (Warren's `expose`, set through Warren's own
    // API for `get_host`): they stay as they are.
    policy.expose = sb.network().await?.exposed.iter().map(|e| e.port).collect();
    sb.set_network(&policy).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// `GET /templates/aliases/{alias}` (`Template.exists`): a template is a Warren image name;
/// `base` is the configured base image.
async fn template_alias(
    axum::Extension(gw): axum::Extension<Arc<Gateway>>,
    Path(alias): Path<String>,
) -> Answer<Json<Value>> {
    if alias.is_empty() || alias.len() > 256 {
        return Err(ApiError(
            StatusCode::NOT_FOUND,
            format!("template {alias:?} not found"),
        ));
    }
    let builtin = alias == "base" || alias == gw.base_image || alias == "host";
    if !builtin {
        gw.warren.image(&alias).await.map_err(|e| {
            if e.is_not_found() || crate::warren_status(&e) == StatusCode::BAD_REQUEST {
                ApiError(StatusCode::NOT_FOUND, format!("template {alias} not found"))
            } else {
                e.into()
            }
        })?;
    }
    Ok(Json(json!({"templateID": alias, "public": builtin})))
}

/// Where snapshots live among Warren's images.
const SNAPSHOTS: &str = "e2b-snapshots/";

#[derive(Debug, Default, Deserialize)]
struct SnapshotRequest {
    name: Option<String>,
    memory: Option<bool>,
}

/// `POST /sandboxes/{id}/snapshots`: the sandbox's file system as a Warren image (a commit of
/// its writable layer over its image's layers), named `e2b-snapshots/<name>`, or
/// `e2b-snapshots/<id>:<ms>` without a name. Memory and processes are not kept (E2B's
/// `mode="filesystem"`): a sandbox made from it starts fresh. The sandbox must run on
/// imported images (the `host` image has no layers to commit onto).
async fn snapshot(
    axum::Extension(gw): axum::Extension<Arc<Gateway>>,
    Path(id): Path<String>,
    body: axum::body::Bytes,
) -> Answer<(StatusCode, Json<Value>)> {
    sandbox_id(&id)?;
    let req: SnapshotRequest = optional_body(&body, "{\"name\"?, \"memory\"?}")?;
    if req.memory == Some(true) {
        return Err(bad(
            "memory snapshots are not supported by this gateway: take a file-system snapshot \
             (mode=\"filesystem\", or leave the mode out)",
        ));
    }
    let name = match req.name.as_deref().filter(|n| !n.is_empty()) {
        Some(n) => format!("{SNAPSHOTS}{n}"),
        None => format!("{SNAPSHOTS}{id}:{}", now_ms()),
    };
    let image = gw.warren.sandbox(&id)?.commit(&name).await?;
    Ok((
        StatusCode::CREATED,
        Json(json!({"snapshotID": image.name, "names": [image.name]})),
    ))
}

fn now_ms() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis())
        .unwrap_or(0)
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct SnapshotsQuery {
    #[serde(rename = "sandboxID")]
    sandbox_id: Option<String>,
    name: Option<String>,
}

/// `GET /snapshots`: the images under `e2b-snapshots/` (by source sandbox: those named after
/// it, i.e. taken without a name).
async fn snapshots(
    axum::Extension(gw): axum::Extension<Arc<Gateway>>,
    Query(q): Query<SnapshotsQuery>,
) -> Answer<Json<Value>> {
    let images = gw.warren.images().await?;
    let out: Vec<Value> = images
        .iter()
        .filter(|i| i.name.starts_with(SNAPSHOTS))
        .filter(|i| {
            q.sandbox_id
                .as_deref()
                .is_none_or(|s| i.name.starts_with(&format!("{SNAPSHOTS}{s}:")))
        })
        .filter(|i| {
            q.name.as_deref().is_none_or(|n| {
                i.name == n
                    || i.name == format!("{SNAPSHOTS}{n}")
                    || i.name.split(':').next() == Some(&format!("{SNAPSHOTS}{n}"))
            })
        })
        .map(|i| json!({"snapshotID": i.name, "names": [i.name]}))
        .collect();
    Ok(Json(Value::Array(out)))
}

/// `DELETE /templates/{id}` (`delete_snapshot`): removes a snapshot's image; other templates
/// are Warren's images, not removed from here.
async fn delete_snapshot(
    axum::Extension(gw): axum::Extension<Arc<Gateway>>,
    Path(name): Path<String>,
) -> Answer<StatusCode> {
    if !name.starts_with(SNAPSHOTS) {
        return Err(ApiError(
            StatusCode::NOT_FOUND,
            format!("snapshot {name} not found: snapshots are named {SNAPSHOTS}..."),
        ));
    }
    gw.warren
        .remove_image(&name)
        .await
        .map_err(not_found_as(format!("snapshot {name}")))?;
    Ok(StatusCode::NO_CONTENT)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metadata_filters_decode() {
        assert_eq!(
            parse_metadata("a=1&b%20c=d%2Fe&e=f+g").unwrap(),
            vec![
                ("a".into(), "1".into()),
                ("b c".into(), "d/e".into()),
                ("e".into(), "f g".into())
            ]
        );
        assert!(parse_metadata("a").is_err());
        assert!(parse_metadata("a=%2").is_err());
        assert!(parse_metadata("a=%zz").is_err());
        assert!(parse_metadata("a=%ff").is_err(), "not UTF-8");
        assert!(parse_metadata("").unwrap().is_empty());
    }
}
