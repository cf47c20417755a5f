//! Health, nodes, and the API's own description.

use axum::http::header;
use axum::response::{IntoResponse, Response};
use warren_http::{Error, Json};
use warren_types::api::{Gathered, Health, NodeList};
use warren_types::error::ErrorBody;

use super::S;

/// Whether the control plane answers and how many nodes do. No API key needed.
#[utoipa::path(get, path = "/v1/health", tag = "system", responses((status = 200, body = Health)))]
pub async fn health(axum::extract::State(c): S) -> Json<Health> {
    let nodes = c.nodes.all();
    let up = nodes.iter().filter(|n| n.is_up()).count() as u32;
    Json(Health {
        status: if up as usize == nodes.len() && up > 0 {
            "ok"
        } else {
            "degraded"
        }
        .into(),
        version: env!("CARGO_PKG_VERSION").into(),
        nodes_up: up,
        nodes: nodes.len() as u32,
        sandbox_domain: c.cfg.sandbox_domain.clone(),
    })
}

/// Every node with its capacity and load. Each node is asked now; one that does not answer is
/// listed with its last report (`reachable: false`) and named in `unreachable` — a list of
/// nodes is never refused because nodes are down.
#[utoipa::path(get, path = "/v1/nodes", tag = "system",
    responses((status = 200, body = Gathered<NodeList>), (status = 401, body = ErrorBody)),
    security(("api_key" = [])))]
pub async fn nodes(axum::extract::State(c): S) -> Result<Json<Gathered<NodeList>>, Error> {
    let polled = c.nodes.collect().await;
    Ok(Json(Gathered {
        answer: NodeList {
            nodes: c.nodes.all().iter().map(|n| n.info()).collect(),
        },
        unreachable: polled.unreachable().to_vec(),
    }))
}

/// This document. No API key needed.
#[utoipa::path(get, path = "/v1/openapi.json", tag = "system", responses((status = 200, description = "OpenAPI 3.1 document.")))]
pub async fn openapi() -> Response {
    (
        [(header::CONTENT_TYPE, "application/json")],
        crate::openapi::document(),
    )
        .into_response()
}
