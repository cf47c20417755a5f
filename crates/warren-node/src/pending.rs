//! Creates in flight, by task: what a task operation asked of those that have not landed yet.
//!
//! A task's pause, resume or stop acts on the sandboxes the node has, and a create of the task
//! still in flight (waiting for a start slot, starting, greeting its guest) is not one of them
//! yet. So a create of a task holds a [`Ticket`] here until it lands, and a task operation
//! marks the tickets of its task first, then acts on the sandboxes. A create lands by putting
//! its sandbox in the node's set and then taking its ticket's mark: one that lands after a pause
//! was marked pauses itself before it answers, after a stop it is killed, and a resume clears
//! a pause's mark. Whichever comes first, the operation finds the sandbox or the create finds
//! the mark (the mark is taken and set under one lock, and each side looks at the other's only
//! after its own step). Only creates in flight are held: a ticket goes when its create lands
//! or fails.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use warren_types::api::TaskAction;

/// What a create finds on its ticket when it lands.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Mark {
    /// Nothing: it runs.
    #[default]
    Run,
    /// Its task was paused meanwhile: it lands paused.
    Pause,
    /// Its task was stopped meanwhile: it is killed (or not started).
    Stop,
}

/// The creates of tasks in flight on this node.
#[derive(Debug, Default)]
pub struct Pending {
    inner: Mutex<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    next: u64,
    creates: HashMap<u64, Entry>,
}

#[derive(Debug)]
struct Entry {
    task: String,
    project: String,
    mark: Mark,
    stopped: Arc<tokio::sync::Notify>,
}

/// A create's place in [`Pending`] until it lands (or fails: dropped, it leaves).
#[derive(Debug)]
pub struct Ticket {
    pending: Arc<Pending>,
    id: u64,
    stopped: Arc<tokio::sync::Notify>,
}

impl Pending {
    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Holds a create of `task` in `project` in flight.
    pub fn register(self: &Arc<Self>, task: &str, project: &str) -> Ticket {
        let stopped = Arc::new(tokio::sync::Notify::new());
        let mut inner = self.lock();
        inner.next += 1;
        let id = inner.next;
        inner.creates.insert(
            id,
            Entry {
                task: task.to_string(),
                project: project.to_string(),
                mark: Mark::Run,
                stopped: stopped.clone(),
            },
        );
        Ticket {
            pending: self.clone(),
            id,
            stopped,
        }
    }

    /// Marks the creates of `task` in flight whose project is in `scope` (the control plane's
    /// comma-separated subtrees; none: all) with what `action` asks of them; returns how many.
    /// A stop's mark stays whatever comes after it.
    pub fn mark(&self, task: &str, scope: Option<&str>, action: TaskAction) -> u32 {
        let mut inner = self.lock();
        let mut n = 0;
        for e in inner.creates.values_mut() {
            if e.task != task
                || !scope.is_none_or(|s| warren_types::project::in_scope_list(s, &e.project))
            {
                continue;
            }
            n += 1;
            e.mark = match (e.mark, action) {
                (Mark::Stop, _) | (_, TaskAction::Stop) => Mark::Stop,
                (_, TaskAction::Pause) => Mark::Pause,
                (_, TaskAction::Resume) => Mark::Run,
            };
            if e.mark == Mark::Stop {
                e.stopped.notify_one();
            }
        }
        n
    }

    /// Creates in flight now.
    pub fn len(&self) -> usize {
        self.lock().creates.len()
    }

    /// Whether no create is in flight.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl Ticket {
    /// Its mark now (it stays in flight).
    pub fn mark(&self) -> Mark {
        self.pending
            .lock()
            .creates
            .get(&self.id)
            .map_or(Mark::Run, |e| e.mark)
    }

    /// Resolves once a stop has marked it.
    pub async fn stopped(&self) {
        self.stopped.notified().await
    }

    /// Lands the create: it leaves the creates in flight, and its mark is what it must do.
    /// Call it only once its sandbox is in the node's set.
    pub fn land(self) -> Mark {
        self.pending
            .lock()
            .creates
            .remove(&self.id)
            .map_or(Mark::Run, |e| e.mark)
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        self.pending.lock().creates.remove(&self.id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn marks_follow_the_task_operations_in_scope_and_a_stop_sticks() {
        let p = Arc::new(Pending::default());
        let a = p.register("t", "/team/a");
        let b = p.register("t", "/team/b");
        let other = p.register("u", "/team/a");
        assert_eq!(p.mark("t", Some("/team/a"), TaskAction::Pause), 1);
        assert_eq!(
            (a.mark(), b.mark(), other.mark()),
            (Mark::Pause, Mark::Run, Mark::Run)
        );
        assert_eq!(p.mark("t", None, TaskAction::Resume), 2);
        assert_eq!(a.mark(), Mark::Run);
        p.mark("t", None, TaskAction::Stop);
        p.mark("t", None, TaskAction::Resume);
        p.mark("t", None, TaskAction::Pause);
        assert_eq!((a.mark(), b.mark()), (Mark::Stop, Mark::Stop));
        assert_eq!(other.land(), Mark::Run);
        assert_eq!(a.land(), Mark::Stop);
        assert_eq!(p.len(), 1);
        drop(b);
        assert!(p.is_empty(), "only creates in flight are held");
    }

    #[tokio::test]
    async fn a_stop_wakes_a_create_waiting_for_it_even_marked_before_the_wait() {
        let p = Arc::new(Pending::default());
        let t = p.register("t", "/");
        p.mark("t", None, TaskAction::Stop);
        tokio::time::timeout(std::time::Duration::from_secs(5), t.stopped())
            .await
            .expect("the stop's wake-up was kept");
    }
}
