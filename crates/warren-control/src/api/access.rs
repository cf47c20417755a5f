//! Who may call what: every authenticated route's permission, in one table, and the
//! middleware that checks it.
//!
//! The middleware turns the presented key into a [`Principal`] (cached: see `iam`), looks up
//! the route's [`Need`], and refuses what the key may not do anywhere. For sandbox routes the
//! project that decides is the sandbox's, which the node holding it knows: the control plane
//! sends the node the subtrees where the key holds the route's permission (`x-warren-scope`)
//! and those where it may see sandboxes (`x-warren-visible`), and the node answers 404 for a
//! sandbox outside both (ids of other projects' sandboxes do not leak) and 403 for one it may
//! see but not act on. Lists and task operations go to nodes with the scope too, and nodes
//! keep to it. Headers of those names sent by clients are dropped. A route missing from the
//! table is refused (a test checks that every route is in it).

use std::collections::HashMap;
use std::sync::{Arc, LazyLock};

use axum::extract::{MatchedPath, Request, State};
use axum::http::{HeaderValue, Method};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use warren_types::error::{ApiError, ErrorCode};
use warren_types::project::{ON_BEHALF_HEADER, ROOT, SCOPE_HEADER, VISIBLE_HEADER};

use crate::Control;
use crate::iam::{Perm, Perms, Principal};

/// What a route needs of a key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Need {
    /// Any working key (the handler checks further, or there is nothing to protect).
    Key,
    /// The permission, on the project of what it touches (sandboxes: checked by their node).
    In(Perm),
    /// The permission on the root project (cluster-wide objects: nodes, the image catalog).
    Root(Perm),
}

/// Every authenticated route: (method, route as registered) → what it needs.
static ROUTES: LazyLock<HashMap<(Method, &'static str), Need>> = LazyLock::new(|| {
    use Need::*;
    use Perm::*;
    let get = Method::GET;
    let post = Method::POST;
    let put = Method::PUT;
    let delete = Method::DELETE;
    let sb = "/v1/sandboxes/{id}";
    let table: Vec<(Method, String, Need)> = vec![
        (get.clone(), "/v1/nodes".into(), Key),
        (
            delete.clone(),
            "/v1/nodes/{node}".into(),
            Root(ClusterAdmin),
        ),
        (
            post.clone(),
            "/v1/nodes/{node}/cordon".into(),
            Root(ClusterAdmin),
        ),
        (
            post.clone(),
            "/v1/nodes/{node}/uncordon".into(),
            Root(ClusterAdmin),
        ),
        (post.clone(), "/v1/sandboxes".into(), In(SandboxCreate)),
        (get.clone(), "/v1/sandboxes".into(), In(SandboxRead)),
        (get.clone(), sb.into(), In(SandboxRead)),
        (delete.clone(), sb.into(), In(SandboxDelete)),
        (post.clone(), format!("{sb}/pause"), In(SandboxLifecycle)),
        (post.clone(), format!("{sb}/resume"), In(SandboxLifecycle)),
        (post.clone(), format!("{sb}/timeout"), In(SandboxLifecycle)),
        (get.clone(), format!("{sb}/network"), In(SandboxRead)),
        (put.clone(), format!("{sb}/network"), In(SandboxNetwork)),
        (
            put.clone(),
            "/v1/tasks/{task}/network".into(),
            In(TaskManage),
        ),
        (
            get.clone(),
            format!("{sb}/ports/{{port}}/connect"),
            In(SandboxNetwork),
        ),
        (get.clone(), format!("{sb}/trajectory"), In(SandboxRead)),
        (get.clone(), format!("{sb}/metrics"), In(SandboxRead)),
        (get.clone(), "/v1/images".into(), In(ImageRead)),
        (post.clone(), "/v1/images".into(), In(ImageBuild)),
        // Names every sandbox and its image: cluster-wide.
        (get.clone(), "/v1/images/stats".into(), Root(ImageRead)),
        (post.clone(), "/v1/images/pull".into(), In(ImageBuild)),
        // Names every image that uses each layer: cluster-wide.
        (get.clone(), "/v1/layers".into(), Root(ImageRead)),
        (post.clone(), "/v1/layers/prune".into(), Root(ImageDelete)),
        (get.clone(), "/v1/images/{*name}".into(), In(ImageRead)),
        (delete.clone(), "/v1/images/{*name}".into(), In(ImageDelete)),
        (post.clone(), format!("{sb}/commit"), In(ImageBuild)),
        (get.clone(), "/v1/tasks".into(), In(SandboxRead)),
        (get.clone(), "/v1/events".into(), In(EventsRead)),
        (
            post.clone(),
            "/v1/tasks/{task}/{action}".into(),
            In(TaskManage),
        ),
        (post.clone(), format!("{sb}/exec"), In(SandboxExec)),
        (post.clone(), format!("{sb}/processes"), In(SandboxExec)),
        (get.clone(), format!("{sb}/processes"), In(SandboxRead)),
        (
            get.clone(),
            format!("{sb}/processes/{{pid}}"),
            In(SandboxRead),
        ),
        (
            delete.clone(),
            format!("{sb}/processes/{{pid}}"),
            In(SandboxExec),
        ),
        (
            post.clone(),
            format!("{sb}/processes/{{pid}}/wait"),
            In(SandboxExec),
        ),
        (
            post.clone(),
            format!("{sb}/processes/{{pid}}/signal"),
            In(SandboxExec),
        ),
        (
            get.clone(),
            format!("{sb}/processes/{{pid}}/output"),
            In(SandboxExec),
        ),
        (
            post.clone(),
            format!("{sb}/processes/{{pid}}/stdin"),
            In(SandboxExec),
        ),
        (
            post.clone(),
            format!("{sb}/processes/{{pid}}/resize"),
            In(SandboxExec),
        ),
        (get.clone(), format!("{sb}/files"), In(SandboxFiles)),
        (put.clone(), format!("{sb}/files"), In(SandboxFiles)),
        (delete.clone(), format!("{sb}/files"), In(SandboxFiles)),
        (get.clone(), format!("{sb}/files/list"), In(SandboxFiles)),
        (get.clone(), format!("{sb}/files/tar"), In(SandboxFiles)),
        (put.clone(), format!("{sb}/files/tar"), In(SandboxFiles)),
        (get.clone(), format!("{sb}/files/stat"), In(SandboxFiles)),
        (post.clone(), format!("{sb}/files/mkdir"), In(SandboxFiles)),
        (post.clone(), format!("{sb}/files/rename"), In(SandboxFiles)),
        (post.clone(), format!("{sb}/watches"), In(SandboxFiles)),
        (
            delete.clone(),
            format!("{sb}/watches/{{watch}}"),
            In(SandboxFiles),
        ),
        (
            get.clone(),
            format!("{sb}/watches/{{watch}}/events"),
            In(SandboxFiles),
        ),
        // Function calls: the handler checks fncall.run on the call's project.
        (post.clone(), "/v1/fncall/run".into(), Key),
        (post.clone(), "/v1/fncall/batch".into(), Key),
        (get.clone(), "/v1/fncall/languages".into(), Key),
        (post.clone(), "/run_code".into(), Key),
        // IAM: each handler checks the actor's grants on what it touches.
        (get.clone(), "/v1/whoami".into(), Key),
        (get.clone(), "/v1/projects".into(), Key),
        (post.clone(), "/v1/projects".into(), Key),
        (delete.clone(), "/v1/projects/{*path}".into(), Key),
        (put.clone(), "/v1/projects/{*path}".into(), Key),
        (get.clone(), "/v1/identities".into(), Key),
        (post.clone(), "/v1/identities".into(), Key),
        (get.clone(), "/v1/keys".into(), Key),
        (post.clone(), "/v1/keys".into(), Key),
        (delete.clone(), "/v1/keys/{id}".into(), Key),
        (get.clone(), "/v1/bindings".into(), Key),
        (post.clone(), "/v1/bindings".into(), Key),
        (delete.clone(), "/v1/bindings".into(), Key),
        (get.clone(), "/v1/audit".into(), Key),
    ];
    table
        .into_iter()
        .map(|(m, p, n)| ((m, &*Box::leak(p.into_boxed_str())), n))
        .collect()
});

