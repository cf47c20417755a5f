//! A sandbox's lifecycle: pause, resume, kill, transparent resume, and the end of a sandbox
//! whose init exited. Each operation asks the phase table (`phase`) whether it may go ahead,
//! under the sandbox's lifecycle lock.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use warren_types::api::Sandbox as SandboxView;
use warren_types::id::SandboxId;

use crate::backend::{FREEZE_TIMEOUT, freeze_batch};
use crate::error::NodeError;
use crate::node::{Node, Sandbox, blocking};
use crate::phase::{Action, Phase, Verdict, after, verdict};

impl Node {
    /// Asks the table about `action` on `sb`: `Ok(true)` to go ahead, `Ok(false)` when it is
    /// already done.
    pub(crate) fn legal(&self, sb: &Sandbox, action: Action) -> Result<bool, NodeError> {
        match verdict(sb.phase(), action) {
            Verdict::Proceed | Verdict::ResumeFirst => Ok(true),
            Verdict::NoOp => Ok(false),
            Verdict::Gone => Err(NodeError::Gone(sb.record.id.clone())),
            Verdict::NotFound => Err(NodeError::NotFound(sb.record.id.clone())),
        }
    }

    /// Makes sure the sandbox runs: a paused one is resumed (transparent resume). Every
    /// operation that talks to the guest calls this first.
    pub async fn ensure_running(&self, sb: &Arc<Sandbox>) -> Result<(), NodeError> {
        match verdict(sb.phase(), Action::Use) {
            Verdict::ResumeFirst => self.resume(&sb.record.id).await.map(|_| ()),
            _ => self.legal(sb, Action::Use).map(|_| ()),
        }
    }

    /// Freezes every process of the sandbox. Pausing a paused sandbox is a no-op.
    pub async fn pause(&self, id: &SandboxId) -> Result<SandboxView, NodeError> {
        self.freeze(id, Action::Pause).await
    }

    /// Thaws a paused sandbox. Resuming a running sandbox is a no-op.
    pub async fn resume(&self, id: &SandboxId) -> Result<SandboxView, NodeError> {
        self.freeze(id, Action::Resume).await
    }

    async fn freeze(&self, id: &SandboxId, action: Action) -> Result<SandboxView, NodeError> {
        let began = Instant::now();
        let sb = self.get(id)?;
        let g = sb.lifecycle.lock().await;
        let paused = self.freeze_locked(&sb, action).await?;
        drop(g);
        if paused && self.cfg.reclaim_on_pause {
            let freed = reclaim_paused(vec![sb.clone()], began + RECLAIM_WAIT).await;
            tracing::debug!(sandbox_id = %id, freed, "memory reclaimed on pause");
        }
        Ok(sb.view(&self.id, &self.cfg.pool))
    }

    /// Pauses or resumes `sb`, whose lifecycle lock the caller holds. Returns whether it
    /// paused it (its memory is then the caller's to reclaim, once the lock is let go: see
    /// [`reclaim_paused`]).
    pub(crate) async fn freeze_locked(
        &self,
        sb: &Arc<Sandbox>,
        action: Action,
    ) -> Result<bool, NodeError> {
        if !self.legal(sb, action)? {
            return Ok(false);
        }
        let frozen = action == Action::Pause;
        if frozen {
            // A frozen guest answers nothing: what it recorded is fetched first.
            self.last_incidents(sb).await;
        }
        let s = sb.clone();
        blocking(move || {
            if !frozen && let Some((_, e)) = restore_limits(std::slice::from_ref(&s)).pop() {
                return Err(std::io::Error::new(
                    e.kind(),
                    format!("writing its memory limit back before the thaw: {e}"),
                ));
            }
            let until = Instant::now() + if frozen { FREEZE_WAIT } else { FREEZE_TIMEOUT };
            let done = freeze_batch(&[s.instance.as_ref()], frozen, until)
                .pop()
                .unwrap_or(Ok(false))?;
            settled(done, frozen)
        })
        .await
        .map_err(|e| NodeError::host(freeze_what(frozen), e))?;
        if let Some(p) = after(action) {
            sb.set_phase(p);
        }
        if !frozen {
            self.prefetch(vec![sb.clone()]);
        }
        tracing::debug!(sandbox_id = %sb.record.id, ?action, "done");
        Ok(frozen)
    }

