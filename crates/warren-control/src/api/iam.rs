//! IAM routes: who the key is, projects, identities, bindings, keys and the audit log. Each
//! handler leaves the checks to `iam::store`, which refuses what the calling key may not do.

use std::sync::Arc;

use axum::Extension;
use axum::http::{HeaderMap, StatusCode};
use warren_http::{Error, Json, Path, Query};
use warren_types::api::{
    ApiKey, ApiKeyList, AuditEntry, AuditList, Binding, BindingList, CreateIdentity, CreateKey,
    CreateProject, Grant, GrantRequest, Identity, IdentityList, NewApiKey, Project, ProjectList,
    ProjectQuota, WhoAmI,
};
use warren_types::error::{ApiError, ErrorBody};

use super::S;
use crate::iam::store::{self, Actor, KeyRow, NewKey, Quota};
use crate::iam::{IamError, Principal};

type Who = Extension<Arc<Principal>>;

fn time(ms: i64) -> String {
    warren_images::rfc3339(ms.max(0) as u64)
}

fn err(e: IamError) -> Error {
    Error(e.into())
}

/// Where a request came from, for the audit log: the peer address the listener saw, and what
/// a proxy in front of Warren says in `X-Forwarded-For` (`203.0.113.5 via 127.0.0.1:4711`:
/// the forwarded part is only as true as the proxy, so the peer is always kept beside it).
#[derive(Debug, Clone, Default)]
pub struct Source(pub Option<String>);

impl<S: Send + Sync> axum::extract::FromRequestParts<S> for Source {
    type Rejection = std::convert::Infallible;

    async fn from_request_parts(
        parts: &mut axum::http::request::Parts,
        _: &S,
    ) -> Result<Source, Self::Rejection> {
        Ok(source_of(&parts.headers, parts.extensions.get()))
    }
}

/// The source of a request with these headers from this peer.
pub fn source_of(headers: &HeaderMap, peer: Option<&warren_http::serve::Peer>) -> Source {
    let forwarded = headers
        .get("x-forwarded-for")
        .and_then(|v| v.to_str().ok())
        .map(|v| v.split(',').next().unwrap_or(v).trim())
        .filter(|v| !v.is_empty() && v.len() <= 64);
    let peer = peer.map(|p| &*p.0);
    Source(match (forwarded, peer) {
        (Some(f), Some(p)) => Some(format!("{f} via {p}")),
        (Some(f), None) => Some(f.to_string()),
        (None, Some(p)) => Some(p.to_string()),
        (None, None) => None,
    })
}

/// Records an action outside IAM in the audit log. It is done already: a log that cannot be
/// written is an error in the server's log, not the caller's failure.
pub async fn audited(
    c: &crate::Control,
    who: &Principal,
    from: &Source,
    action: &str,
    target: &str,
    project: Option<&str>,
    detail: Option<&str>,
) {
    if let Err(e) = store::record(
        c.iam.db(),
        actor(who, from),
        action,
        target,
        project,
        detail,
    )
    .await
    {
        tracing::error!(action, target, "the audit log could not record this: {e}");
    }
}

/// A network policy as the audit log keeps it: its JSON, cut at 1,000 characters.
pub fn policy_detail(p: &warren_types::net::NetworkPolicy) -> String {
    let mut s = serde_json::to_string(p).unwrap_or_default();
    if s.len() > 1000 {
        let mut end = 1000;
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        s.truncate(end);
        s.push('…');
    }
    s
}

fn actor<'a>(who: &'a Principal, from: &'a Source) -> Actor<'a> {
    Actor {
        who,
        source: from.0.as_deref(),
    }
}

/// The calling key: its identity, project and grants.
#[utoipa::path(get, path = "/v1/whoami", tag = "iam",
    responses((status = 200, body = WhoAmI), (status = 401, body = ErrorBody)),
    security(("api_key" = [])))]
pub async fn whoami(Extension(who): Who) -> Json<WhoAmI> {
    Json(WhoAmI {
        identity: who.identity.clone(),
        key_id: who.key_id.clone(),
        project: who.project.clone(),
        grants: who
            .grants
            .iter()
            .map(|(p, g)| Grant {
                project: p.clone(),
                permissions: g.names().into_iter().map(str::to_string).collect(),
            })
            .collect(),
    })
}