/// What `method` on the route registered as `route` needs; none for a route not in the
/// table.
pub fn need(method: &Method, route: &str) -> Option<Need> {
    ROUTES.get(&(method.clone(), route)).copied()
}

/// Every (method, route) in the table, for the test that the router has no other.
pub fn table() -> Vec<(Method, &'static str)> {
    ROUTES.keys().cloned().collect()
}

fn header_of(scope: &[String]) -> Option<HeaderValue> {
    // An empty scope still goes as a header (one matching nothing): absent means no limit.
    HeaderValue::from_str(&scope.join(",")).ok()
}

/// Middleware: authenticates the key and checks the route's permission.
pub async fn authorize(State(c): State<Arc<Control>>, mut req: Request, next: Next) -> Response {
    // Only the control plane says what a request may reach.
    req.headers_mut().remove(SCOPE_HEADER);
    req.headers_mut().remove(VISIBLE_HEADER);
    let Some(key) = crate::auth::presented(&req) else {
        return warren_http::Error(ApiError::new(
            ErrorCode::Unauthenticated,
            "no API key: send Authorization: Bearer <key> (the admin key is in \
             <data-dir>/admin.key; the CLI reads WARREN_API_KEY)",
        ))
        .into_response();
    };
    let key = key.into_owned();
    let who = match c.iam.authenticate(&key).await {
        Ok(Some(p)) => p,
        Ok(None) => {
            return warren_http::Error(ApiError::new(
                ErrorCode::Unauthenticated,
                "the API key is not valid (unknown, revoked or expired): use the key in \
                 <data-dir>/admin.key (default /var/lib/warren/admin.key) or one made with \
                 warren key create",
            ))
            .into_response();
        }
        Err(e) => return warren_http::Error(e.into()).into_response(),
    };
    // Made on behalf of another key (the E2B gateway's envd calls): that key's grants decide,
    // and changes are audited under it.
    let named = req
        .headers()
        .get(ON_BEHALF_HEADER)
        .map(|v| v.to_str().unwrap_or("").trim().to_string());
    let acting = match on_behalf(&c, &who, named).await {
        Ok(Some(p)) => Some((p, who.key_id.clone())),
        Ok(None) => None,
        Err(r) => return r,
    };
    let who = match &acting {
        Some((p, _)) => p.clone(),
        None => who,
    };
    let route = req
        .extensions()
        .get::<MatchedPath>()
        .map(|m| m.as_str().to_string())
        .unwrap_or_default();
    let Some(need) = need(req.method(), &route) else {
        return warren_http::Error(ApiError::new(
            ErrorCode::PermissionDenied,
            format!(
                "{} {route}: no permission is defined for this route, so no key may call it",
                req.method()
            ),
        ))
        .into_response();
    };
    let on_sandbox = route.starts_with("/v1/sandboxes/{id}");
    let perm = match need {
        Need::Key => None,
        Need::Root(p) => {
            if !who.allows(p, ROOT) {
                return denied(&who, p, ROOT);
            }
            // Which sandboxes (a commit's) it may reach: those it may see.
            Some(Perm::SandboxRead)
        }
        Need::In(p) => Some(p),
    };
    if let Some(p) = perm {
        let scope = who.scope(p);
        let visible = who.scope(Perm::SandboxRead);
        if scope.is_empty() {
            if on_sandbox && visible.is_empty() {
                return warren_http::Error(ApiError::new(
                    ErrorCode::SandboxNotFound,
                    "sandbox not found",
                ))
                .into_response();
            }
            if !on_sandbox {
                return denied(&who, p, &who.project);
            }
        }
        // Paths are checked ASCII: a header is always made; should one not be, the request
        // is refused rather than sent without a limit.
        match (header_of(&scope), header_of(&visible)) {
            (Some(s), Some(v)) => {
                req.headers_mut().insert(SCOPE_HEADER, s);
                req.headers_mut().insert(VISIBLE_HEADER, v);
            }
            _ => return denied(&who, p, &who.project),
        }
    }
    req.extensions_mut().insert(who.clone());
    let Some((_, by)) = acting else {
        return next.run(req).await;
    };
    let (method, path) = (req.method().clone(), req.uri().path().to_string());
    let from = super::iam::source_of(req.headers(), req.extensions().get());
    let resp = next.run(req).await;
    // What another key's request changed or ran (not what it read) is audited under that key,
    // whatever the answer: the record says who asked for whom.
    if method != Method::GET {
        let action = match need {
            Need::Key => "request",
            Need::In(p) | Need::Root(p) => p.name(),
        };
        let detail = format!(
            "{method} {path} on behalf of {} by key {by} (E2B gateway): {}",
            who.key_id,
            resp.status().as_u16()
        );
        super::iam::audited(
            &c,
            &who,
            &from,
            action,
            &path,
            Some(&who.project),
            Some(&detail),
        )
        .await;
    }
    resp
}

