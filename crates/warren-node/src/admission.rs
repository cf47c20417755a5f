//! Admission: the node's own last word on whether a sandbox fits.
//!
//! Refusals are `capacity` errors (HTTP 429) with a reason and a retry hint, so the control
//! plane can place the sandbox elsewhere or tell the caller when to retry.

use std::sync::Mutex;

use warren_types::ByteSize;

use crate::config::NodeConfig;
use crate::error::NodeError;

/// Memory and count promised to sandboxes (running and being created).
#[derive(Debug, Default)]
pub struct Admission {
    usage: Mutex<Usage>,
}

#[derive(Debug, Default, Clone, Copy)]
pub struct Usage {
    pub sandboxes: u32,
    pub memory: u64,
    pub disk: u64,
}

/// What one sandbox asks of the node.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Ask {
    pub memory: u64,
    pub disk: u64,
}

impl Ask {
    /// What a sandbox with these resources holds.
    pub fn of(r: &warren_types::api::Resources) -> Ask {
        Ask {
            memory: r.memory.bytes(),
            disk: r.disk.map_or(0, |d| d.bytes()),
        }
    }
}

/// Host facts admission looks at.
#[derive(Debug, Clone, Copy)]
pub struct HostLoad {
    pub mem_total: u64,
    pub mem_available: u64,
    pub threads: u32,
    pub pid_max: u32,
}

impl HostLoad {
    /// Reads the host's current load.
    pub fn read() -> std::io::Result<HostLoad> {
        let meminfo = std::fs::read_to_string("/proc/meminfo")?;
        let field = |name: &str| {
            meminfo
                .lines()
                .find(|l| l.starts_with(name))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|kb| kb.parse::<u64>().ok())
                .map(|kb| kb * 1024)
                .unwrap_or(0)
        };
        let (threads, pid_max) = warren_sys::process::thread_usage()?;
        Ok(HostLoad {
            mem_total: field("MemTotal:"),
            mem_available: field("MemAvailable:"),
            threads,
            pid_max,
        })
    }
}

