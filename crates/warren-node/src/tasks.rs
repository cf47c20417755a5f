//! Task-level operations: pause, resume or stop every sandbox of a training task at once.
//!
//! A pause or resume is a batch: every sandbox's freezer is written first, then each is waited
//! for, so the kernel freezes them all in parallel instead of one after another.

use std::collections::BTreeMap;
use std::sync::Arc;

use warren_types::api::{SandboxState, TaskAction, TaskFailure, TaskInfo, TaskResult};

use crate::error::NodeError;
use crate::node::{Node, Phase, Sandbox, blocking};

impl Node {
    /// The node's sandboxes of `task`.
    fn of_task(&self, task: &str) -> Vec<Arc<Sandbox>> {
        self.sandboxes
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .values()
            .filter(|s| s.record.task.as_deref() == Some(task) && s.phase() != Phase::Stopping)
            .cloned()
            .collect()
    }

    /// Applies `action` to every sandbox of `task` on this node.
    pub async fn task_action(&self, task: &str, action: TaskAction) -> TaskResult {
        let sandboxes = self.of_task(task);
        let failed = match action {
            TaskAction::Stop => {
                let kills = sandboxes.iter().map(|sb| async move {
                    self.kill(&sb.record.id)
                        .await
                        .err()
                        .map(|e| (sb.record.id.clone(), e))
                });
                futures_util::future::join_all(kills)
                    .await
                    .into_iter()
                    .flatten()
                    .collect()
            }
            TaskAction::Pause => self.freeze_all(&sandboxes, true).await,
            TaskAction::Resume => self.freeze_all(&sandboxes, false).await,
        };
        let failed: Vec<TaskFailure> = failed
            .into_iter()
            .map(|(id, e)| TaskFailure {
                id,
                error: e.to_api(),
            })
            .collect();
        TaskResult {
            task: task.to_string(),
            action,
            succeeded: (sandboxes.len() - failed.len()) as u32,
            failed,
        }
    }

    /// Freezes (or thaws) sandboxes as one batch. Returns the ones that failed.
    async fn freeze_all(
        &self,
        sandboxes: &[Arc<Sandbox>],
        frozen: bool,
    ) -> Vec<(warren_types::id::SandboxId, NodeError)> {
        let mut guards = Vec::with_capacity(sandboxes.len());
        for sb in sandboxes {
            guards.push(sb.lifecycle.lock().await);
        }
        let (from, to) = if frozen {
            (Phase::Running, Phase::Paused)
        } else {
            (Phase::Paused, Phase::Running)
        };
        let todo: Vec<Arc<Sandbox>> = sandboxes
            .iter()
            .filter(|s| s.phase() == from)
            .cloned()
            .collect();
        let cgroups: Vec<_> = todo.iter().map(|s| s.cgroup.clone()).collect();
        let results = blocking(move || {
            let started: Vec<_> = cgroups.iter().map(|c| c.start_freeze(frozen)).collect();
            Ok(cgroups
                .iter()
                .zip(started)
                .map(|(c, s)| s.and_then(|()| c.wait_frozen(frozen)))
                .collect::<Vec<_>>())
        })
        .await
        .unwrap_or_default();
        let mut failed = Vec::new();
        for (sb, r) in todo.iter().zip(results) {
            match r {
                Ok(()) => sb.set_phase(to),
                Err(e) => failed.push((
                    sb.record.id.clone(),
                    NodeError::host(
                        if frozen {
                            "freezing the sandbox"
                        } else {
                            "thawing the sandbox"
                        },
                        e,
                    ),
                )),
            }
        }
        drop(guards);
        failed
    }

    /// Tasks with sandboxes on this node.
    pub fn tasks(&self) -> Vec<TaskInfo> {
        let mut by: BTreeMap<String, TaskInfo> = BTreeMap::new();
        for v in self.list(&Default::default()) {
            let Some(task) = v.task else { continue };
            let t = by.entry(task.clone()).or_insert(TaskInfo {
                name: task,
                sandboxes: 0,
                running: 0,
                paused: 0,
            });
            t.sandboxes += 1;
            match v.state {
                SandboxState::Running => t.running += 1,
                SandboxState::Paused => t.paused += 1,
            }
        }
        by.into_values().collect()
    }
}