fn project(p: store::ProjectRow) -> Project {
    Project {
        path: p.path,
        created_at: time(p.created_ms),
        created_by: p.created_by,
        max_sandboxes: p.quota.max_sandboxes.map(|v| v as u64),
        max_cpu: p.quota.max_cpu.map(|v| v as u64),
        max_memory: p.quota.max_memory.map(|v| v as u64),
        max_fncalls: p.quota.max_fncalls.map(|v| v as u64),
    }
}

/// Projects the key may see.
#[utoipa::path(get, path = "/v1/projects", tag = "iam",
    responses((status = 200, body = ProjectList), (status = 401, body = ErrorBody)),
    security(("api_key" = [])))]
pub async fn list_projects(
    axum::extract::State(c): S,
    Extension(who): Who,
    from: Source,
) -> Result<Json<ProjectList>, Error> {
    let rows = store::list_projects(c.iam.db(), actor(&who, &from))
        .await
        .map_err(err)?;
    Ok(Json(ProjectList {
        projects: rows.into_iter().map(project).collect(),
    }))
}

/// Create a child project (needs `project.admin` on its parent).
#[utoipa::path(post, path = "/v1/projects", tag = "iam", request_body = CreateProject,
    responses((status = 201, body = Project), (status = 400, body = ErrorBody),
        (status = 403, body = ErrorBody), (status = 404, body = ErrorBody),
        (status = 409, body = ErrorBody)),
    security(("api_key" = [])))]
pub async fn create_project(
    axum::extract::State(c): S,
    Extension(who): Who,
    from: Source,
    Json(req): Json<CreateProject>,
) -> Result<(StatusCode, Json<Project>), Error> {
    let p = store::create_project(c.iam.db(), actor(&who, &from), &req.path)
        .await
        .map_err(err)?;
    c.iam.changed();
    Ok((StatusCode::CREATED, Json(project(p))))
}

/// `DELETE /v1/projects/{path}` options.
#[derive(Debug, Default, serde::Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct DeleteProjectQuery {
    /// Kill its sandboxes first (otherwise a project with sandboxes is not deleted).
    #[serde(default)]
    pub force: bool,
}

/// Delete a project (needs `project.admin` on its parent). Refused while it has child
/// projects, identities made in it, or sandboxes (unless `force`, which kills them). Its
/// bindings go and keys acting in it are revoked.
#[utoipa::path(delete, path = "/v1/projects/{path}", tag = "iam",
    params(("path" = String, Path, description = "The project's path."), DeleteProjectQuery),
    responses((status = 204), (status = 400, body = ErrorBody), (status = 403, body = ErrorBody),
        (status = 404, body = ErrorBody), (status = 409, body = ErrorBody),
        (status = 503, body = ErrorBody)),
    security(("api_key" = [])))]
pub async fn delete_project(
    axum::extract::State(c): S,
    Extension(who): Who,
    from: Source,
    Path(path): Path<String>,
    Query(q): Query<DeleteProjectQuery>,
) -> Result<StatusCode, Error> {
    // Everything but its sandboxes first: the path, the permission, children, identities.
    store::check_delete_project(c.iam.db(), actor(&who, &from), &path)
        .await
        .map_err(err)?;
    // Its sandboxes, asked of every node (a node that does not answer fails the delete: its
    // sandboxes would be orphaned). The path is checked: no comma, so the scope is this
    // subtree alone.
    let scope = path.clone();
    let scope = &scope;
    let parts = crate::fanout::ask(c.nodes.all(), |n| async move {
        let f = crate::node_api::SandboxFilter {
            scope: Some(scope.clone()),
            ..Default::default()
        };
        n.api().sandboxes(&f).await
    })
    .await
    .under(crate::fanout::Policy::AllOrFail, "deleting a project")?;
    let sandboxes: Vec<_> = parts.answer.into_iter().flat_map(|l| l.sandboxes).collect();
    let mut count = sandboxes.len();
    if q.force {
        for sb in &sandboxes {
            if let Some(n) = c.nodes.get(&sb.node) {
                // Scoped to the project: the node kills nothing outside it.
                let _ = n
                    .client
                    .request(reqwest::Method::DELETE, &format!("/v1/sandboxes/{}", sb.id))
                    .header(warren_types::project::SCOPE_HEADER, scope.as_str())
                    .header(warren_types::project::VISIBLE_HEADER, scope.as_str())
                    .send()
                    .await;
            }
        }
        count = 0;
    }
    store::delete_project(c.iam.db(), actor(&who, &from), &path, count)
        .await
        .map_err(err)?;
    c.iam.changed();
    Ok(StatusCode::NO_CONTENT)
}

