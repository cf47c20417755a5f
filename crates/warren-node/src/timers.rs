//! Lifecycle timers: the absolute timeout and the idle timeout, both kept by one sweep over the
//! node's sandboxes four times a second.
//!
//! The absolute deadline is in the sandbox's record on disk, so it survives restarts of the
//! daemon (`set_timeout` moves it and saves the record). Idleness is "no API activity": no
//! command, file or process operation in flight and none for `idle_timeout` seconds. After a
//! daemon restart a sandbox's idle clock starts again from the restart, since the moment of
//! its last operation was not kept (the conservative choice: never pause early).

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use warren_types::api::{IdleAction, Sandbox as SandboxView};
use warren_types::id::SandboxId;

use crate::error::NodeError;
use crate::node::{Node, Phase, blocking};
use crate::state;

/// How often the sweep runs.
const SWEEP: Duration = Duration::from_millis(250);

impl Node {
    /// Starts the sweep (once, at start).
    pub(crate) fn start_timers(self: &Arc<Self>) {
        let node = Arc::downgrade(self);
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(SWEEP);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
            let mut n: u64 = 0;
            loop {
                tick.tick().await;
                let Some(node) = node.upgrade() else { break };
                node.sweep();
                n += 1;
                if n.is_multiple_of(8) {
                    // Kernel limit counters into events (every 2 s).
                    let node = node.clone();
                    tokio::task::spawn_blocking(move || {
                        let all: Vec<_> = node
                            .sandboxes
                            .read()
                            .unwrap_or_else(|p| p.into_inner())
                            .values()
                            .cloned()
                            .collect();
                        node.check_limits(&all);
                    });
                }
                if n.is_multiple_of(20) {
                    // Unmount layers unused for a while (every 5 s).
                    let node = node.clone();
                    tokio::task::spawn_blocking(move || node.layers.sweep(false));
                }
                if n.is_multiple_of(240)
                    && let Some(pool) = node.dirs.disk.clone()
                {
                    // Quota groups of deleted volumes, once the kernel has freed them (every
                    // minute).
                    tokio::task::spawn_blocking(move || pool.collect_quota_groups());
                }
            }
        });
    }

    fn sweep(self: &Arc<Self>) {
        let now = state::now_ms();
        let sandboxes: Vec<_> = self
            .sandboxes
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .values()
            .cloned()
            .collect();
        for sb in sandboxes {
            let phase = sb.phase();
            if phase == Phase::Stopping {
                continue;
            }
            let id = sb.record.id.clone();
            if now >= sb.deadline_ms.load(Ordering::Relaxed) {
                let node = self.clone();
                tokio::spawn(async move {
                    tracing::info!(sandbox_id = %id, "absolute timeout reached");
                    let _ = node.kill(&id).await;
                });
                continue;
            }
            let Some(idle) = sb.record.idle_timeout else {
                continue;
            };
            if phase != Phase::Running {
                continue;
            }
            let a = *sb.activity.lock().unwrap_or_else(|p| p.into_inner());
            if a.busy > 0 || now.saturating_sub(a.last_ms) < idle * 1000 {
                continue;
            }
            let node = self.clone();
            let action = sb.record.on_idle;
            tokio::spawn(async move {
                tracing::info!(sandbox_id = %id, ?action, "idle timeout reached");
                let _ = match action {
                    IdleAction::Pause => node.pause(&id).await.map(|_| ()),
                    IdleAction::Stop => node.kill(&id).await,
                };
            });
        }
    }

    /// Gives the sandbox `secs` more seconds to live, counted from now.
    pub async fn set_timeout(&self, id: &SandboxId, secs: u64) -> Result<SandboxView, NodeError> {
        if secs == 0 || secs > self.cfg.max_timeout {
            return Err(NodeError::Invalid(format!(
                "timeout {secs} s is out of range: give 1 to {} seconds",
                self.cfg.max_timeout
            )));
        }
        let sb = self.get(id)?;
        sb.deadline_ms
            .store(state::now_ms() + secs * 1000, Ordering::Relaxed);
        let (dir, record) = (sb.dir.clone(), sb.current_record());
        blocking(move || state::save(&dir, &record))
            .await
            .map_err(|e| NodeError::host("saving the sandbox's state", e))?;
        Ok(sb.view(&self.id))
    }
}