/// The principal of the key a request is made on behalf of (`x-warren-on-behalf-of`), if it
/// names one; or the refusal. Only a key holding every permission on `root` may name one (it
/// can already do all the named key can, so acting for it grants nothing new: it narrows the
/// request to what that key may do and makes the audit log name it). A revoked, expired or
/// unknown key is a 401 that names it.
async fn on_behalf(
    c: &Control,
    who: &Principal,
    named: Option<String>,
) -> Result<Option<Arc<Principal>>, Response> {
    let Some(id) = named else {
        return Ok(None);
    };
    if !who.perms_at(ROOT).contains(Perms::all()) {
        return Err(warren_http::Error(ApiError::new(
            ErrorCode::PermissionDenied,
            format!(
                "{ON_BEHALF_HEADER}: only a key holding every permission on root may act on behalf of another key (key {} does not); leave the header out",
                who.key_id
            ),
        ))
        .into_response());
    }
    match c.iam.principal_by_id(&id).await {
        Ok(Some(p)) => Ok(Some(p)),
        Ok(None) => Err(warren_http::Error(ApiError::new(
            ErrorCode::Unauthenticated,
            format!(
                "key {:?}, on whose behalf this request is made, is not valid (revoked, expired \
                 or unknown): ask for a new key, and a new E2B access token with it \
                 (Sandbox.connect)",
                id.chars().take(64).collect::<String>()
            ),
        ))
        .into_response()),
        Err(e) => Err(warren_http::Error(e.into()).into_response()),
    }
}

fn denied(who: &Principal, p: Perm, project: &str) -> Response {
    warren_http::Error(ApiError::new(
        ErrorCode::PermissionDenied,
        format!(
            "identity {} (key {}) does not hold {p} on {project}: ask whoever manages it for a \
             key that does (warren key create --role ...)",
            who.identity, who.key_id
        ),
    ))
    .into_response()
}

/// The scope a request was given (`x-warren-scope`), for calls the control plane makes to
/// nodes on its behalf.
pub fn scope_of(headers: &axum::http::HeaderMap) -> Option<String> {
    headers
        .get(SCOPE_HEADER)
        .and_then(|v| v.to_str().ok())
        .map(str::to_string)
}
