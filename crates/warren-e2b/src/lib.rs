//! Warren's E2B-compatible gateway: the unmodified `e2b` SDK, pointed at it with
//! `E2B_API_URL` and `E2B_SANDBOX_URL` (one listener serves both), drives Warren sandboxes.
//!
//! It is a thin translation onto Warren's own REST API (through `warren-sdk`), holding no state
//! of its own but each sandbox's last few envd access tokens (`tokens`, for signed URLs): E2B's control-plane routes (`api`) become Warren creates, lists, timeouts,
//! pauses and kills; the in-sandbox side (envd's routes, chosen by the `E2b-Sandbox-Id` and
//! `E2b-Sandbox-Port` headers, `envd`) becomes Warren's exec and file operations. The Connect
//! protocol envd speaks is in `connect`.
//!
//! Keys: the SDK sends `X-API-KEY`, which older SDKs insist is `e2b_` and hex; the gateway
//! has one such key (`warren up` writes it to `<data-dir>/e2b.key`) and acts with a Warren key
//! (the admin key); any other key is a Warren key and the gateway acts with it.
//!
//! envd access tokens (`tokens`) name the Warren key they were answered to — the caller's,
//! or the admin key's for the gateway's own key — and expire; every envd call is made on that
//! key's behalf (`x-warren-on-behalf-of`), so Warren refuses it once the key is revoked or has
//! lost the sandbox, and audits what it runs under that key.

pub mod api;
pub mod connect;
pub mod envd;
mod files;
pub mod keys;
mod network;
mod process;
pub mod tokens;

use std::sync::Arc;

use axum::Router;

/// The envd version the gateway reports. The SDK switches features on by it; it says what
/// the gateway really implements (see `envd`): stdin left closed unless asked for (0.3.0),
/// the user unnamed by default (0.4.0, Warren's `user`), closing stdin (0.5.2), octet-stream
/// and gzip uploads (0.5.7), file metadata (0.6.2), watch events with their entries (0.6.3),
/// `allow_network_mounts` accepted (0.6.4: Warren watches any path; a sandbox sees no network
/// mounts but its own).
pub const ENVD_VERSION: &str = "0.6.4";

/// E2B's constant client id (deprecated in its API, still required in answers).
pub const CLIENT_ID: &str = "6532622b";

/// What the gateway needs.
pub struct Gateway {
    /// Warren's API, as the gateway's identity.
    pub warren: warren_sdk::Client,
    /// The E2B key clients must present.
    pub key: String,
    /// The Warren image the `base` template names.
    pub base_image: String,
    /// Warren's `sandbox_domain`, answered as E2B's `domain`: the SDK's `get_host(port)` is
    /// then `<port>-<id>.<domain>`, which Warren's API serves (wildcard DNS to it).
    pub domain: Option<String>,
    /// The caller's key, when it is not the gateway's own: what it holds where (envd access
    /// tokens go only to callers holding `sandbox.exec` and `sandbox.files` on the sandbox).
    pub caller: Option<Arc<warren_sdk::WhoAmI>>,
    /// envd access tokens: what signs them, and each sandbox's recent ones.
    pub tokens: Arc<tokens::Tokens>,
}

impl Gateway {
    /// Whether the caller may have an envd access token for a sandbox of `project` (Warren
    /// checks each envd call again, made on behalf of the caller's key; this spares a token
    /// that could do nothing).
    pub fn may_envd(&self, project: &str) -> bool {
        let Some(who) = &self.caller else {
            return true;
        };
        let held = |perm: &str| {
            who.grants.iter().any(|g| {
                warren_types::project::within(project, &g.project)
                    && g.permissions.iter().any(|p| p == perm)
            })
        };
        held("sandbox.exec") && held("sandbox.files")
    }

    /// The envd access token the caller may have for sandbox `sb` (none: it may not run
    /// commands and files there), bound to the caller's Warren key.
    pub(crate) async fn envd_token(
        &self,
        sb: &warren_sdk::SandboxInfo,
    ) -> Result<Option<String>, warren_sdk::Error> {
        if !self.may_envd(&sb.project) {
            return Ok(None);
        }
        let key_id = match &self.caller {
            Some(who) => who.key_id.clone(),
            None => self.tokens.own_key_id(&self.warren).await?,
        };
        let end = tokens::parse_time(&sb.expires_at);
        Ok(Some(self.tokens.issue(&key_id, sb.id.as_str(), end)))
    }
}

/// An HTTP error in E2B's shape: `{"code": <status>, "message": ...}`.
pub(crate) fn json_error(
    status: axum::http::StatusCode,
    message: impl Into<String>,
) -> axum::response::Response {
    use axum::response::IntoResponse;
    (
        status,
        axum::Json(serde_json::json!({"code": status.as_u16(), "message": message.into()})),
    )
        .into_response()
}

/// The status a Warren failure answers with: Warren's own for its refusals, 503 when it
/// cannot be reached, 502 for anything else it sent.
pub(crate) fn warren_status(e: &warren_sdk::Error) -> axum::http::StatusCode {
    use axum::http::StatusCode;
    match e {
        // Warren refusing the gateway's own key is not the client's fault (a caller's own key
        // is checked before: see `api::caller`); a caller's key may lack a permission (403).
        warren_sdk::Error::Api { status: 401, .. } => StatusCode::BAD_GATEWAY,
        warren_sdk::Error::Api { status, .. } => {
            StatusCode::from_u16(*status).unwrap_or(StatusCode::BAD_GATEWAY)
        }
        warren_sdk::Error::Invalid(_) => StatusCode::BAD_REQUEST,
        warren_sdk::Error::Connect { .. } | warren_sdk::Error::Transport(_) => {
            StatusCode::SERVICE_UNAVAILABLE
        }
        _ => StatusCode::BAD_GATEWAY,
    }
}

/// The gateway's routes.
pub fn router(gw: Arc<Gateway>) -> Router {
    // Keys and tokens are checked from the headers before any body is read.
    let api = api::routes().route_layer(axum::middleware::from_fn_with_state(
        gw.clone(),
        api::require_key,
    ));
    let envd = envd::routes().route_layer(axum::middleware::from_fn_with_state(
        gw.clone(),
        envd::require_token,
    ));
    api.merge(envd)
        .merge(envd::health_routes())
        .with_state(gw)
        .layer(axum::extract::DefaultBodyLimit::max(connect::MAX_MESSAGE))
}

#[cfg(test)]
mod tests;