/// Set a project's quotas (needs `project.admin` on its parent; root's, on root).
#[utoipa::path(put, path = "/v1/projects/{path}", tag = "iam", request_body = ProjectQuota,
    params(("path" = String, Path, description = "The project's path.")),
    responses((status = 204), (status = 400, body = ErrorBody), (status = 403, body = ErrorBody),
        (status = 404, body = ErrorBody)),
    security(("api_key" = [])))]
pub async fn set_quota(
    axum::extract::State(c): S,
    Extension(who): Who,
    from: Source,
    Path(path): Path<String>,
    Json(q): Json<ProjectQuota>,
) -> Result<StatusCode, Error> {
    let big = |v: u64, what: &str| {
        i64::try_from(v).map_err(|_| Error(ApiError::invalid(format!("{what} is too large"))))
    };
    let quota = Quota {
        max_sandboxes: q
            .max_sandboxes
            .map(|v| big(v, "max_sandboxes"))
            .transpose()?,
        max_cpu: q.max_cpu.map(|v| big(v, "max_cpu")).transpose()?,
        max_memory: q
            .max_memory
            .map(|v| big(v.bytes(), "max_memory"))
            .transpose()?,
        max_fncalls: q.max_fncalls.map(|v| big(v, "max_fncalls")).transpose()?,
    };
    store::set_quota(c.iam.db(), actor(&who, &from), &path, quota)
        .await
        .map_err(err)?;
    c.iam.changed();
    Ok(StatusCode::NO_CONTENT)
}

fn identity(i: store::IdentityRow) -> Identity {
    Identity {
        name: i.name,
        kind: i.kind,
        project: i.project,
        created_at: time(i.created_ms),
        created_by: i.created_by,
    }
}

/// Identities the key manages (itself, and those made where it holds `iam.delegate`).
#[utoipa::path(get, path = "/v1/identities", tag = "iam",
    responses((status = 200, body = IdentityList), (status = 401, body = ErrorBody)),
    security(("api_key" = [])))]
pub async fn list_identities(
    axum::extract::State(c): S,
    Extension(who): Who,
    from: Source,
) -> Result<Json<IdentityList>, Error> {
    let rows = store::list_identities(c.iam.db(), actor(&who, &from))
        .await
        .map_err(err)?;
    Ok(Json(IdentityList {
        identities: rows.into_iter().map(identity).collect(),
    }))
}

/// Create an identity (needs `iam.delegate` where it is made).
#[utoipa::path(post, path = "/v1/identities", tag = "iam", request_body = CreateIdentity,
    responses((status = 201, body = Identity), (status = 400, body = ErrorBody),
        (status = 403, body = ErrorBody), (status = 404, body = ErrorBody),
        (status = 409, body = ErrorBody)),
    security(("api_key" = [])))]
pub async fn create_identity(
    axum::extract::State(c): S,
    Extension(who): Who,
    from: Source,
    Json(req): Json<CreateIdentity>,
) -> Result<(StatusCode, Json<Identity>), Error> {
    let project = req.project.clone().unwrap_or_else(|| who.project.clone());
    let kind = req.kind.as_deref().unwrap_or("service");
    let i = store::create_identity(c.iam.db(), actor(&who, &from), &req.name, kind, &project)
        .await
        .map_err(err)?;
    c.iam.changed();
    Ok((StatusCode::CREATED, Json(identity(i))))
}

fn binding(b: store::BindingRow) -> Binding {
    Binding {
        identity: b.identity,
        project: b.project,
        grant: b.grant,
        created_at: time(b.created_ms),
        created_by: b.created_by,
    }
}

/// Bindings of the identities the key manages.
#[utoipa::path(get, path = "/v1/bindings", tag = "iam",
    responses((status = 200, body = BindingList), (status = 401, body = ErrorBody)),
    security(("api_key" = [])))]
