//! Limits the kernel enforces on a sandbox, turned into incident events when they bite: a
//! process the OOM killer took, a fork refused at the process limit. The counters are read
//! every few seconds by the timer sweep; an increase is an event.

use std::sync::Arc;

use warren_types::events::EventKind;

use crate::node::{Node, Phase, Sandbox};

/// The kernel's counters as last seen.
#[derive(Debug, Default, Clone, Copy)]
pub struct Counters {
    oom_kills: u64,
    pids_max: u64,
}

impl Node {
    /// Reads each sandbox's limit counters and records what increased (blocking: cgroup files).
    pub(crate) fn check_limits(&self, sandboxes: &[Arc<Sandbox>]) {
        for sb in sandboxes {
            if sb.phase() == Phase::Stopping {
                continue;
            }
            let (oom, pids) = sb.cgroup.limit_counters();
            let last = {
                let mut c = sb.counters.lock().unwrap_or_else(|p| p.into_inner());
                let last = *c;
                *c = Counters {
                    oom_kills: oom,
                    pids_max: pids,
                };
                last
            };
            let task = sb.record.task.as_deref();
            if oom > last.oom_kills {
                self.events.occur(
                    &sb.record.id,
                    task,
                    EventKind::OomKill,
                    format!("memory limit {}", sb.record.resources.memory),
                    oom - last.oom_kills,
                );
            }
            if pids > last.pids_max {
                self.events.occur(
                    &sb.record.id,
                    task,
                    EventKind::PidsLimit,
                    format!("pids limit {}", sb.record.resources.pids),
                    pids - last.pids_max,
                );
            }
        }
    }
}
