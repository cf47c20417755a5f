//! Task-level operations: pause, resume or stop every sandbox of a training task at once.
//!
//! A pause or resume is a batch: every sandbox's freezer is written first, then each is waited
//! for, so the kernel freezes them all in parallel instead of one after another. Nothing in it
//! waits for the node's creates, execs or file transfers, and what costs time in proportion to
//! the sandboxes is bounded before the answer: the guests' last incident records are fetched
//! all at once within one deadline, and a pause's memory reclaim goes on in the background past
//! [`crate::lifecycle::RECLAIM_WAIT`]. A stop answers once its sandboxes are killed, their
//! teardowns going on in the background. The task's creates in flight are marked to land as
//! the task is (the `pending` module).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Instant;

use warren_types::api::{SandboxState, TaskAction, TaskFailure, TaskInfo, TaskResult};
use warren_types::id::SandboxId;

use crate::backend::{FREEZE_TIMEOUT, Instance, freeze_batch};
use crate::error::NodeError;
use crate::lifecycle::{FREEZE_WAIT, freeze_what, settled};
use crate::node::{Node, Phase, Sandbox, blocking};
use crate::phase::{Action, Verdict, after, verdict};

impl Node {
    /// The node's sandboxes of `task` in `scope`.
    fn of_task(&self, task: &str, scope: Option<&str>) -> Vec<Arc<Sandbox>> {
        self.sandboxes
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .values()
            .filter(|s| {
                s.record.task.as_deref() == Some(task)
                    && s.phase() != Phase::Stopping
                    && s.in_scope(scope)
            })
            .cloned()
            .collect()
    }

    /// Applies `action` to every sandbox of `task` on this node whose project is in `scope`
    /// (see [`Sandbox::in_scope`]), and to the task's creates in flight (see the `pending`
    /// module): those are marked first, then the sandboxes are looked up, so a create lands
    /// either where the operation finds it or where it finds the mark.
    pub async fn task_action(
        &self,
        task: &str,
        action: TaskAction,
        scope: Option<&str>,
    ) -> TaskResult {
        let began = Instant::now();
        let creates_in_flight = self.pending.mark(task, scope, action);
        let sandboxes = self.of_task(task, scope);
        let mut freed = None;
        let failed = match action {
            TaskAction::Stop => {
                self.stop_all(&sandboxes).await;
                Vec::new()
            }
            TaskAction::Pause => {
                let (failed, f) = self.freeze_all(&sandboxes, true, began).await;
                freed = Some(f);
                failed
            }
            TaskAction::Resume => self.freeze_all(&sandboxes, false, began).await.0,
        };
        let failed: Vec<TaskFailure> = failed
            .into_iter()
            .map(|(id, e)| TaskFailure {
                id,
                error: e.to_api(),
            })
            .collect();
        tracing::debug!(
            task,
            ?action,
            sandboxes = sandboxes.len(),
            creates_in_flight,
            ms = began.elapsed().as_millis() as u64,
            "task operation done"
        );
        TaskResult {
            task: task.to_string(),
            action,
            succeeded: (sandboxes.len() - failed.len()) as u32,
            failed,
            memory_freed: freed,
            creates_in_flight,
        }
    }

    /// Freezes (or thaws) sandboxes as one batch. Returns the ones that failed, and the memory
    /// a pause reclaimed before [`crate::lifecycle::RECLAIM_WAIT`] after `began` (the rest is
    /// reclaimed in the background; see [`crate::lifecycle::reclaim_paused`]).
    async fn freeze_all(
        &self,
        sandboxes: &[Arc<Sandbox>],
        frozen: bool,
        began: Instant,
    ) -> (Vec<(SandboxId, NodeError)>, u64) {
        // In one order (by id), so two batches over the same sandboxes cannot deadlock.
        let mut ordered: Vec<&Arc<Sandbox>> = sandboxes.iter().collect();
        ordered.sort_by(|a, b| a.record.id.cmp(&b.record.id));
        let mut guards = Vec::with_capacity(ordered.len());
        for sb in ordered {
            guards.push(sb.lifecycle.lock().await);
        }
        let locked = began.elapsed();
        let action = if frozen {
            Action::Pause
        } else {
            Action::Resume
        };
        // Those already so are done; those being torn down are not counted (they are gone).
        let todo: Vec<Arc<Sandbox>> = sandboxes
            .iter()
            .filter(|s| verdict(s.phase(), action) == Verdict::Proceed)
            .cloned()
            .collect();
        if frozen {
            // A frozen guest answers nothing: what each recorded is fetched first, all at
            // once and within one deadline.
            self.last_incidents_of(&todo).await;
        }
        let fetched = began.elapsed();
        let mut batch = todo.clone();
        let mut unrestored = Vec::new();
        if !frozen {
            // A sandbox whose memory limit cannot be written back stays frozen.
            let (b, failed) = blocking(move || {
                let failed = crate::lifecycle::restore_limits(&batch);
                batch.retain(|s| !failed.iter().any(|(id, _)| *id == s.record.id));
                Ok((batch, failed))
            })
            .await
            .unwrap_or_else(|e| {
                let all = todo
                    .iter()
                    .map(|s| (s.record.id.clone(), std::io::Error::other(e.to_string())))
                    .collect();
                (Vec::new(), all)
            });
            batch = b;
            unrestored = failed;
        }
        let todo: Vec<Arc<Sandbox>> = batch.clone();
        // A pause waits for the processes to stop until FREEZE_WAIT after it began, a thaw as
        // long as it takes (see `lifecycle::settled`).
        let until = if frozen {
            began + FREEZE_WAIT
        } else {
            Instant::now() + FREEZE_TIMEOUT
        };
        let results = blocking(move || {
            let refs: Vec<&dyn Instance> = batch.iter().map(|s| s.instance.as_ref()).collect();
            Ok(freeze_batch(&refs, frozen, until)
                .into_iter()
                .map(|r| r.and_then(|done| settled(done, frozen)))
                .collect())
        })
        .await;
        let ids: Vec<SandboxId> = todo.iter().map(|s| s.record.id.clone()).collect();
        let (done, mut failed) = batch_outcome(&ids, results, freeze_what(frozen));
        failed.extend(unrestored.into_iter().map(|(id, e)| {
            (
                id,
                NodeError::host("writing the memory limit back before the thaw", e),
            )
        }));
        let done: Vec<Arc<Sandbox>> = todo
            .into_iter()
            .filter(|s| done.contains(&s.record.id))
            .collect();
        for sb in &done {
            if let Some(p) = after(action) {
                sb.set_phase(p);
            }
        }
        drop(guards);
        let froze = began.elapsed();
        let mut freed = 0;
        if frozen && self.cfg.reclaim_on_pause {
            freed = crate::lifecycle::reclaim_paused(done, began + crate::lifecycle::RECLAIM_WAIT)
                .await;
        } else if !frozen {
            self.prefetch(done);
        }
        tracing::debug!(
            sandboxes = sandboxes.len(),
            frozen,
            locked_ms = locked.as_millis() as u64,
            incidents_ms = (fetched - locked).as_millis() as u64,
            freeze_ms = (froze - fetched).as_millis() as u64,
            reclaim_ms = (began.elapsed() - froze).as_millis() as u64,
            freed,
            "freezer batch"
        );
        (failed, freed)
    }