pub async fn list_bindings(
    axum::extract::State(c): S,
    Extension(who): Who,
    from: Source,
) -> Result<Json<BindingList>, Error> {
    let rows = store::list_bindings(c.iam.db(), actor(&who, &from))
        .await
        .map_err(err)?;
    Ok(Json(BindingList {
        bindings: rows.into_iter().map(binding).collect(),
    }))
}

/// Grant an identity a role or a permission on a project's subtree (needs `iam.delegate`
/// there, and every permission granted).
#[utoipa::path(post, path = "/v1/bindings", tag = "iam", request_body = GrantRequest,
    responses((status = 201, body = Binding), (status = 400, body = ErrorBody),
        (status = 403, body = ErrorBody), (status = 404, body = ErrorBody)),
    security(("api_key" = [])))]
pub async fn grant(
    axum::extract::State(c): S,
    Extension(who): Who,
    from: Source,
    Json(req): Json<GrantRequest>,
) -> Result<(StatusCode, Json<Binding>), Error> {
    let b = store::grant(
        c.iam.db(),
        actor(&who, &from),
        &req.identity,
        &req.project,
        &req.grant,
    )
    .await
    .map_err(err)?;
    c.iam.changed();
    Ok((StatusCode::CREATED, Json(binding(b))))
}

/// Remove a binding (needs `iam.delegate` on its project). The admin identity's admin grant
/// on root stays (409): every other grant comes from it.
#[utoipa::path(delete, path = "/v1/bindings", tag = "iam", request_body = GrantRequest,
    responses((status = 204), (status = 400, body = ErrorBody), (status = 403, body = ErrorBody),
        (status = 404, body = ErrorBody), (status = 409, body = ErrorBody)),
    security(("api_key" = [])))]
pub async fn revoke_grant(
    axum::extract::State(c): S,
    Extension(who): Who,
    from: Source,
    Json(req): Json<GrantRequest>,
) -> Result<StatusCode, Error> {
    store::revoke_grant(
        c.iam.db(),
        actor(&who, &from),
        &req.identity,
        &req.project,
        &req.grant,
    )
    .await
    .map_err(err)?;
    c.iam.changed();
    Ok(StatusCode::NO_CONTENT)
}

fn key(k: KeyRow) -> ApiKey {
    ApiKey {
        id: k.id,
        name: k.name,
        identity: k.identity,
        project: k.project,
        role: k.role,
        created_at: time(k.created_ms),
        created_by: k.created_by,
        expires_at: k.expires_ms.map(time),
        revoked_at: k.revoked_ms.map(time),
        last_used_at: k.last_used_ms.map(time),
    }
}

/// Keys the calling key manages (its identity's, and those acting where it holds
/// `iam.delegate`); never their secrets.
#[utoipa::path(get, path = "/v1/keys", tag = "iam",
    responses((status = 200, body = ApiKeyList), (status = 401, body = ErrorBody)),
    security(("api_key" = [])))]
pub async fn list_keys(
    axum::extract::State(c): S,
    Extension(who): Who,
    from: Source,
) -> Result<Json<ApiKeyList>, Error> {
    let rows = store::list_keys(c.iam.db(), actor(&who, &from))
        .await
        .map_err(err)?;
    Ok(Json(ApiKeyList {
        keys: rows.into_iter().map(key).collect(),
    }))
}

/// Make a key (needs `iam.delegate` on its project and every permission of its role there);
/// its secret is in this answer only.
#[utoipa::path(post, path = "/v1/keys", tag = "iam", request_body = CreateKey,
    responses((status = 201, body = NewApiKey), (status = 400, body = ErrorBody),
        (status = 403, body = ErrorBody), (status = 404, body = ErrorBody)),
    security(("api_key" = [])))]
