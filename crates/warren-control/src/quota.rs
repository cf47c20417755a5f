//! Project quotas: most sandboxes, CPU and memory requested, over a project and everything
//! below it, checked on every create against the project and each of its ancestors.
//!
//! What a subtree holds comes from the live view of the nodes (each node's sandboxes by
//! project, followed by the collector), never from a counter that could drift; to it are added
//! this replica's creates in flight and those made that the view does not show yet. Replicas
//! see each other's creates through the view, so several replicas creating at once may pass a
//! limit by what they create within one poll interval.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use warren_types::error::ApiError;
use warren_types::id::SandboxId;
use warren_types::project::within;

use crate::iam::store::Quota;
use crate::nodes::{Nodes, Totals};

/// How often the sums by subtree are remade from the nodes' views, at most.
const REBUILD: Duration = Duration::from_millis(250);
/// How long a create made here is counted on top of the view (by then the view has it).
const DONE_KEPT: Duration = Duration::from_secs(60);

#[derive(Debug)]
struct Pending {
    project: String,
    ask: Totals,
    /// The sandbox made, once made, and when.
    done: Option<(SandboxId, Instant)>,
}

/// The usage of every subtree, and this replica's creates on top.
#[derive(Debug, Default)]
pub struct Usage {
    /// Sums by subtree (each sandbox counted at its project and every ancestor), and when
    /// they were made.
    subtree: RwLock<(Option<Instant>, HashMap<String, Totals>)>,
    pending: Mutex<(u64, HashMap<u64, Pending>)>,
}

/// A create counted against quotas until dropped (failed) or [`Reserved::made`].
pub struct Reserved {
    usage: Arc<Usage>,
    id: u64,
    made: bool,
}

impl Reserved {
    /// The create made sandbox `id`: it stays counted until the view shows it.
    pub fn made(mut self, id: SandboxId) {
        let mut p = self.usage.pending.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(e) = p.1.get_mut(&self.id) {
            e.done = Some((id, Instant::now()));
        }
        self.made = true;
    }
}

impl Drop for Reserved {
    fn drop(&mut self) {
        if !self.made {
            self.usage
                .pending
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .1
                .remove(&self.id);
        }
    }
}

impl Usage {
    fn rebuild(&self, nodes: &Nodes) {
        let fresh = self
            .subtree
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .0
            .is_some_and(|at| at.elapsed() < REBUILD);
        if fresh {
            return;
        }
        let mut sums: HashMap<String, Totals> = HashMap::new();
        for n in nodes.snapshot().iter() {
            for (project, t) in n.project_totals() {
                // The project and each ancestor.
                let mut p = project.as_str();
                loop {
                    sums.entry(p.to_string()).or_default().add(t);
                    match p.rsplit_once('/') {
                        Some((parent, _)) => p = parent,
                        None => break,
                    }
                }
            }
        }
        *self.subtree.write().unwrap_or_else(|p| p.into_inner()) = (Some(Instant::now()), sums);
    }

    /// Counts a create of `ask` in `project` against `quotas` (every project's with limits),
    /// or says which limit it would pass.
    pub fn reserve(
        self: &Arc<Self>,
        nodes: &Nodes,
        quotas: &HashMap<String, Quota>,
        project: &str,
        ask: Totals,
    ) -> Result<Reserved, ApiError> {
        self.rebuild(nodes);
        let sums = self.subtree.read().unwrap_or_else(|p| p.into_inner());
        let mut pending = self.pending.lock().unwrap_or_else(|p| p.into_inner());
        // Creates made here that the view now reflects (its node's changes were asked for
        // since), or long ago, no longer count on top.
        pending.1.retain(|_, e| match &e.done {
            None => true,
            Some((id, at)) => {
                at.elapsed() < DONE_KEPT
                    && !nodes.get(&id.node()).is_some_and(|n| n.view_since(*at))
            }
        });
        for (path, q) in quotas {
            if !within(project, path) {
                continue;
            }
            let mut used = sums.1.get(path).copied().unwrap_or_default();
            for e in pending.1.values() {
                if within(&e.project, path) {
                    used.add(e.ask);
                }
            }
            let over = |what: &str, used: u64, ask: u64, limit: Option<i64>| match limit {
                Some(l) if used.saturating_add(ask) > l.max(0) as u64 => Some(ApiError::capacity(
                    format!(
                        "project {path}'s quota: {what} at most {l}, and it holds {used} (this \
                         sandbox asks {ask}); kill some of its sandboxes, or ask whoever \
                         manages {path} to raise max_{what} (warren project quota)"
                    ),
                    5,
                )),
                _ => None,
            };
            if let Some(e) = over("sandboxes", used.sandboxes, ask.sandboxes, q.max_sandboxes)
                .or_else(|| over("cpu", used.cpu, ask.cpu, q.max_cpu))
                .or_else(|| over("memory", used.memory, ask.memory, q.max_memory))
            {
                return Err(e);
            }
        }
        pending.0 += 1;
        let id = pending.0;
        pending.1.insert(
            id,
            Pending {
                project: project.to_string(),
                ask,
                done: None,
            },
        );
        Ok(Reserved {
            usage: self.clone(),
            id,
            made: false,
        })
    }
}
