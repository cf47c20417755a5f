//! Limits the kernel enforces on a sandbox, turned into incident events when they bite: a
//! process the OOM killer took, a fork refused at the process limit, the writable layer full
//! at its disk quota. The counters are read every few seconds by the timer sweep; an
//! increase (or a full volume) is an event.

use std::sync::Arc;

use warren_types::events::EventKind;

use crate::node::{Node, Phase, Sandbox, Seen};

impl Node {
    /// Reads each sandbox's limit counters and records what increased (blocking: cgroup files).
    pub(crate) fn check_limits(&self, sandboxes: &[Arc<Sandbox>]) {
        for sb in sandboxes {
            if sb.phase() == Phase::Stopping {
                continue;
            }
            let now = sb.instance.counters();
            let (oom, pids) = (now.oom_kills, now.pids_max);
            // Full: within a megabyte of the quota (writes stop just short of it).
            let disk = sb.instance.disk_usage().filter(|(_, limit)| *limit > 0);
            let full = disk.is_some_and(|(used, limit)| used + (1 << 20) >= limit);
            let last = {
                let mut c = sb.seen.lock().unwrap_or_else(|p| p.into_inner());
                let last = *c;
                *c = Seen {
                    counters: now,
                    disk_full: full,
                };
                last
            };
            if full && !last.disk_full {
                let limit = disk.map_or(0, |(_, l)| l);
                self.events.occur(
                    &sb.record.id,
                    sb.record.task.as_deref(),
                    EventKind::DiskQuota,
                    format!(
                        "writable layer full at its quota ({})",
                        warren_types::ByteSize(limit)
                    ),
                    1,
                );
            }
            let task = sb.record.task.as_deref();
            if oom > last.counters.oom_kills {
                self.events.occur(
                    &sb.record.id,
                    task,
                    EventKind::OomKill,
                    format!("memory limit {}", sb.record.resources.memory),
                    oom - last.counters.oom_kills,
                );
            }
            if pids > last.counters.pids_max {
                self.events.occur(
                    &sb.record.id,
                    task,
                    EventKind::PidsLimit,
                    format!("pids limit {}", sb.record.resources.pids),
                    pids - last.counters.pids_max,
                );
            }
        }
    }
}