pub async fn create_key(
    axum::extract::State(c): S,
    Extension(who): Who,
    from: Source,
    Json(req): Json<CreateKey>,
) -> Result<(StatusCode, Json<NewApiKey>), Error> {
    let project = req.project.clone().unwrap_or_else(|| who.project.clone());
    let expires_ms = match req.expires_in {
        Some(0) => {
            return Err(Error(ApiError::invalid(
                "expires_in must be at least 1 second",
            )));
        }
        Some(s) if s > MAX_EXPIRES_IN => {
            return Err(Error(ApiError::invalid(format!(
                "expires_in {s} is more than {MAX_EXPIRES_IN} seconds (100 years): leave it out \
                 for a key that does not expire"
            ))));
        }
        Some(s) => Some(
            i64::try_from(s)
                .ok()
                .and_then(|s| s.checked_mul(1000))
                .and_then(|ms| store::now_ms().checked_add(ms))
                .ok_or_else(|| Error(ApiError::invalid("expires_in is too large")))?,
        ),
        None => None,
    };
    let (k, secret) = store::create_key(
        c.iam.db(),
        actor(&who, &from),
        NewKey {
            name: &req.name,
            identity: req.identity.as_deref(),
            project: &project,
            role: req.role.as_deref().unwrap_or("runner"),
            expires_ms,
            e2b_form: match req.form.as_deref() {
                None | Some("warren") => false,
                Some("e2b") => true,
                Some(f) => {
                    return Err(Error(ApiError::invalid(format!(
                        "form {f:?} is not warren or e2b"
                    ))));
                }
            },
        },
    )
    .await
    .map_err(err)?;
    c.iam.changed();
    Ok((
        StatusCode::CREATED,
        Json(NewApiKey {
            key: key(k),
            secret,
        }),
    ))
}

/// Revoke a key: it stops working on every replica within about a second.
#[utoipa::path(delete, path = "/v1/keys/{id}", tag = "iam",
    params(("id" = String, Path, description = "The key's id (key_...).")),
    responses((status = 200, body = ApiKey), (status = 404, body = ErrorBody),
        (status = 409, description = "The key making the request: revoke it with another.", body = ErrorBody)),
    security(("api_key" = [])))]
pub async fn revoke_key(
    axum::extract::State(c): S,
    Extension(who): Who,
    from: Source,
    Path(id): Path<String>,
) -> Result<Json<ApiKey>, Error> {
    let k = store::revoke_key(c.iam.db(), actor(&who, &from), &id)
        .await
        .map_err(err)?;
    c.iam.changed();
    Ok(Json(key(k)))
}

/// Longest a key may be made to last, seconds (100 years).
pub const MAX_EXPIRES_IN: u64 = 100 * 365 * 86400;

/// The largest integer JSON carries exactly.
const MAX_SAFE: u64 = (1 << 53) - 1;

/// `GET /v1/audit` filters.
#[derive(Debug, Default, serde::Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct AuditQuery {
    /// Only records since then, ms since the epoch.
    #[param(minimum = 0, maximum = 9007199254740991_u64)]
    pub since_ms: Option<u64>,
    /// Most records (default 100, at most 10,000).
    #[param(minimum = 1, maximum = 10000)]
    pub limit: Option<u64>,
}

/// The audit log, newest first: records of projects where the key holds `audit.read`.
#[utoipa::path(get, path = "/v1/audit", tag = "iam", params(AuditQuery),
    responses((status = 200, body = AuditList), (status = 400, body = ErrorBody),
        (status = 403, body = ErrorBody)),
    security(("api_key" = [])))]
pub async fn audit(
    axum::extract::State(c): S,
    Extension(who): Who,
    from: Source,
    Query(q): Query<AuditQuery>,
) -> Result<Json<AuditList>, Error> {
    let limit = q.limit.unwrap_or(100);
    if !(1..=10_000).contains(&limit) {
        return Err(Error(ApiError::invalid("limit must be 1 to 10000")));
    }
    let since = q.since_ms.unwrap_or(0);
    if since > MAX_SAFE {
        return Err(Error(ApiError::invalid(format!(
            "since_ms must be 0 to {MAX_SAFE} (ms since the epoch)"
        ))));
    }
    let since = since as i64;
    let rows = store::audit_log(c.iam.db(), actor(&who, &from), since, limit as i64)
        .await
        .map_err(err)?;
    Ok(Json(AuditList {
        entries: rows
            .into_iter()
            .map(|a| AuditEntry {
                id: a.id,
                at: time(a.at_ms),
                actor: a.actor,
                key_id: a.key_id,
                action: a.action,
                target: a.target,
                project: a.project,
                source: a.source,
                detail: a.detail,
            })
            .collect(),
    }))
}
