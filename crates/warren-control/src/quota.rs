//! Project quotas: most sandboxes, CPU and memory requested, over a project and everything
//! below it, checked on every create against the project and each of its ancestors.
//!
//! What a subtree holds comes from the live view of the nodes (each node's sandboxes by
//! project, followed by the collector), never from a counter that could drift; to it are added
//! this replica's creates in flight and those made that the view does not show yet. Replicas
//! see each other's creates through the view, so several replicas creating at once may pass a
//! limit by what they create within one poll interval.
//!
//! Function calls in flight are counted here, by each replica for the calls it dispatches
//! (a call lasts milliseconds: no view of the nodes follows them). Behind `R` replicas a
//! project may have up to `R` times its `max_fncalls` in flight.

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
    /// Function calls in flight through this replica, by subtree (each counted at its
    /// project and every ancestor): how many, and the memory they hold.
    calls: Mutex<HashMap<String, Calls>>,
    /// Woken when calls end (for calls waiting for room under a quota).
    calls_ended: tokio::sync::Notify,
}

/// Function calls in flight in a subtree.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
struct Calls {
    n: u64,
    memory: u64,
}

/// Function calls counted in flight until dropped.
pub struct CallSlots {
    usage: Arc<Usage>,
    project: String,
    /// How many.
    pub n: u64,
    /// The memory of each.
    memory: u64,
}

impl Drop for CallSlots {
    fn drop(&mut self) {
        let mut calls = self.usage.calls.lock().unwrap_or_else(|p| p.into_inner());
        for path in ancestry(&self.project) {
            if let Some(c) = calls.get_mut(path) {
                c.n = c.n.saturating_sub(self.n);
                c.memory = c.memory.saturating_sub(self.n * self.memory);
                if c.n == 0 {
                    calls.remove(path);
                }
            }
        }
        drop(calls);
        self.usage.calls_ended.notify_waiters();
    }
}

/// `project` and each of its ancestors.
fn ancestry(project: &str) -> impl Iterator<Item = &str> {
    std::iter::successors(Some(project), |p| {
        p.rsplit_once('/').map(|(parent, _)| parent)
    })
}

