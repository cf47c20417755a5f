//! Task-level operations: pause, resume or stop every sandbox of a task, on every node at
//! once (one request per node, not per sandbox).

use warren_http::{Error, Json, Path};
use warren_types::api::{TaskAction, TaskInfo, TaskList, TaskResult};
use warren_types::error::{ApiError, ErrorBody, ErrorCode};

use super::S;
use super::forward::unavailable;

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
/// stop kills them. The answer counts the sandboxes it succeeded on and lists the ones it
/// failed on with why; a node that does not answer shows up in `failed` as one entry per
/// sandbox it is known to hold... or, when it cannot be asked at all, as a 503.
#[utoipa::path(post, path = "/v1/tasks/{task}/{action}", tag = "tasks",
    params(("task" = String, Path, description = "Task name."),
        ("action" = TaskAction, Path, description = "`pause`, `resume` or `stop`.")),
    responses((status = 200, body = TaskResult), (status = 404, body = ErrorBody), (status = 503, body = ErrorBody)),
    security(("api_key" = [])))]
pub async fn act(
    axum::extract::State(c): S,
    Path((task, raw)): Path<(String, String)>,
) -> Result<Json<TaskResult>, Error> {
    let action = action(&raw)?;
    let path = format!("/v1/tasks/{}/{}", encode(&task), action.as_str());
    let asks = c.nodes.all().into_iter().map(|n| {
        let path = path.clone();
        async move {
            let r = n.client.request(reqwest::Method::POST, &path).send().await;
            match r {
                Ok(resp) if resp.status().is_success() => resp
                    .json::<TaskResult>()
                    .await
                    .map_err(|e| unavailable(&n, &e)),
                Ok(resp) => Err(unavailable(&n, &format!("status {}", resp.status()))),
                Err(e) => Err(unavailable(&n, &e)),
            }
        }
    });
    let mut total = TaskResult {
        task,
        action,
        succeeded: 0,
        failed: Vec::new(),
    };
    let mut unreachable = None;
    for r in futures_util::future::join_all(asks).await {
        match r {
            Ok(part) => {
                total.succeeded += part.succeeded;
                total.failed.extend(part.failed);
            }
            Err(e) => unreachable = Some(e),
        }
    }
    match unreachable {
        // Nothing was done anywhere and a node could not be asked: say so rather than "0 done".
        Some(e) if total.succeeded == 0 && total.failed.is_empty() => Err(e),
        Some(e) => {
            tracing::warn!("task {} {}: {}", total.task, raw, e.0.message);
            Ok(Json(total))
        }
        None => Ok(Json(total)),
    }
}

/// Every task with sandboxes, and how many are running and paused.
#[utoipa::path(get, path = "/v1/tasks", tag = "tasks",
    responses((status = 200, body = TaskList)),
    security(("api_key" = [])))]
pub async fn list(axum::extract::State(c): S) -> Result<Json<TaskList>, Error> {
    let asks = c.nodes.all().into_iter().map(|n| async move {
        match n
            .client
            .request(reqwest::Method::GET, "/v1/tasks")
            .send()
            .await
        {
            Ok(resp) if resp.status().is_success() => resp.json::<TaskList>().await.ok(),
            _ => None,
        }
    });
    let mut by: std::collections::BTreeMap<String, TaskInfo> = Default::default();
    for part in futures_util::future::join_all(asks)
        .await
        .into_iter()
        .flatten()
    {
        for t in part.tasks {
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
    }
    Ok(Json(TaskList {
        tasks: by.into_values().collect(),
    }))
}

/// Percent-encodes a path segment.
pub(crate) fn encode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}