    /// Kills the sandbox and releases everything it held.
    pub async fn kill(&self, id: &SandboxId) -> Result<(), NodeError> {
        let sb = self.get(id)?;
        let _g = sb.lifecycle.lock().await;
        self.legal(&sb, Action::Kill)?;
        sb.set_phase(Phase::Stopping);
        self.destroy(sb.clone()).await;
        tracing::info!(sandbox_id = %id, "killed");
        Ok(())
    }

    /// Kills sandboxes for their task's stop: as [`Node::kill`] for each, but answered once
    /// all are killed (one blocking batch of SIGKILLs), out of the node's set, with their
    /// reservations returned. The rest of their teardowns (waiting for the processes to go,
    /// cgroups, network slots, writable layers, directories: a few milliseconds each) goes on
    /// in the background, [`TEARDOWNS`] at a time, so a stop of a thousand neither waits for a
    /// thousand teardowns nor floods the node with them (the node's shutdown waits for them). A
    /// sandbox that ended meanwhile counts as stopped.
    pub(crate) async fn stop_all(&self, sandboxes: &[Arc<Sandbox>]) {
        let ends = sandboxes.iter().map(|sb| async move {
            let _g = sb.lifecycle.lock().await;
            self.legal(sb, Action::Kill).ok()?;
            sb.set_phase(Phase::Stopping);
            self.retire(sb).await;
            Some(sb.clone())
        });
        let ended: Vec<Arc<Sandbox>> = futures_util::future::join_all(ends)
            .await
            .into_iter()
            .flatten()
            .collect();
        let batch = ended.clone();
        if let Err(e) = blocking(move || {
            for sb in &batch {
                sb.instance.kill_now();
            }
            Ok(())
        })
        .await
        {
            tracing::error!("killing a stopped task's sandboxes: {e}");
        }
        for sb in &ended {
            self.admission
                .release(crate::admission::Ask::of(&sb.record.resources));
            tracing::info!(sandbox_id = %sb.record.id, "stopped with its task");
        }
        let held = self.teardowns.clone().read_owned().await;
        tokio::spawn(async move {
            use futures_util::StreamExt;
            let _held = held;
            futures_util::stream::iter(ended)
                .for_each_concurrent(TEARDOWNS, |sb| async move {
                    let id = sb.record.id.clone();
                    if let Err(e) = blocking(move || {
                        sb.instance.release();
                        Ok(())
                    })
                    .await
                    {
                        tracing::error!(sandbox_id = %id, "teardown failed: {e}");
                    }
                })
                .await;
        });
    }

    /// Ends a sandbox: its watchers stopped, its names forgotten, its instance released, its
    /// layers and reservation returned. The caller has set it `Stopping`.
    pub(crate) async fn destroy(&self, sb: Arc<Sandbox>) {
        self.retire(&sb).await;
        let ask = crate::admission::Ask::of(&sb.record.resources);
        let id = sb.record.id.clone();
        let res = blocking(move || {
            sb.instance.release();
            Ok(())
        })
        .await;
        if let Err(e) = res {
            tracing::error!(sandbox_id = %id, "teardown failed: {e}");
        }
        self.admission.release(ask);
    }

    /// The first steps of a sandbox's end (set `Stopping` by the caller): what its guest has
    /// not reported yet fetched, its watchers stopped, its names forgotten.
    async fn retire(&self, sb: &Arc<Sandbox>) {
        if !sb.instance.is_frozen() {
            self.last_incidents(sb).await;
        }
        for t in sb.tasks.lock().unwrap_or_else(|p| p.into_inner()).drain(..) {
            t.abort();
        }
        self.forget(&sb.record.id);
        if let Some(key) = &sb.record.idempotency_key {
            self.idempotency
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .remove(key);
        }
    }

    /// Called when a sandbox's init exits on its own (crash, OOM kill of PID 1).
    async fn on_init_exit(&self, id: SandboxId) {
        let Ok(sb) = self.get(&id) else { return };
        let _g = sb.lifecycle.lock().await;
        if !matches!(self.legal(&sb, Action::InitExited), Ok(true)) {
            return;
        }
        tracing::warn!(sandbox_id = %id, "the sandbox's init exited; cleaning up");
        sb.set_phase(Phase::Stopping);
        self.destroy(sb.clone()).await;
    }