impl Admission {
    /// Current promises.
    pub fn usage(&self) -> Usage {
        *self.usage.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Admits a sandbox asking `ask`, or says why not. `disk` is the size of the node's disk
    /// pool and its free space, where it has one.
    pub fn reserve(
        &self,
        cfg: &NodeConfig,
        load: &HostLoad,
        disk: Option<(u64, u64)>,
        ask: Ask,
    ) -> Result<(), NodeError> {
        let (disk_capacity, disk_free) = disk.unwrap_or((0, u64::MAX));
        let memory = ask.memory;
        let mut u = self.usage.lock().unwrap_or_else(|p| p.into_inner());
        let refuse = |message: String| NodeError::Capacity {
            message,
            retry_after: 1,
        };
        if u.sandboxes + 1 > cfg.max_sandboxes {
            return Err(refuse(format!(
                "this node runs {} sandboxes, its limit (max_sandboxes); retry when some end",
                u.sandboxes
            )));
        }
        let allocatable = (load.mem_total as f64 * cfg.memory_overcommit) as u64;
        if u.memory + memory > allocatable {
            return Err(refuse(format!(
                "this node has promised {} of memory to sandboxes and may promise {} in all \
                 ({} physical × overcommit {}); this sandbox asks {}: ask for less memory or retry when sandboxes end",
                ByteSize(u.memory),
                ByteSize(allocatable),
                ByteSize(load.mem_total),
                cfg.memory_overcommit,
                ByteSize(memory)
            )));
        }
        if load.mem_available < cfg.min_free_memory.bytes() {
            return Err(refuse(format!(
                "this node has only {} of memory available (it keeps {} free); retry later",
                ByteSize(load.mem_available),
                cfg.min_free_memory
            )));
        }
        if load.threads + cfg.pid_headroom > load.pid_max {
            return Err(refuse(format!(
                "this node runs {} threads of kernel.pid_max {}; retry when sandboxes end, or raise kernel.pid_max",
                load.threads, load.pid_max
            )));
        }
        let disk_allocatable = (disk_capacity as f64 * cfg.disk_overcommit) as u64;
        if ask.disk > 0 && u.disk + ask.disk > disk_allocatable {
            return Err(refuse(format!(
                "this node has promised {} of disk quota to sandboxes and may promise {} in all \
                 ({} disk pool × disk_overcommit {}); this sandbox asks {}: ask for less disk or retry when sandboxes end",
                ByteSize(u.disk),
                ByteSize(disk_allocatable),
                ByteSize(disk_capacity),
                cfg.disk_overcommit,
                ByteSize(ask.disk)
            )));
        }
        if disk_free < cfg.min_free_disk.bytes() {
            return Err(refuse(format!(
                "this node's disk pool has only {} free (it keeps {} free); retry when sandboxes end",
                ByteSize(disk_free),
                cfg.min_free_disk
            )));
        }
        u.sandboxes += 1;
        u.memory += memory;
        u.disk += ask.disk;
        Ok(())
    }

    /// Counts an existing sandbox (adopted after a restart) without checks.
    pub fn add(&self, ask: Ask) {
        let mut u = self.usage.lock().unwrap_or_else(|p| p.into_inner());
        u.sandboxes += 1;
        u.memory += ask.memory;
        u.disk += ask.disk;
    }

    /// Gives back what a sandbox held.
    pub fn release(&self, ask: Ask) {
        let mut u = self.usage.lock().unwrap_or_else(|p| p.into_inner());
        u.sandboxes = u.sandboxes.saturating_sub(1);
        u.memory = u.memory.saturating_sub(ask.memory);
        u.disk = u.disk.saturating_sub(ask.disk);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn load() -> HostLoad {
        HostLoad {
            mem_total: 1 << 30,
            mem_available: 1 << 30,
            threads: 100,
            pid_max: 32768,
        }
    }

    #[test]
    fn refuses_past_each_limit_with_a_reason() {
        let cfg = NodeConfig {
            max_sandboxes: 2,
            memory_overcommit: 1.0,
            ..NodeConfig::default()
        };
        let a = Admission::default();
        a.reserve(&cfg, &load(), None, mem(256 << 20)).unwrap();
        let e = a
            .reserve(&cfg, &load(), None, mem(1 << 30))
            .unwrap_err()
            .to_string();
        assert!(e.contains("ask for less memory"), "{e}");
        a.reserve(&cfg, &load(), None, mem(256 << 20)).unwrap();
        let e = a
            .reserve(&cfg, &load(), None, mem(1))
            .unwrap_err()
            .to_string();
        assert!(e.contains("max_sandboxes"), "{e}");
        a.release(mem(256 << 20));
        let low = HostLoad {
            mem_available: 1 << 20,
            ..load()
        };
        let e = a.reserve(&cfg, &low, None, mem(1)).unwrap_err().to_string();
        assert!(e.contains("available"), "{e}");
        let busy = HostLoad {
            threads: 32700,
            ..load()
        };
        let e = a
            .reserve(&cfg, &busy, None, mem(1))
            .unwrap_err()
            .to_string();
        assert!(e.contains("pid_max"), "{e}");
        assert_eq!(a.usage().sandboxes, 1);
        // Disk quotas count against the pool times its overcommit.
        let disk = |d: u64| Ask { memory: 1, disk: d };
        let cfg = NodeConfig {
            disk_overcommit: 2.0,
            ..NodeConfig::default()
        };
        a.reserve(&cfg, &load(), Some((1 << 30, 1 << 30)), disk(1 << 30))
            .unwrap();
        let e = a
            .reserve(&cfg, &load(), Some((1 << 30, 1 << 30)), disk(2 << 30))
            .unwrap_err()
            .to_string();
        assert!(e.contains("ask for less disk"), "{e}");
        a.release(disk(1 << 30));
        a.reserve(&cfg, &load(), Some((1 << 30, 1 << 30)), disk(2 << 30))
            .unwrap();
        let e = a
            .reserve(&cfg, &load(), Some((1 << 40, 1 << 20)), disk(1 << 20))
            .unwrap_err()
            .to_string();
        assert!(e.contains("disk pool has only"), "{e}");
    }

    fn mem(m: u64) -> Ask {
        Ask { memory: m, disk: 0 }
    }
}
