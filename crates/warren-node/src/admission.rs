//! Admission: the node's own last word on whether a sandbox fits.
//!
//! Two kinds of check, both needed (see `docs/qos.md`):
//! - **by request**: the sum of sandboxes' CPU and memory requests against the host's cores
//!   and memory times their overcommit factors, and the number of sandboxes against the
//!   derived `max_sandboxes` — what was promised;
//! - **by measurement**: memory the kernel says is available (free plus what it can
//!   reclaim), memory pressure stalls (PSI), threads against `kernel.pid_max`, the disk
//!   pool's free space — what is there now. An overcommitted node refuses before it thrashes
//!   and admits while it has room, whatever the requests' sum says.
//!
//! Refusals are `capacity` errors (HTTP 429) naming the resource and the numbers, with a
//! retry hint, so the control plane can place the sandbox elsewhere or tell the caller when
//! to retry.

use std::sync::Mutex;

use warren_types::ByteSize;

use crate::capacity::Measured;
use crate::config::NodeConfig;
use crate::error::NodeError;

/// Requests promised to sandboxes (running and being created).
#[derive(Debug, Default)]
pub struct Admission {
    usage: Mutex<Usage>,
}

#[derive(Debug, Default, Clone, Copy)]
pub struct Usage {
    pub sandboxes: u32,
    /// CPU requests, millicores.
    pub cpu: u64,
    /// Memory requests, bytes.
    pub memory: u64,
    pub disk: u64,
}

/// What one sandbox asks of the node.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Ask {
    /// CPU request, millicores.
    pub cpu: u64,
    /// Memory request, bytes.
    pub memory: u64,
    pub disk: u64,
}

impl Ask {
    /// What a sandbox with these resources holds.
    pub fn of(r: &warren_types::api::Resources) -> Ask {
        Ask {
            cpu: u64::from(r.cpu),
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
    pub cores: u32,
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
            cores: std::thread::available_parallelism()
                .map(|n| n.get() as u32)
                .unwrap_or(1),
        })
    }
}

/// What admission checks against besides the configuration.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// The derived (or configured) most sandboxes.
    pub max_sandboxes: u32,
}

