//! Cluster membership over the API: nodes joining (with the cluster token), cordons.

use axum::extract::{Path, Request, State};
use axum::http::header;
use warren_http::{Error, Json};
use warren_types::api::{NodeInfo, NodeRegistered, NodeRegistration};
use warren_types::error::{ApiError, ErrorBody, ErrorCode};

use super::S;

/// A node joins the cluster, or says it is still there (its heartbeat).
///
/// Authenticated by the cluster token (`Authorization: Bearer <token>`, the control plane's
/// `<data-dir>/cluster.token`), not an API key. A node new to the cluster, or at a new
/// address, is called back there and must answer with the id it claims.
#[utoipa::path(post, path = "/v1/cluster/nodes", tag = "system",
    request_body = NodeRegistration,
    responses(
        (status = 200, body = NodeRegistered),
        (status = 400, description = "A bad URL, or the node does not answer there with that id.", body = ErrorBody),
        (status = 401, description = "No cluster token, or a wrong one.", body = ErrorBody),
        (status = 409, description = "Another node with this id answers at another address.", body = ErrorBody),
        (status = 503, description = "The database does not answer.", body = ErrorBody),
    ),
    security(("api_key" = [])))]
pub async fn register(State(c): S, req: Request) -> Result<Json<NodeRegistered>, Error> {
    let ok = req
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .is_some_and(|v| warren_http::token_matches(v, &c.cluster_token));
    if !ok {
        return Err(Error(ApiError::new(
            ErrorCode::Unauthenticated,
            "joining needs the cluster token: Authorization: Bearer <the control plane's \
             <data-dir>/cluster.token> (warren node --cluster-token-file)",
        )));
    }
    let Json(reg) =
        <Json<NodeRegistration> as axum::extract::FromRequest<()>>::from_request(req, &()).await?;
    Ok(Json(
        crate::cluster::register(&c, reg).await.map_err(Error)?,
    ))
}

/// Keep new sandboxes off a node (its sandboxes run on).
#[utoipa::path(post, path = "/v1/nodes/{node}/cordon", tag = "system",
    params(("node" = String, Path, description = "The node's id.")),
    responses((status = 200, body = NodeInfo), (status = 404, body = ErrorBody),
        (status = 503, body = ErrorBody)),
    security(("api_key" = [])))]
pub async fn cordon(State(c): S, Path(node): Path<String>) -> Result<Json<NodeInfo>, Error> {
    Ok(Json(
        crate::cluster::set_cordon(&c, &node, true)
            .await
            .map_err(Error)?,
    ))
}

/// Let new sandboxes on a cordoned node again.
#[utoipa::path(post, path = "/v1/nodes/{node}/uncordon", tag = "system",
    params(("node" = String, Path, description = "The node's id.")),
    responses((status = 200, body = NodeInfo), (status = 404, body = ErrorBody),
        (status = 503, body = ErrorBody)),
    security(("api_key" = [])))]
pub async fn uncordon(State(c): S, Path(node): Path<String>) -> Result<Json<NodeInfo>, Error> {
    Ok(Json(
        crate::cluster::set_cordon(&c, &node, false)
            .await
            .map_err(Error)?,
    ))
}

/// Remove a node from the cluster for good (a retired machine). Refused (409) while it
/// answers: drain and stop it first.
#[utoipa::path(delete, path = "/v1/nodes/{node}", tag = "system",
    params(("node" = String, Path, description = "The node's id.")),
    responses((status = 204, description = "Removed."), (status = 404, body = ErrorBody),
        (status = 409, description = "It still answers, or it is warren up's own node.", body = ErrorBody),
        (status = 503, body = ErrorBody)),
    security(("api_key" = [])))]
pub async fn remove(
    State(c): S,
    Path(node): Path<String>,
) -> Result<axum::http::StatusCode, Error> {
    crate::cluster::remove(&c, &node).await.map_err(Error)?;
    Ok(axum::http::StatusCode::NO_CONTENT)
}
