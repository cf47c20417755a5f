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
                    crate::events::Owner::of(&sb.record),
                    EventKind::DiskQuota,
                    format!(
                        "writable layer full at its quota ({})",
                        warren_types::ByteSize(limit)
                    ),
                    1,
                );
            }
            let owner = crate::events::Owner::of(&sb.record);
            if oom > last.counters.oom_kills {
                self.events.occur(
                    &sb.record.id,
                    owner,
                    EventKind::OomKill,
                    format!("memory limit {}", sb.record.resources.memory),
                    oom - last.counters.oom_kills,
                );
            }
            if pids > last.counters.pids_max {
                self.events.occur(
                    &sb.record.id,
                    owner,
                    EventKind::PidsLimit,
                    format!("pids limit {}", sb.record.resources.pids),
                    pids - last.counters.pids_max,
                );
            }
        }
    }
}

/// How old a previous metrics read may be and still be the start of the CPU interval.
const CPU_INTERVAL_MAX_MS: u64 = 60_000;

impl Node {
    /// What a sandbox uses now (blocking: cgroup and /proc files).
    pub fn metrics(
        &self,
        id: &warren_types::id::SandboxId,
    ) -> Result<warren_types::api::SandboxMetrics, crate::error::NodeError> {
        let sb = self.get(id)?;
        let u = sb.instance.usage();
        let now = crate::state::now_ms();
        let limit = sb.record.resources.cpu.max(1);
        let (from_ms, from_ns) = {
            let mut seen = sb.cpu_seen.lock().unwrap_or_else(|p| p.into_inner());
            let from = match *seen {
                Some((ms, ns)) if now > ms && now - ms <= CPU_INTERVAL_MAX_MS && ns <= u.cpu_ns => {
                    (ms, ns)
                }
                _ => (sb.record.created_ms, 0),
            };
            *seen = Some((now, u.cpu_ns));
            from
        };
        let wall_ns = now.saturating_sub(from_ms).max(1) as f64 * 1e6;
        let cores = limit as f64 / 1000.0;
        let pct = (u.cpu_ns - from_ns) as f64 / wall_ns / cores * 100.0;
        let disk = sb.instance.disk_usage();
        Ok(warren_types::api::SandboxMetrics {
            timestamp_ms: now,
            cpu_used_ns: u.cpu_ns,
            cpu_used_pct: (pct * 100.0).round() / 100.0,
            cpu_limit: limit,
            memory_used: u.memory,
            memory_cache: u.memory_cache,
            memory_limit: sb.record.resources.memory.bytes(),
            disk_used: disk.map(|(used, _)| used),
            disk_limit: disk.map(|(_, l)| l).filter(|l| *l > 0),
        })
    }
}