    /// Tasks with sandboxes on this node.
    pub fn tasks(&self, scope: Option<&str>) -> Vec<TaskInfo> {
        let mut by: BTreeMap<String, TaskInfo> = BTreeMap::new();
        let f = crate::node::ListFilter {
            scope: scope.map(str::to_string),
            ..Default::default()
        };
        for v in self.list(&f) {
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
                // A node's own sandboxes are never unknown to it.
                SandboxState::Unknown => {}
            }
        }
        by.into_values().collect()
    }
}

/// Splits a batch's results into the sandboxes done and those failed, with why. A batch whose
/// worker itself failed (or answered for fewer sandboxes than it was given) failed for every
/// sandbox it did not answer for: none is counted done unless its own result says so.
fn batch_outcome(
    ids: &[SandboxId],
    results: std::io::Result<Vec<std::io::Result<()>>>,
    what: &'static str,
) -> (Vec<SandboxId>, Vec<(SandboxId, NodeError)>) {
    let (results, worker) = match results {
        Ok(r) => (r, None),
        Err(e) => (Vec::new(), Some(e.to_string())),
    };
    let mut results = results.into_iter();
    let mut done = Vec::new();
    let mut failed = Vec::new();
    for id in ids {
        match results.next() {
            Some(Ok(())) => done.push(id.clone()),
            Some(Err(e)) => failed.push((id.clone(), NodeError::host(what, e))),
            None => {
                let why = worker
                    .clone()
                    .unwrap_or_else(|| "the batch gave no result for it".into());
                failed.push((
                    id.clone(),
                    NodeError::host(what, std::io::Error::other(why)),
                ));
            }
        }
    }
    (done, failed)
}

#[cfg(test)]
mod tests {
    use super::*;
    use warren_types::id::NodeId;

    fn ids(n: usize) -> Vec<SandboxId> {
        let node = NodeId::from_random(rand::random());
        (0..n)
            .map(|_| SandboxId::new(&node, rand::random()))
            .collect()
    }

    #[test]
    fn a_failed_worker_fails_every_sandbox_of_the_batch() {
        let ids = ids(3);
        let (done, failed) = batch_outcome(
            &ids,
            Err(std::io::Error::other("blocking task failed: panicked")),
            "freezing the sandbox",
        );
        assert!(done.is_empty());
        assert_eq!(failed.len(), 3);
        for ((id, e), want) in failed.iter().zip(&ids) {
            assert_eq!(id, want);
            let api = e.to_api();
            assert!(api.message.contains("panicked"), "{}", api.message);
            assert!(api.message.contains("freezing"), "{}", api.message);
        }
    }

    #[test]
    fn each_result_counts_for_its_own_sandbox() {
        let ids = ids(3);
        let (done, failed) = batch_outcome(
            &ids,
            Ok(vec![Ok(()), Err(std::io::Error::other("EBUSY"))]),
            "thawing the sandbox",
        );
        assert_eq!(done, vec![ids[0].clone()]);
        let failed: Vec<_> = failed.into_iter().map(|(id, _)| id).collect();
        assert_eq!(
            failed,
            vec![ids[1].clone(), ids[2].clone()],
            "short answers fail the rest"
        );
    }
}