    /// Starts the tasks that follow a sandbox: its exit and its incident records. (Timeouts
    /// are the timer sweep's.)
    pub(crate) fn watch(self: &Arc<Self>, sb: &Arc<Sandbox>) {
        let node = Arc::downgrade(self);
        let id = sb.record.id.clone();
        let exited = sb.instance.exited();
        let mut tasks = vec![
            tokio::spawn(async move {
                exited.await;
                if let Some(node) = node.upgrade() {
                    node.on_init_exit(id).await;
                }
            })
            .abort_handle(),
        ];
        tasks.push(self.watch_incidents(sb));
        *sb.tasks.lock().unwrap_or_else(|p| p.into_inner()) = tasks;
    }
}

impl Node {
    /// Reads back, in the background and one batch at a time, what of just-resumed
    /// sandboxes' memory their pause moved to swap (when pauses reclaim and
    /// `prefetch_on_resume` is on). The resume has answered already: the sandboxes run
    /// meanwhile, and a page they touch first comes in on its own.
    pub(crate) fn prefetch(&self, sandboxes: Vec<Arc<Sandbox>>) {
        if sandboxes.is_empty() || !(self.cfg.reclaim_on_pause && self.cfg.prefetch_on_resume) {
            return;
        }
        let gate = self.prefetch_gate.clone();
        tokio::spawn(async move {
            let Ok(_permit) = gate.acquire_owned().await else {
                return;
            };
            let t = std::time::Instant::now();
            let n = sandboxes.len();
            let advised = blocking(move || {
                let mut advised = 0;
                for sb in &sandboxes {
                    match sb.instance.prefetch() {
                        Ok(a) => advised += a,
                        Err(e) => {
                            tracing::warn!(sandbox_id = %sb.record.id, "prefetch after resume: {e}")
                        }
                    }
                }
                Ok(advised)
            })
            .await
            .unwrap_or(0);
            tracing::debug!(
                sandboxes = n,
                advised,
                ms = t.elapsed().as_millis() as u64,
                "prefetched after resume"
            );
        });
    }
}

/// Teardowns a task's stop runs at once in the background.
const TEARDOWNS: usize = 4;

/// How long a pause waits for its sandboxes' processes to stop, once their freezers are
/// written (a task's pause: after it began). A process stops the moment it next runs, but on a
/// loaded host a busy sandbox at idle CPU priority may wait long for a CPU (1,000 sandboxes of
/// shell loops took 4 to 10 s to freeze on 2 cores): one not frozen by then is answered paused,
/// since nothing of it runs again before its resume, and its memory is reclaimed once it is.
pub(crate) const FREEZE_WAIT: Duration = Duration::from_millis(400);

/// What a freeze begun and waited for means: one still freezing is paused (its processes stop
/// as they next run), a thaw not done is a failure.
pub(crate) fn settled(done: bool, frozen: bool) -> std::io::Result<()> {
    if done || frozen {
        Ok(())
    } else {
        Err(std::io::Error::new(
            std::io::ErrorKind::TimedOut,
            format!("cgroup did not thaw in {} s", FREEZE_TIMEOUT.as_secs()),
        ))
    }
}

/// What a freeze (or thaw) failure was doing.
pub(crate) fn freeze_what(frozen: bool) -> &'static str {
    if frozen {
        "freezing the sandbox"
    } else {
        "thawing the sandbox"
    }
}

/// How long after a pause began its answer waits for the memory reclaim: what is not
/// reclaimed by then is reclaimed after the answer, in the background. A reclaim is a write
/// the kernel finishes only once it has pushed the memory out (to swap, or dropped page
/// cache): about 100 ms per 20 MiB of anonymous memory into zram on 2 cores, and ~0.4 ms for
/// an idle sandbox, so a thousand sandboxes, or one large one, would otherwise hold the answer
/// for seconds.
pub(crate) const RECLAIM_WAIT: Duration = Duration::from_millis(500);

