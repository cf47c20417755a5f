//! `GET /v1/events`: incident events, gathered from the nodes that recorded them.

use warren_http::{Error, Json, Query};
use warren_types::api::Gathered;
use warren_types::error::{ApiError, ErrorBody, ErrorCode};
use warren_types::events::{EventKind, EventList};

use super::S;
use crate::api::forward::route;
use crate::fanout::{self, Policy};
use crate::node_api::EventFilter;

/// `GET /v1/events` filters.
#[derive(Debug, Default, serde::Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct EventQuery {
    /// Only this sandbox's events (it may be gone: events outlive their sandboxes).
    #[param(pattern = "^[a-z][a-z0-9]{19}$")]
    pub sandbox: Option<String>,
    /// Only events of sandboxes of this task.
    pub task: Option<String>,
    /// Only this kind: `seccomp`, `management`, `disk_quota`, `output_truncated`,
    /// `pids_limit` or `oom_kill`.
    #[param(value_type = Option<EventKind>)]
    pub kind: Option<String>,
    /// Only events that happened since then: an RFC 3339 time (`2026-12-01T10:00:00Z`) or a
    /// duration back from now (`10m`, `2h`, `1d`).
    #[param(
        pattern = "^(0|[0-9]{1,6}(s|m|h|d)|(19[7-9][0-9]|2[0-9]{3})-(0[1-9]|1[0-2])-(0[1-9]|1[0-9]|2[0-8])T([01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9]Z)$"
    )]
    pub since: Option<String>,
}

/// `since` as ms since the epoch.
fn since_ms(s: &str) -> Result<u64, Error> {
    let bad = || {
        Error(ApiError::invalid(format!(
            "since {s:?} is neither an RFC 3339 time (2026-12-01T10:00:00Z) nor a duration (10m, 2h, 1d)"
        )))
    };
    let now = std::time::SystemTime::now();
    let t = match humantime::parse_rfc3339_weak(s) {
        Ok(t) => t,
        Err(_) => {
            let d = humantime::parse_duration(s).map_err(|_| bad())?;
            now.checked_sub(d).ok_or_else(bad)?
        }
    };
    Ok(t.duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0))
}

/// Incident events: denied system calls, attempts on the guest agent, disk quotas reached,
/// output cut, process and memory limits hit. Each sums a burst (its `count`); oldest first.
/// Events outlive their sandboxes. A node that does not answer is named in `unreachable` (its
/// events are missing), and when no node answers the call fails with 503.
#[utoipa::path(get, path = "/v1/events", tag = "events", params(EventQuery),
    responses((status = 200, body = Gathered<EventList>), (status = 400, body = ErrorBody),
        (status = 503, description = "No node answered.", body = ErrorBody)),
    security(("api_key" = [])))]
pub async fn list(
    axum::extract::State(c): S,
    headers: axum::http::HeaderMap,
    Query(q): Query<EventQuery>,
) -> Result<Json<Gathered<EventList>>, Error> {
    if let Some(k) = &q.kind
        && EventKind::parse(k).is_none()
    {
        let known: Vec<&str> = EventKind::ALL.iter().map(|k| k.name()).collect();
        return Err(Error(ApiError::invalid(format!(
            "unknown event kind {k:?} (known: {})",
            known.join(", ")
        ))));
    }
    let mut filter = EventFilter {
        sandbox: None,
        task: q.task,
        kind: q.kind,
        since_ms: q.since.as_deref().map(since_ms).transpose()?,
    };
    // A sandbox id names its node: ask only that one.
    let nodes = match &q.sandbox {
        Some(raw) => match route(&c, raw) {
            Ok((id, node)) => {
                filter.sandbox = Some(id);
                vec![node]
            }
            // A node that left the cluster took its events with it.
            Err(e) if e.0.code == ErrorCode::SandboxNotFound => {
                return Ok(Json(Gathered::default()));
            }
            Err(e) => return Err(e),
        },
        None => c.nodes.all(),
    };
    let filter = &filter;
    let scope = super::access::scope_of(&headers);
    let scope = scope.as_deref();
    let parts = fanout::ask(
        nodes,
        |n| async move { n.api().events(filter, scope).await },
    )
    .await
    .under(Policy::Partial, "listing events")?;
    let mut events: Vec<_> = parts.answer.into_iter().flat_map(|l| l.events).collect();
    events.sort_by(|a, b| a.first_at.cmp(&b.first_at).then_with(|| a.id.cmp(&b.id)));
    Ok(Json(Gathered {
        answer: EventList { events },
        unreachable: parts.unreachable,
    }))
}
