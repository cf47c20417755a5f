//! A sandbox's lifecycle: pause, resume, kill, transparent resume, and the end of a sandbox
//! whose init exited. Each operation asks the phase table (`phase`) whether it may go ahead,
//! under the sandbox's lifecycle lock.

use std::sync::Arc;

use warren_types::api::Sandbox as SandboxView;
use warren_types::id::SandboxId;

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
        let sb = self.get(id)?;
        let _g = sb.lifecycle.lock().await;
        if !self.legal(&sb, action)? {
            return Ok(sb.view(&self.id, &self.cfg.pool));
        }
        let frozen = action == Action::Pause;
        if frozen {
            // A frozen guest answers nothing: what it recorded is fetched first.
            self.last_incidents(&sb).await;
        }
        let s = sb.clone();
        let reclaim_on_pause = self.cfg.reclaim_on_pause;
        let freed = blocking(move || {
            if !frozen && let Some((_, e)) = restore_limits(std::slice::from_ref(&s)).pop() {
                return Err(std::io::Error::new(
                    e.kind(),
                    format!("writing its memory limit back before the thaw: {e}"),
                ));
            }
            s.instance.set_frozen(frozen)?;
            Ok(if frozen && reclaim_on_pause {
                reclaim(std::slice::from_ref(&s))
            } else {
                0
            })
        })
        .await
        .map_err(|e| NodeError::host(freeze_what(frozen), e))?;
        if frozen {
            tracing::debug!(sandbox_id = %id, freed, "memory reclaimed on pause");
        }
        if let Some(p) = after(action) {
            sb.set_phase(p);
        }
        if !frozen {
            self.prefetch(vec![sb.clone()]);
        }
        tracing::debug!(sandbox_id = %id, ?action, "done");
        Ok(sb.view(&self.id, &self.cfg.pool))
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

    /// Ends a sandbox: its watchers stopped, its names forgotten, its instance released, its
    /// layers and reservation returned. The caller has set it `Stopping`.
    pub(crate) async fn destroy(&self, sb: Arc<Sandbox>) {
        if !sb.instance.is_frozen() {
            self.last_incidents(&sb).await;
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

/// What a freeze (or thaw) failure was doing.
pub(crate) fn freeze_what(frozen: bool) -> &'static str {
    if frozen {
        "freezing the sandbox"
    } else {
        "thawing the sandbox"
    }
}

/// Reclaims the memory of frozen sandboxes; returns the bytes freed. Blocking.
pub(crate) fn reclaim(sandboxes: &[Arc<Sandbox>]) -> u64 {
    let mut freed = 0;
    for sb in sandboxes {
        let limit = sb.record.resources.memory_limit.bytes();
        match sb.instance.reclaim(limit) {
            Ok(n) => freed += n,
            Err(e) => tracing::warn!(sandbox_id = %sb.record.id, "reclaim on pause: {e}"),
        }
    }
    freed
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
