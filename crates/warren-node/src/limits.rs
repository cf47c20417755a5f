//! Limits the kernel enforces on a sandbox, turned into incident events when they bite: a
//! process the OOM killer took, a fork refused at the process limit, the writable layer full
//! at its disk quota. The counters are read every few seconds by the timer sweep; an
//! increase (or a full volume) is an event.

use std::sync::Arc;

use warren_types::events::EventKind;

use crate::node::{Node, Phase, Sandbox};

/// The kernel's counters as last seen.
#[derive(Debug, Default, Clone, Copy)]
pub struct Counters {
    oom_kills: u64,
    pids_max: u64,
    disk_full: bool,
}

impl Node {
    /// Reads each sandbox's limit counters and records what increased (blocking: cgroup files).
    pub(crate) fn check_limits(&self, sandboxes: &[Arc<Sandbox>]) {
        for sb in sandboxes {
            if sb.phase() == Phase::Stopping {
                continue;
            }
            let (oom, pids) = sb.cgroup.limit_counters();
            // Full: within a megabyte of the quota (writes stop just short of it).
            let disk = self.dirs.disk.as_ref().and_then(|pool| {
                let v = sb.volume.get_or_init(|| pool.volume_of(&sb.dir)).as_ref()?;
                pool.usage(v).filter(|(_, limit)| *limit > 0)
            });
            let full = disk.is_some_and(|(used, limit)| used + (1 << 20) >= limit);
            let last = {
                let mut c = sb.counters.lock().unwrap_or_else(|p| p.into_inner());
                let last = *c;
                *c = Counters {
                    oom_kills: oom,
                    pids_max: pids,
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
