//! Task-level operations: pause, resume or stop every sandbox of a task, on every node at
//! once (one request per node, not per sandbox, through [`crate::fanout`]).

use warren_http::{Error, Json, Path};
use warren_types::api::{Gathered, TaskAction, TaskInfo, TaskList, TaskNetworkResult, TaskResult};
use warren_types::error::{ApiError, ErrorBody, ErrorCode};
use warren_types::net::NetworkPolicy;

use super::S;
use crate::fanout::{self, Policy};

fn action(raw: &str) -> Result<TaskAction, Error> {
    match raw {
        "pause" => Ok(TaskAction::Pause),
        "resume" => Ok(TaskAction::Resume),
        "stop" => Ok(TaskAction::Stop),
        _ => Err(Error(ApiError::new(
            ErrorCode::NotFound,
            format!("no task action {raw:?}: use pause, resume or stop"),
        ))),
    }
}

/// Pause, resume or stop every sandbox of a task.
///
/// Pause freezes them (memory kept; any later operation on one resumes it), resume thaws them,
/// stop kills them. Creates of the task still in flight follow: after a pause they land paused,
/// after a stop they are killed as they land (answered 410), and `creates_in_flight` counts
/// them. A task operation never waits behind the node's creates, execs or file transfers. The
/// answer counts the sandboxes it succeeded on and lists the ones it failed on with why; a node
/// that does not answer is named in `unreachable` (its sandboxes were not reached), and when no
/// node answers the call fails with 503.
#[utoipa::path(post, path = "/v1/tasks/{task}/{action}", tag = "tasks",
    params(("task" = String, Path, description = "Task name."),
        ("action" = TaskAction, Path, description = "`pause`, `resume` or `stop`.")),
    responses((status = 200, body = Gathered<TaskResult>), (status = 404, body = ErrorBody),
        (status = 503, description = "No node answered.", body = ErrorBody)),
    security(("api_key" = [])))]
pub async fn act(
    axum::extract::State(c): S,
    headers: axum::http::HeaderMap,
    Path((task, raw)): Path<(String, String)>,
) -> Result<Json<Gathered<TaskResult>>, Error> {
    let action = action(&raw)?;
    let name = task.as_str();
    // Only the task's sandboxes in projects where the key holds task.manage.
    let scope = super::access::scope_of(&headers);
    let scope = scope.as_deref();
    let parts = fanout::ask(c.nodes.all(), |n| async move {
        n.api().task_action(name, action, scope).await
    })
    .await
    .under(Policy::Partial, &format!("task {name} {raw}"))?;
    let mut total = TaskResult {
        task: task.clone(),
        action,
        succeeded: 0,
        failed: Vec::new(),
        memory_freed: None,
        creates_in_flight: 0,
    };
    for part in parts.answer {
        total.succeeded += part.succeeded;
        total.creates_in_flight += part.creates_in_flight;
        total.failed.extend(part.failed);
        if let Some(f) = part.memory_freed {
            total.memory_freed = Some(total.memory_freed.unwrap_or(0) + f);
        }
    }
    Ok(Json(Gathered {
        answer: total,
        unreachable: parts.unreachable,
    }))
}

/// Replace the network policy of every sandbox of a task, on every node at once (one request
/// per node; each node changes all of its sandboxes of the task in one firewall transaction).
/// Typical use: a setup phase that allows package indexes, then an agent phase with no
/// internet. Sandboxes created with network mode `none` take a `none` policy as they are and
/// are listed as failed for any other (they have no interface to filter). A node that does not answer is named in `unreachable`, and when no
/// node answers the call fails with 503.
#[utoipa::path(put, path = "/v1/tasks/{task}/network", tag = "network",
    params(("task" = String, Path, description = "Task name.")),
    request_body = NetworkPolicy,
    responses((status = 200, body = Gathered<TaskNetworkResult>), (status = 400, body = ErrorBody),
        (status = 503, description = "No node answered.", body = ErrorBody)),
    security(("api_key" = [])))]
pub async fn set_network(
    axum::extract::State(c): S,
    axum::Extension(who): axum::Extension<std::sync::Arc<crate::iam::Principal>>,
    from: super::iam::Source,
    headers: axum::http::HeaderMap,
    Path(task): Path<String>,
    Json(policy): Json<NetworkPolicy>,
) -> Result<Json<Gathered<TaskNetworkResult>>, Error> {
    let scope = super::access::scope_of(&headers);
    let scope = scope.as_deref();
    policy
        .parse()
        .map_err(|e| Error(ApiError::invalid(format!("network: {e}"))))?;
    let name = task.as_str();
    let p = &policy;
    let parts = fanout::ask(c.nodes.all(), |n| async move {
        n.api().task_network(name, p, scope).await
    })
    .await
    .under(Policy::Partial, &format!("task {name} network"))?;
    let mut total = TaskNetworkResult {
        task: task.clone(),
        succeeded: 0,
        failed: Vec::new(),
    };
    for part in parts.answer {
        total.succeeded += part.succeeded;
        total.failed.extend(part.failed);
    }
    super::iam::audited(
        &c,
        &who,
        &from,
        "network.set",
        &format!("task {task}"),
        None,
        Some(&format!(
            "{} sandboxes took it, {} did not: {}",
            total.succeeded,
            total.failed.len(),
            super::iam::policy_detail(&policy)
        )),
    )
    .await;
    Ok(Json(Gathered {
        answer: total,
        unreachable: parts.unreachable,
    }))
}

/// Every task with sandboxes, and how many are running and paused.
///
/// A node that does not answer is named in `unreachable` (its sandboxes are not counted), and
/// when no node answers the call fails with 503.
#[utoipa::path(get, path = "/v1/tasks", tag = "tasks",
    responses((status = 200, body = Gathered<TaskList>),
        (status = 503, description = "No node answered.", body = ErrorBody)),
    security(("api_key" = [])))]
pub async fn list(
    axum::extract::State(c): S,
    headers: axum::http::HeaderMap,
) -> Result<Json<Gathered<TaskList>>, Error> {
    let scope = super::access::scope_of(&headers);
    let scope = scope.as_deref();
    let parts = fanout::ask(c.nodes.all(), |n| async move { n.api().tasks(scope).await })
        .await
        .under(Policy::Partial, "counting tasks")?;
    let mut by: std::collections::BTreeMap<String, TaskInfo> = Default::default();
    for t in parts.answer.into_iter().flat_map(|p| p.tasks) {
        let e = by.entry(t.name.clone()).or_insert(TaskInfo {
            name: t.name.clone(),
            sandboxes: 0,
            running: 0,
            paused: 0,
        });
        e.sandboxes += t.sandboxes;
        e.running += t.running;
        e.paused += t.paused;
    }
    Ok(Json(Gathered {
        answer: TaskList {
            tasks: by.into_values().collect(),
        },
        unreachable: parts.unreachable,
    }))
}