/// What a reclaim has done so far.
#[derive(Default)]
struct Reclaimed {
    /// Bytes freed by the sandboxes done.
    freed: AtomicU64,
    /// The sandbox being reclaimed now, and its memory when it began.
    current: Mutex<Option<(Arc<Sandbox>, u64)>>,
}

/// Reclaims the memory of paused sandboxes (see [`crate::backend::Instance::reclaim`]), one
/// after another on one blocking thread, each under its lifecycle lock and only while it is
/// still paused: one whose lock is held (a resume, a kill, another operation come meanwhile)
/// is left alone, and an operation that comes during a sandbox's reclaim waits for that one
/// alone. Waits until `until` at most and returns what was freed by then, the sandbox in
/// progress counted for what it gave back so far; the rest goes on in the background.
pub(crate) async fn reclaim_paused(sandboxes: Vec<Arc<Sandbox>>, until: Instant) -> u64 {
    let progress = Arc::new(Reclaimed::default());
    let p = progress.clone();
    let n = sandboxes.len();
    let mut job = tokio::task::spawn_blocking(move || {
        let mut queue: std::collections::VecDeque<Arc<Sandbox>> = sandboxes.into();
        let give_up = Instant::now() + FREEZE_TIMEOUT;
        let mut since_progress = 0;
        while let Some(sb) = queue.pop_front() {
            let Ok(_g) = sb.lifecycle.try_lock() else {
                continue;
            };
            if sb.phase() != Phase::Paused {
                continue;
            }
            // Still freezing (its pause answered before every process stopped): its turn
            // comes again once the others have had theirs.
            match sb.instance.freeze_done(true) {
                Ok(true) => since_progress = 0,
                Ok(false) if Instant::now() < give_up => {
                    queue.push_back(sb.clone());
                    since_progress += 1;
                    if since_progress >= queue.len() {
                        std::thread::sleep(Duration::from_millis(1));
                        since_progress = 0;
                    }
                    continue;
                }
                Ok(false) => {
                    tracing::warn!(sandbox_id = %sb.record.id, "not frozen after {} s: its memory is not reclaimed", FREEZE_TIMEOUT.as_secs());
                    continue;
                }
                Err(e) => {
                    tracing::warn!(sandbox_id = %sb.record.id, "reclaim on pause: {e}");
                    continue;
                }
            }
            let before = sb.instance.memory_charged();
            *p.current.lock().unwrap_or_else(|e| e.into_inner()) = Some((sb.clone(), before));
            match sb
                .instance
                .reclaim(sb.record.resources.memory_limit.bytes())
            {
                Ok(n) => {
                    p.freed.fetch_add(n, Ordering::Relaxed);
                }
                Err(e) => tracing::warn!(sandbox_id = %sb.record.id, "reclaim on pause: {e}"),
            }
            *p.current.lock().unwrap_or_else(|e| e.into_inner()) = None;
        }
    });
    if tokio::time::timeout_at(until.into(), &mut job)
        .await
        .is_ok()
    {
        return progress.freed.load(Ordering::Relaxed);
    }
    // Read in this order, a sandbox finishing in between is counted once (or not yet).
    let done = progress.freed.load(Ordering::Relaxed);
    let current = progress
        .current
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .clone();
    let partial = match current {
        Some((sb, before)) => {
            blocking(move || Ok(before.saturating_sub(sb.instance.memory_charged())))
                .await
                .unwrap_or(0)
        }
        None => 0,
    };
    tracing::debug!(
        sandboxes = n,
        "the pause answers; its reclaim goes on in the background"
    );
    done + partial
}

/// Writes the memory limits of sandboxes about to be thawed again (waiting for a reclaim in
/// progress to finish). Returns those whose limit could not be written: they must not be
/// thawed. Blocking.
pub(crate) fn restore_limits(sandboxes: &[Arc<Sandbox>]) -> Vec<(SandboxId, std::io::Error)> {
    let mut failed = Vec::new();
    for sb in sandboxes {
        let limit = sb.record.resources.memory_limit.bytes();
        if let Err(e) = sb.instance.restore_memory_limit(limit) {
            tracing::error!(sandbox_id = %sb.record.id, "memory limit before resume: {e}");
            failed.push((sb.record.id.clone(), e));
        }
    }
    failed
}