impl Admission {
    /// Current promises.
    pub fn usage(&self) -> Usage {
        *self.usage.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Admits a sandbox asking `ask`, or says why not. `disk` is the size of the node's disk
    /// pool and its free space, where it has one; `measured` the host's latest load sample.
    pub fn reserve(
        &self,
        cfg: &NodeConfig,
        limits: Limits,
        load: &HostLoad,
        measured: &Measured,
        disk: Option<(u64, u64)>,
        ask: Ask,
    ) -> Result<(), NodeError> {
        let (disk_capacity, disk_free) = disk.unwrap_or((0, u64::MAX));
        let mut u = self.usage.lock().unwrap_or_else(|p| p.into_inner());
        let refuse = |message: String| NodeError::Capacity {
            message,
            retry_after: 1,
        };
        if u.sandboxes + 1 > limits.max_sandboxes {
            return Err(refuse(format!(
                "this node runs {} sandboxes, the most it holds (max_sandboxes, derived from its \
                 memory, pids and open files); retry when some end",
                u.sandboxes
            )));
        }
        let allocatable = (load.mem_total as f64 * cfg.memory_overcommit) as u64;
        if u.memory + ask.memory > allocatable {
            return Err(refuse(format!(
                "memory requests: this node has admitted {} and admits {} in all ({} physical × \
                 memory_overcommit {}); this sandbox requests {}: request less memory (the limit \
                 is separate) or retry when sandboxes end",
                ByteSize(u.memory),
                ByteSize(allocatable),
                ByteSize(load.mem_total),
                cfg.memory_overcommit,
                ByteSize(ask.memory)
            )));
        }
        let cpu_allocatable = (f64::from(load.cores) * 1000.0 * cfg.cpu_overcommit) as u64;
        if u.cpu + ask.cpu > cpu_allocatable {
            return Err(refuse(format!(
                "cpu requests: this node has admitted {}m and admits {}m in all ({} cores × \
                 cpu_overcommit {}); this sandbox requests {}m: request less CPU (the limit is \
                 separate) or retry when sandboxes end",
                u.cpu, cpu_allocatable, load.cores, cfg.cpu_overcommit, ask.cpu
            )));
        }
        if load.mem_available < cfg.min_free_memory.bytes().saturating_add(ask.memory) {
            return Err(refuse(format!(
                "measured memory: this node has {} available now (free plus reclaimable{}); it \
                 keeps {} free and this sandbox requests {}; retry later",
                ByteSize(load.mem_available),
                measured
                    .memory_used
                    .map(|m| format!(", {} charged to sandboxes", ByteSize(m)))
                    .unwrap_or_default(),
                cfg.min_free_memory,
                ByteSize(ask.memory)
            )));
        }
        if let Some(p) = measured.pressure
            && p.memory > cfg.max_memory_pressure
        {
            return Err(refuse(format!(
                "memory pressure: tasks on this node stalled for memory {:.1}% of the last 10 s \
                 (PSI), more than max_memory_pressure {}%; retry later",
                p.memory, cfg.max_memory_pressure
            )));
        }
        if load.threads.saturating_add(cfg.pid_headroom) > load.pid_max {
            return Err(refuse(format!(
                "pids: this node runs {} threads of kernel.pid_max {} (it keeps {} free); retry \
                 when sandboxes end, or raise kernel.pid_max",
                load.threads, load.pid_max, cfg.pid_headroom
            )));
        }
        let disk_allocatable = (disk_capacity as f64 * cfg.disk_overcommit) as u64;
        if ask.disk > 0 && u.disk + ask.disk > disk_allocatable {
            return Err(refuse(format!(
                "disk quotas: this node has promised {} of disk quota to sandboxes and may \
                 promise {} in all ({} disk pool × disk_overcommit {}); this sandbox asks {}: ask \
                 for less disk or retry when sandboxes end",
                ByteSize(u.disk),
                ByteSize(disk_allocatable),
                ByteSize(disk_capacity),
                cfg.disk_overcommit,
                ByteSize(ask.disk)
            )));
        }
        if disk_free < cfg.min_free_disk.bytes() {
            return Err(refuse(format!(
                "disk: this node's disk pool has only {} free (it keeps {} free); retry when \
                 sandboxes end",
                ByteSize(disk_free),
                cfg.min_free_disk
            )));
        }
        u.sandboxes += 1;
        u.cpu += ask.cpu;
        u.memory += ask.memory;
        u.disk += ask.disk;
        Ok(())
    }

    /// Holds `memory` more of requests (a function call's, on its worker) if the sum stays
    /// within `allocatable`; false otherwise.
    pub fn try_hold(&self, memory: u64, allocatable: u64) -> bool {
        let mut u = self.usage.lock().unwrap_or_else(|p| p.into_inner());
        if u.memory.saturating_add(memory) > allocatable {
            return false;
        }
        u.memory += memory;
        true
    }

    /// Gives back what [`Admission::try_hold`] held.
    pub fn unhold(&self, memory: u64) {
        let mut u = self.usage.lock().unwrap_or_else(|p| p.into_inner());
        u.memory = u.memory.saturating_sub(memory);
    }

    /// Counts an existing sandbox (adopted after a restart) without checks.
    pub fn add(&self, ask: Ask) {
        let mut u = self.usage.lock().unwrap_or_else(|p| p.into_inner());
        u.sandboxes += 1;
        u.cpu += ask.cpu;
        u.memory += ask.memory;
        u.disk += ask.disk;
    }

    /// Gives back what a sandbox held.
    pub fn release(&self, ask: Ask) {
        let mut u = self.usage.lock().unwrap_or_else(|p| p.into_inner());
        u.sandboxes = u.sandboxes.saturating_sub(1);
        u.cpu = u.cpu.saturating_sub(ask.cpu);
        u.memory = u.memory.saturating_sub(ask.memory);
        u.disk = u.disk.saturating_sub(ask.disk);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use warren_types::api::Pressure;

    fn load() -> HostLoad {
        HostLoad {
            mem_total: 1 << 30,
            mem_available: 1 << 30,
            threads: 100,
            pid_max: 32768,
            cores: 2,
        }
    }

    const TWO: Limits = Limits { max_sandboxes: 2 };
    const MANY: Limits = Limits {
        max_sandboxes: 1000,
    };

    fn calm() -> Measured {
        Measured::default()
    }

    #[test]
    fn refuses_past_each_limit_with_a_reason() {
        let cfg = NodeConfig {
            memory_overcommit: 1.0,
            min_free_memory: ByteSize(16 << 20),
            ..NodeConfig::default()
        };
        let a = Admission::default();
        let m = calm();
        a.reserve(&cfg, TWO, &load(), &m, None, mem(256 << 20))
            .unwrap();
        let e = a
            .reserve(&cfg, TWO, &load(), &m, None, mem(1 << 30))
            .unwrap_err()
            .to_string();
        assert!(e.contains("memory requests") && e.contains("1Gi"), "{e}");
        a.reserve(&cfg, TWO, &load(), &m, None, mem(256 << 20))
            .unwrap();
        let e = a
            .reserve(&cfg, TWO, &load(), &m, None, mem(1))
            .unwrap_err()
            .to_string();
        assert!(e.contains("max_sandboxes"), "{e}");
        a.release(mem(256 << 20));
        let low = HostLoad {
            mem_available: 20 << 20,
            ..load()
        };
        let e = a
            .reserve(&cfg, TWO, &low, &m, None, mem(8 << 20))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("measured memory") && e.contains("available"),
            "{e}"
        );
        // The same host admits a smaller request.
        a.reserve(&cfg, TWO, &low, &m, None, mem(1 << 20)).unwrap();
        a.release(mem(1 << 20));
        let busy = HostLoad {
            threads: 32700,
            ..load()
        };
        let e = a
            .reserve(&cfg, TWO, &busy, &m, None, mem(1))
            .unwrap_err()
            .to_string();
        assert!(e.contains("pid_max"), "{e}");
        assert_eq!(a.usage().sandboxes, 1);
        // Disk quotas count against the pool times its overcommit.
        let disk = |d: u64| Ask {
            memory: 1,
            disk: d,
            cpu: 0,
        };
        let cfg = NodeConfig {
            disk_overcommit: 2.0,
            ..NodeConfig::default()
        };
        let a = Admission::default();
        a.reserve(
            &cfg,
            MANY,
            &load(),
            &m,
            Some((1 << 30, 1 << 30)),
            disk(1 << 30),
        )
        .unwrap();
        let e = a
            .reserve(
                &cfg,
                MANY,
                &load(),
                &m,
                Some((1 << 30, 1 << 30)),
                disk(2 << 30),
            )
            .unwrap_err()
            .to_string();
        assert!(e.contains("ask for less disk"), "{e}");
        a.release(disk(1 << 30));
        a.reserve(
            &cfg,
            MANY,
            &load(),
            &m,
            Some((1 << 30, 1 << 30)),
            disk(2 << 30),
        )
        .unwrap();
        let e = a
            .reserve(
                &cfg,
                MANY,
                &load(),
                &m,
                Some((1 << 40, 1 << 20)),
                disk(1 << 20),
            )
            .unwrap_err()
            .to_string();
        assert!(e.contains("disk pool has only"), "{e}");
    }

    #[test]
    fn cpu_requests_count_up_to_the_overcommit_factor() {
        // 2 cores × 8 = 16,000m.
        let cfg = NodeConfig::default();
        let a = Admission::default();
        let cpu = |c: u64| Ask {
            cpu: c,
            memory: 0,
            disk: 0,
        };
        for _ in 0..16 {
            a.reserve(&cfg, MANY, &load(), &calm(), None, cpu(1000))
                .unwrap();
        }
        let e = a
            .reserve(&cfg, MANY, &load(), &calm(), None, cpu(1))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("cpu requests") && e.contains("16000m") && e.contains("cpu_overcommit 8"),
            "{e}"
        );
        a.release(cpu(1000));
        a.reserve(&cfg, MANY, &load(), &calm(), None, cpu(1000))
            .unwrap();
    }

    #[test]
    fn memory_pressure_refuses_whatever_the_requests_say() {
        let cfg = NodeConfig::default();
        let a = Admission::default();
        let stalled = Measured {
            pressure: Some(Pressure {
                cpu: 0.0,
                memory: 35.0,
                io: 0.0,
            }),
            ..Measured::default()
        };
        let e = a
            .reserve(&cfg, MANY, &load(), &stalled, None, mem(1))
            .unwrap_err()
            .to_string();
        assert!(e.contains("memory pressure") && e.contains("35.0%"), "{e}");
        assert_eq!(a.usage().sandboxes, 0);
    }

    fn mem(m: u64) -> Ask {
        Ask {
            memory: m,
            disk: 0,
            cpu: 0,
        }
    }
}
