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
                if n.is_multiple_of(4) {
                    // The backend's upkeep, then layers unused for a while unmounted (every
                    // second).
                    let node = node.clone();
                    tokio::task::spawn_blocking(move || {
                        node.sampler.sample(node.backend.memory_charged());
                        node.backend.housekeeping();
                        node.layers.sweep(false)
                    });
                }
                // Function-call pools: trimmed, refilled for calls waiting, grants made.
                node.fncall_upkeep();
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
            let a = *sb.activity.lock().unwrap_or_else(|p| p.into_inner());
            let facts = Facts {
                phase: sb.phase(),
                deadline_ms: sb.deadline_ms.load(Ordering::Relaxed),
                idle_timeout: sb.record.idle_timeout,
                busy: a.busy,
                last_ms: a.last_ms,
            };
            let id = sb.record.id.clone();
            let node = self.clone();
            match due(now, facts) {
                None => {}
                Some(Due::Deadline) => {
                    tokio::spawn(async move {
                        tracing::info!(sandbox_id = %id, "absolute timeout reached");
                        let _ = node.kill(&id).await;
                    });
                }
                Some(Due::Idle) => {
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
        Ok(sb.view(&self.id, &self.cfg.pool))
    }
}

/// What the sweep knows of a sandbox.
#[derive(Debug, Clone, Copy)]
struct Facts {
    phase: Phase,
    deadline_ms: u64,
    idle_timeout: Option<u64>,
    /// Operations in flight.
    busy: u32,
    /// When the last one ended, ms since the epoch.
    last_ms: u64,
}

/// A timer that has gone off.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Due {
    /// The absolute timeout: kill it.
    Deadline,
    /// The idle timeout: its `on_idle`.
    Idle,
}

/// Which timer of a sandbox has gone off at `now`, if any. A sandbox being torn down has none;
/// the absolute timeout comes first; only a running sandbox with nothing in flight for the
/// whole idle time is idle (a paused one is already what idleness would make it, or should
/// stay as its caller paused it).
fn due(now: u64, f: Facts) -> Option<Due> {
    if f.phase == Phase::Stopping {
        return None;
    }
    if now >= f.deadline_ms {
        return Some(Due::Deadline);
    }
    let idle = f.idle_timeout?;
    let quiet = f.busy == 0 && now.saturating_sub(f.last_ms) >= idle * 1000;
    (f.phase == Phase::Running && quiet).then_some(Due::Idle)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn facts() -> Facts {
        Facts {
            phase: Phase::Running,
            deadline_ms: 100_000,
            idle_timeout: Some(10),
            busy: 0,
            last_ms: 50_000,
        }
    }

    #[test]
    fn timers_go_off_when_they_should_and_not_before() {
        assert_eq!(due(59_999, facts()), None);
        assert_eq!(due(60_000, facts()), Some(Due::Idle));
        assert_eq!(
            due(100_000, facts()),
            Some(Due::Deadline),
            "the deadline first"
        );
        let busy = Facts { busy: 1, ..facts() };
        assert_eq!(
            due(90_000, busy),
            None,
            "an operation in flight is activity"
        );
        assert_eq!(
            due(100_000, busy),
            Some(Due::Deadline),
            "but not past the deadline"
        );
        let paused = Facts {
            phase: Phase::Paused,
            ..facts()
        };
        assert_eq!(due(90_000, paused), None);
        assert_eq!(due(100_000, paused), Some(Due::Deadline));
        let stopping = Facts {
            phase: Phase::Stopping,
            ..facts()
        };
        assert_eq!(due(200_000, stopping), None);
        let no_idle = Facts {
            idle_timeout: None,
            ..facts()
        };
        assert_eq!(due(99_999, no_idle), None);
    }
}
