//! Checking requests before anything is acquired: a create's resources, names, labels and
//! environment against the node's configuration and the host. Pure functions, tested
//! without root.

use std::collections::BTreeMap;

use warren_types::ByteSize;
use warren_types::api::{CreateSandbox, QosClass, Resources};

use crate::config::NodeConfig;
use crate::error::NodeError;

/// Most labels, environment variables, and their sizes.
const MAX_LABELS: usize = 64;
const MAX_ENV: usize = 256;
const MAX_ENV_BYTES: usize = 32 * 1024;

/// What a create is checked against besides the configuration.
#[derive(Debug, Clone, Copy)]
pub struct HostFacts {
    /// CPU cores.
    pub ncpu: u32,
    /// Physical memory, bytes.
    pub mem_total: u64,
    /// Size of the disk pool, where the node has one.
    pub disk_pool: Option<u64>,
}

/// Checks a create request against this node's limits and fills in defaults: the resources
/// and the timeout in seconds.
pub fn validate(
    cfg: &NodeConfig,
    host: HostFacts,
    req: &CreateSandbox,
) -> Result<(Resources, u64), NodeError> {
    let bad = |m: String| Err(NodeError::Invalid(m));
    let (ncpu, mem_total) = (host.ncpu, host.mem_total);
    let qos = req.qos.unwrap_or_default();
    let max_cpu = ncpu * 1000;
    // A default request is at most the limit given.
    let cpu = req.cpu.unwrap_or(
        cfg.default_cpu
            .min(max_cpu)
            .min(req.cpu_limit.unwrap_or(u32::MAX)),
    );
    let least_cpu = if qos == QosClass::Ls { 10 } else { 0 };
    if !(least_cpu..=max_cpu).contains(&cpu) {
        return bad(format!(
            "cpu {cpu} millicores (the request) is out of range: give {least_cpu} to {max_cpu} \
             (this node has {ncpu} cores; 1000 = one core{})",
            if qos == QosClass::Ls {
                "; a latency-sensitive sandbox's request is its weight, so at least 10"
            } else {
                ""
            }
        ));
    }
    let cpu_limit = req
        .cpu_limit
        .unwrap_or(cfg.default_cpu_limit.min(max_cpu).max(cpu));
    if !(10..=max_cpu).contains(&cpu_limit) {
        return bad(format!(
            "cpu_limit {cpu_limit} millicores is out of range: give 10 to {max_cpu} (this node \
             has {ncpu} cores; 1000 = one core)"
        ));
    }
    if cpu > cpu_limit {
        return bad(format!(
            "cpu {cpu} (the request) is more than cpu_limit {cpu_limit}: a request is at most \
             the limit; raise cpu_limit or lower cpu"
        ));
    }
    let memory = req.memory.unwrap_or(ByteSize(
        cfg.default_memory
            .bytes()
            .min(mem_total)
            .min(req.memory_limit.map_or(u64::MAX, |l| l.bytes())),
    ));
    if memory.bytes() > mem_total {
        return bad(format!(
            "memory {memory} (the request) is out of range: give 0 to {} (this node's physical \
             memory)",
            ByteSize(mem_total)
        ));
    }
    let memory_limit = req.memory_limit.unwrap_or(ByteSize(
        cfg.default_memory_limit
            .bytes()
            .min(mem_total)
            .max(memory.bytes())
            .max(16 << 20),
    ));
    if memory_limit.bytes() < 16 << 20 || memory_limit.bytes() > mem_total {
        return bad(format!(
            "memory_limit {memory_limit} is out of range: give 16Mi to {} (this node's physical \
             memory)",
            ByteSize(mem_total)
        ));
    }
    if memory > memory_limit {
        return bad(format!(
            "memory {memory} (the request) is more than memory_limit {memory_limit}: a request \
             is at most the limit; raise memory_limit or lower memory"
        ));
    }
    let pids = req.pids.unwrap_or(cfg.default_pids);
    if !(16..=cfg.max_pids).contains(&pids) {
        return bad(format!(
            "pids {pids} is out of range: give 16 to {} (this node's max_pids)",
            cfg.max_pids
        ));
    }
    let timeout = req.timeout.unwrap_or(cfg.default_timeout);
    if timeout == 0 || timeout > cfg.max_timeout {
        return bad(format!(
            "timeout {timeout} s is out of range: give 1 to {} seconds",
            cfg.max_timeout
        ));
    }
    if let Some(p) = &req.project {
        warren_types::project::check_path(p).map_err(NodeError::Invalid)?;
    }
    if let Some(task) = &req.task {
        check_name("task", task, 128)?;
    }
    check_labels(&req.labels)?;
    check_env(&req.env)?;
    if let Some(idle) = req.idle_timeout
        && (idle == 0 || idle > cfg.max_timeout)
    {
        return bad(format!(
            "idle_timeout {idle} s is out of range: give 1 to {} seconds, or leave it out for none",
            cfg.max_timeout
        ));
    }
    if req.on_idle.is_some() && req.idle_timeout.is_none() {
        return bad("on_idle needs an idle_timeout".into());
    }
    let disk = match (host.disk_pool, req.disk) {
        (None, Some(_)) => {
            return bad(
                "this node enforces no disk quotas (see its log: it has no btrfs disk pool); \
                 leave disk out"
                    .into(),
            );
        }
        (None, None) => None,
        (Some(capacity), d) => {
            // The default never asks for more than the pool holds (a small disk's pool is
            // smaller than the default quota): a create that names no disk does not fail for
            // a size it did not ask for.
            let d = d.unwrap_or(ByteSize(cfg.default_disk.bytes().min(capacity)));
            if d.bytes() < 16 << 20 || d.bytes() > capacity {
                return bad(format!(
                    "disk {d} is out of range: give 16Mi to {} (this node's disk pool)",
                    ByteSize(capacity)
                ));
            }
            Some(d)
        }
    };
    Ok((
        Resources {
            cpu,
            cpu_limit,
            memory,
            memory_limit,
            qos,
            pids,
            disk,
        },
        timeout,
    ))
}