/// What subtree `path` holds: its sandboxes' requests in the nodes' view, this replica's
/// creates counted on top, and the memory of its function calls running through this replica.
fn held(
    sums: &HashMap<String, Totals>,
    pending: &HashMap<u64, Pending>,
    calls: &HashMap<String, Calls>,
    path: &str,
) -> Totals {
    let mut used = sums.get(path).copied().unwrap_or_default();
    for e in pending.values() {
        if within(&e.project, path) {
            used.add(e.ask);
        }
    }
    used.memory += calls.get(path).map_or(0, |c| c.memory);
    used
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
                for p in ancestry(&project) {
                    sums.entry(p.to_string()).or_default().add(t);
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
        self.refresh(nodes);
        let sums = self.subtree.read().unwrap_or_else(|p| p.into_inner());
        let mut pending = self.pending.lock().unwrap_or_else(|p| p.into_inner());
        let calls = self.calls.lock().unwrap_or_else(|p| p.into_inner());
        for (path, q) in quotas {
            if !within(project, path) {
                continue;
            }
            let used = held(&sums.1, &pending.1, &calls, path);
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

impl Usage {
    /// Remakes the sums by subtree if they are older than a quarter second, and stops
    /// counting on top the creates made here that the view now reflects (before
    /// [`Usage::reserve`] and [`Usage::take_calls`], which read both).
    pub fn refresh(&self, nodes: &Nodes) {
        self.rebuild(nodes);
        // Creates made here that the view now reflects (its node's changes were asked for
        // since), or long ago, no longer count on top.
        self.pending
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .1
            .retain(|_, e| match &e.done {
                None => true,
                Some((id, at)) => {
                    at.elapsed() < DONE_KEPT
                        && !nodes.get(&id.node()).is_some_and(|n| n.view_since(*at))
                }
            });
    }

    /// Counts up to `want` function calls (at least one) of `memory` each, of `project`, in
    /// flight, as many as the `max_fncalls` and `max_memory` of the project and of each
    /// ancestor leave room for (a call's memory counts against `max_memory` while it runs,
    /// with the sandboxes' requests); none: which limit is reached (a 429 with Retry-After).
    /// More than one (a batch's) takes at most half the room left at each level, rounded up,
    /// so single calls still find some.
    pub fn take_calls(
        self: &Arc<Self>,
        quotas: &HashMap<String, Quota>,
        project: &str,
        want: u64,
        memory: u64,
    ) -> Result<CallSlots, ApiError> {
        let sums = self.subtree.read().unwrap_or_else(|p| p.into_inner());
        let pending = self.pending.lock().unwrap_or_else(|p| p.into_inner());
        let mut calls = self.calls.lock().unwrap_or_else(|p| p.into_inner());
        let mut n = want.max(1);
        let share = |room: u64| if want > 1 { room.div_ceil(2) } else { room };
        for path in ancestry(project) {
            let Some(q) = quotas.get(path) else {
                continue;
            };
            let now = calls.get(path).copied().unwrap_or_default();
            if let Some(limit) = q.max_fncalls {
                let limit = limit.max(0) as u64;
                let room = limit.saturating_sub(now.n);
                if room == 0 {
                    return Err(ApiError::capacity(
                        format!(
                            "project {path}'s quota: at most {limit} function calls in flight, \
                             and it has {}; retry after Retry-After seconds, or ask whoever \
                             manages {path} to raise max_fncalls (warren project quota)",
                            now.n
                        ),
                        1,
                    ));
                }
                n = n.min(share(room));
            }
            if let Some(limit) = q.max_memory {
                let limit = limit.max(0) as u64;
                let used = held(&sums.1, &pending.1, &calls, path).memory;
                let room = limit.saturating_sub(used) / memory.max(1);
                if room == 0 {
                    return Err(ApiError::capacity(
                        format!(
                            "project {path}'s quota: memory at most {limit}, and its sandboxes \
                             and running function calls hold {used} (this call asks {memory}); \
                             retry after Retry-After seconds, or ask whoever manages {path} to \
                             raise max_memory (warren project quota)"
                        ),
                        1,
                    ));
                }
                n = n.min(share(room));
            }
        }
        for path in ancestry(project) {
            let c = calls.entry(path.to_string()).or_default();
            c.n += n;
            c.memory += n * memory;
        }
        Ok(CallSlots {
            usage: self.clone(),
            project: project.to_string(),
            n,
            memory,
        })
    }

    /// [`Usage::take_calls`], waiting for calls to end while a quota has no room, until
    /// `deadline`; past it, the quota's message with code `timeout`. A quota that can never
    /// admit the call (`max_fncalls` 0, `max_memory` below one call's memory) is its 429 at
    /// once: no wait would help.
    pub async fn wait_calls(
        self: &Arc<Self>,
        quotas: &HashMap<String, Quota>,
        project: &str,
        want: u64,
        memory: u64,
        deadline: tokio::time::Instant,
    ) -> Result<CallSlots, ApiError> {
        let never = ancestry(project).any(|p| {
            quotas.get(p).is_some_and(|q| {
                q.max_fncalls.is_some_and(|l| l <= 0)
                    || q.max_memory.is_some_and(|l| (l.max(0) as u64) < memory)
            })
        });
        if never {
            return self.take_calls(quotas, project, want, memory);
        }
        loop {
            let ended = self.calls_ended.notified();
            tokio::pin!(ended);
            // Registered before the check, so an end between the two is not missed.
            ended.as_mut().enable();
            match self.take_calls(quotas, project, want, memory) {
                Ok(s) => return Ok(s),
                Err(e) => {
                    // Sandboxes that end free memory too, and say nothing here: look again
                    // now and then.
                    let next =
                        (tokio::time::Instant::now() + Duration::from_millis(250)).min(deadline);
                    if tokio::time::Instant::now() >= deadline {
                        return Err(ApiError {
                            code: warren_types::error::ErrorCode::Timeout,
                            ..e
                        });
                    }
                    let _ = tokio::time::timeout_at(next, ended).await;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits(l: &[(&str, i64)]) -> HashMap<String, Quota> {
        l.iter()
            .map(|&(p, n)| {
                let q = Quota {
                    max_fncalls: Some(n),
                    ..Default::default()
                };
                (p.to_string(), q)
            })
            .collect()
    }

    #[test]
    fn calls_in_flight_count_at_every_level_until_dropped() {
        let u = Arc::new(Usage::default());
        let q = limits(&[("root/rl", 3), ("root/rl/a", 2)]);
        // A batch: half the room of the tightest level, rounded up; then single calls.
        let a = u.take_calls(&q, "root/rl/a", 5, 1).unwrap();
        assert_eq!(a.n, 1);
        let a2 = u.take_calls(&q, "root/rl/a", 1, 1 << 20).unwrap();
        let e = u.take_calls(&q, "root/rl/a", 1, 1 << 20).err().unwrap();
        assert!(e.message.contains("root/rl/a's quota"), "{}", e.message);
        // The parent has one left, for a sibling.
        let b = u.take_calls(&q, "root/rl/b", 4, 1 << 20).unwrap();
        assert_eq!(b.n, 1);
        let e = u.take_calls(&q, "root/rl/b/c", 1, 1 << 20).err().unwrap();
        assert!(
            e.message.contains("project root/rl's quota"),
            "{}",
            e.message
        );
        // Outside the limited subtree: not held up, never fewer than one.
        assert_eq!(u.take_calls(&q, "root/other", 7, 1 << 20).unwrap().n, 7);
        assert_eq!(u.take_calls(&q, "root/other", 0, 1 << 20).unwrap().n, 1);
        drop((a, a2));
        assert_eq!(u.take_calls(&q, "root/rl/a", 1, 1 << 20).unwrap().n, 1);
        drop(b);
        // A batch alone under a limit of 64 takes 32 of them.
        let wide = limits(&[("root/w", 64)]);
        assert_eq!(u.take_calls(&wide, "root/w", 100, 1 << 20).unwrap().n, 32);
        assert!(u.calls.lock().unwrap().is_empty());
        // A limit of 0: no calls.
        let none = limits(&[("root/off", 0)]);
        assert!(u.take_calls(&none, "root/off", 1, 1 << 20).is_err());
    }

    #[tokio::test]
    async fn running_calls_hold_their_memory_against_max_memory_and_wait_for_room() {
        let u = Arc::new(Usage::default());
        let q: HashMap<String, Quota> = [(
            "root/rl".to_string(),
            Quota {
                max_memory: Some(3 << 30),
                ..Default::default()
            },
        )]
        .into();
        // Calls of 1 GiB: three fit; a batch takes half the room, rounded up (2).
        let a = u.take_calls(&q, "root/rl/a", 8, 1 << 30).unwrap();
        assert_eq!(a.n, 2);
        let b = u.take_calls(&q, "root/rl/b", 1, 1 << 30).unwrap();
        let e = u.take_calls(&q, "root/rl/b", 1, 1 << 30).err().unwrap();
        assert!(e.message.contains("max_memory"), "{}", e.message);
        // A create in the subtree is counted against the calls' memory too.
        let e = u
            .reserve(
                &Nodes::default(),
                &q,
                "root/rl/c",
                Totals {
                    sandboxes: 1,
                    cpu: 10,
                    memory: 64 << 20,
                },
            )
            .err()
            .unwrap();
        assert!(e.message.contains("memory"), "{}", e.message);
        // A call that waits for room gets it when one ends, and gives up at its deadline.
        let soon = tokio::time::Instant::now() + Duration::from_millis(50);
        let e = u
            .wait_calls(&q, "root/rl", 1, 1 << 30, soon)
            .await
            .err()
            .unwrap();
        assert_eq!(
            e.code,
            warren_types::error::ErrorCode::Timeout,
            "{}",
            e.message
        );
        // One larger than the quota itself is refused at once (a 429: no wait would help).
        let later = tokio::time::Instant::now() + Duration::from_secs(30);
        let t0 = std::time::Instant::now();
        let e = u
            .wait_calls(&q, "root/rl", 1, 4 << 30, later)
            .await
            .err()
            .unwrap();
        assert_eq!(
            e.code,
            warren_types::error::ErrorCode::Capacity,
            "{}",
            e.message
        );
        assert!(t0.elapsed() < Duration::from_secs(5));
        let waiter = {
            let (u, q) = (u.clone(), q.clone());
            tokio::spawn(async move {
                let later = tokio::time::Instant::now() + Duration::from_secs(30);
                u.wait_calls(&q, "root/rl", 1, 1 << 30, later)
                    .await
                    .map(|s| s.n)
            })
        };
        tokio::time::sleep(Duration::from_millis(20)).await;
        drop(b);
        assert_eq!(waiter.await.unwrap().unwrap(), 1);
        drop(a);
        assert!(u.calls.lock().unwrap().is_empty());
    }
}
