//! Health, nodes, and the API's own description.

use axum::http::header;
use axum::response::{IntoResponse, Response};
use warren_http::{Error, Json};
use warren_types::api::{Gathered, Health, NodeList};
use warren_types::error::ErrorBody;

use super::S;
use crate::iam::{Perm, Principal};

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
/// nodes is never refused because nodes are down. Function-call pools (`fncall_pools`, which
/// name the images of every project's calls) are shown only to keys that may see the root
/// project's sandboxes, whose workers they are.
#[utoipa::path(get, path = "/v1/nodes", tag = "system",
    responses((status = 200, body = Gathered<NodeList>), (status = 401, body = ErrorBody)),
    security(("api_key" = [])))]
pub async fn nodes(
    axum::extract::State(c): S,
    axum::Extension(who): axum::Extension<std::sync::Arc<Principal>>,
) -> Result<Json<Gathered<NodeList>>, Error> {
    let polled = c.nodes.collect().await;
    let pools = who.allows(Perm::SandboxRead, warren_types::project::ROOT);
    Ok(Json(Gathered {
        answer: NodeList {
            nodes: c
                .nodes
                .all()
                .iter()
                .map(|n| {
                    let mut i = n.info();
                    if !pools {
                        i.fncall_pools.clear();
                    }
                    i
                })
                .collect(),
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