/// Labels (a sandbox's, or a node's): at most 64, keys of 1 to 63 letters, digits and
/// `. _ - : /`, values of at most 256 bytes without NUL.
pub fn check_labels(labels: &std::collections::BTreeMap<String, String>) -> Result<(), NodeError> {
    let bad = |m: String| Err(NodeError::Invalid(m));
    if labels.len() > MAX_LABELS {
        return bad(format!(
            "{} labels; at most {MAX_LABELS} are allowed",
            labels.len()
        ));
    }
    for (k, v) in labels {
        check_name("label key", k, 63)?;
        if v.len() > 256 || v.contains('\0') {
            return bad(format!(
                "label {k:?}: the value must be at most 256 bytes without NUL"
            ));
        }
    }
    Ok(())
}

fn check_name(what: &str, s: &str, max: usize) -> Result<(), NodeError> {
    let ok = !s.is_empty()
        && s.len() <= max
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._-:/".contains(&b));
    if ok {
        Ok(())
    } else {
        Err(NodeError::Invalid(format!(
            "{what} {s:?} is not valid: use 1 to {max} letters, digits and . _ - : /"
        )))
    }
}

/// Checks environment variables (names like shell variables, no NUL, bounded size).
pub fn check_env(env: &BTreeMap<String, String>) -> Result<(), NodeError> {
    if env.len() > MAX_ENV {
        return Err(NodeError::Invalid(format!(
            "{} environment variables; at most {MAX_ENV}",
            env.len()
        )));
    }
    let mut total = 0;
    for (k, v) in env {
        let name_ok = !k.is_empty()
            && !k.as_bytes()[0].is_ascii_digit()
            && k.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_');
        if !name_ok {
            return Err(NodeError::Invalid(format!(
                "environment variable name {k:?} is not valid: use letters, digits and _, not starting with a digit"
            )));
        }
        if v.contains('\0') {
            return Err(NodeError::Invalid(format!(
                "environment variable {k} contains a NUL byte"
            )));
        }
        total += k.len() + v.len() + 2;
    }
    if total > MAX_ENV_BYTES {
        return Err(NodeError::Invalid(format!(
            "environment is {total} bytes; at most {MAX_ENV_BYTES}"
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn host() -> HostFacts {
        HostFacts {
            ncpu: 4,
            mem_total: 8 << 30,
            disk_pool: Some(100 << 30),
        }
    }

    fn req() -> CreateSandbox {
        CreateSandbox {
            image: "host".into(),
            ..Default::default()
        }
    }

    fn refused(r: &CreateSandbox, h: HostFacts, word: &str) {
        match validate(&NodeConfig::default(), h, r) {
            Err(NodeError::Invalid(m)) => assert!(m.contains(word), "{m:?} lacks {word:?}"),
            other => panic!("{r:?} gave {other:?}"),
        }
    }

    #[test]
    fn defaults_fill_in_and_ranges_hold() {
        let cfg = NodeConfig::default();
        let (r, timeout) = validate(&cfg, host(), &req()).unwrap();
        assert_eq!(r.cpu, cfg.default_cpu);
        assert_eq!(r.memory, cfg.default_memory);
        assert_eq!(r.pids, cfg.default_pids);
        assert_eq!(r.disk, Some(cfg.default_disk));
        assert_eq!(timeout, cfg.default_timeout);
        let no_pool = HostFacts {
            disk_pool: None,
            ..host()
        };
        assert_eq!(validate(&cfg, no_pool, &req()).unwrap().0.disk, None);
        // A pool smaller than the default quota: the default shrinks to it; asking for more is
        // still refused.
        let small = HostFacts {
            disk_pool: Some(4 << 30),
            ..host()
        };
        assert_eq!(
            validate(&cfg, small, &req()).unwrap().0.disk,
            Some(ByteSize(4 << 30))
        );
        refused(
            &CreateSandbox {
                disk: Some(ByteSize(5 << 30)),
                ..req()
            },
            small,
            "out of range",
        );

        // Requests, limits and classes.
        assert_eq!(r.cpu_limit, cfg.default_cpu_limit);
        assert_eq!(r.memory_limit, cfg.default_memory_limit);
        assert_eq!(r.qos, QosClass::Be);
        let ls = CreateSandbox {
            cpu: Some(500),
            cpu_limit: Some(3000),
            memory: Some(ByteSize(256 << 20)),
            memory_limit: Some(ByteSize(4 << 30)),
            qos: Some(QosClass::Ls),
            ..req()
        };
        let (r, _) = validate(&cfg, host(), &ls).unwrap();
        assert_eq!(
            (r.cpu, r.cpu_limit, r.memory, r.memory_limit, r.qos),
            (
                500,
                3000,
                ByteSize(256 << 20),
                ByteSize(4 << 30),
                QosClass::Ls
            )
        );
        // A best-effort sandbox may request nothing; a limit below the default request takes
        // the request down with it; a request above the default limit takes the limit up.
        let (r, _) = validate(
            &cfg,
            host(),
            &CreateSandbox {
                cpu: Some(0),
                memory: Some(ByteSize(0)),
                ..req()
            },
        )
        .unwrap();
        assert_eq!((r.cpu, r.memory), (0, ByteSize(0)));
        let (r, _) = validate(
            &cfg,
            host(),
            &CreateSandbox {
                cpu_limit: Some(10),
                memory_limit: Some(ByteSize(32 << 20)),
                ..req()
            },
        )
        .unwrap();
        assert_eq!((r.cpu, r.memory), (10, ByteSize(32 << 20)));
        let (r, _) = validate(
            &cfg,
            host(),
            &CreateSandbox {
                cpu: Some(3000),
                memory: Some(ByteSize(3 << 30)),
                ..req()
            },
        )
        .unwrap();
        assert_eq!((r.cpu_limit, r.memory_limit), (3000, ByteSize(3 << 30)));
        refused(
            &CreateSandbox {
                cpu: Some(5),
                qos: Some(QosClass::Ls),
                ..req()
            },
            host(),
            "cpu 5",
        );
        refused(
            &CreateSandbox {
                cpu: Some(2000),
                cpu_limit: Some(1000),
                ..req()
            },
            host(),
            "more than cpu_limit",
        );
        refused(
            &CreateSandbox {
                memory: Some(ByteSize(1 << 30)),
                memory_limit: Some(ByteSize(512 << 20)),
                ..req()
            },
            host(),
            "more than memory_limit",
        );
        refused(
            &CreateSandbox {
                memory_limit: Some(ByteSize(1 << 20)),
                ..req()
            },
            host(),
            "memory_limit 1Mi",
        );
        refused(
            &CreateSandbox {
                cpu: Some(4001),
                ..req()
            },
            host(),
            "4 cores",
        );
        refused(
            &CreateSandbox {
                memory: Some(ByteSize(9 << 30)),
                ..req()
            },
            host(),
            "physical memory",
        );
        refused(
            &CreateSandbox {
                pids: Some(8),
                ..req()
            },
            host(),
            "pids 8",
        );
        refused(
            &CreateSandbox {
                timeout: Some(0),
                ..req()
            },
            host(),
            "timeout 0",
        );
        refused(
            &CreateSandbox {
                disk: Some(ByteSize(1 << 20)),
                ..req()
            },
            host(),
            "disk",
        );
        refused(
            &CreateSandbox {
                disk: Some(ByteSize(1 << 30)),
                ..req()
            },
            no_pool,
            "no disk quotas",
        );
        refused(
            &CreateSandbox {
                on_idle: Some(warren_types::api::IdleAction::Stop),
                ..req()
            },
            host(),
            "on_idle needs",
        );
    }

    #[test]
    fn names_labels_and_environment_are_bounded() {
        refused(
            &CreateSandbox {
                task: Some("a b".into()),
                ..req()
            },
            host(),
            "task",
        );
        refused(
            &CreateSandbox {
                task: Some("x".repeat(129)),
                ..req()
            },
            host(),
            "task",
        );
        let many: BTreeMap<String, String> = (0..65)
            .map(|i| (format!("k{i}"), "v".to_string()))
            .collect();
        refused(
            &CreateSandbox {
                labels: many,
                ..req()
            },
            host(),
            "labels",
        );
        let long = [("k".to_string(), "v".repeat(257))].into();
        refused(
            &CreateSandbox {
                labels: long,
                ..req()
            },
            host(),
            "256 bytes",
        );
        for (k, v, word) in [
            ("1A", "x", "not valid"),
            ("A-B", "x", "not valid"),
            ("A", "x\0y", "NUL"),
        ] {
            let env = [(k.to_string(), v.to_string())].into();
            match check_env(&env) {
                Err(NodeError::Invalid(m)) => assert!(m.contains(word), "{m}"),
                other => panic!("{k}={v:?}: {other:?}"),
            }
        }
        let big = [("A".to_string(), "x".repeat(40 << 10))].into();
        assert!(check_env(&big).is_err());
        let ok = [("PATH_2".to_string(), "/bin".to_string())].into();
        assert!(check_env(&ok).is_ok());
    }
}
