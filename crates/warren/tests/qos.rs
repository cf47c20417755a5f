//! QoS: requests and limits, classes applied to cgroups and processes, admission by request
//! and by measured pressure, reclaim on pause, the create queue, and the support probe.

mod common;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::Platform;
use warren_sdk::{ByteSize, CreateSandbox, ErrorCode, Fault, QosClass, TaskAction, shell};

fn host() -> CreateSandbox {
    CreateSandbox {
        image: "host".into(),
        ..Default::default()
    }
}

/// The cgroup-v1 hierarchy directory of `controller` for sandbox `id`, or the v2 directory.
fn cgroup_dir(p: &Platform, controller: &str, id: &str) -> PathBuf {
    let v1 = Path::new("/sys/fs/cgroup")
        .join(controller)
        .join(&p.cgroup_parent)
        .join(id);
    if v1.exists() {
        v1
    } else {
        Path::new("/sys/fs/cgroup").join(&p.cgroup_parent).join(id)
    }
}

fn read(p: &Path) -> String {
    std::fs::read_to_string(p)
        .unwrap_or_else(|e| panic!("{}: {e}", p.display()))
        .trim()
        .to_string()
}

fn is_v1() -> bool {
    Path::new("/sys/fs/cgroup/cpu/cpu.shares").exists()
}

/// The scheduling policy a command in the sandbox runs under (0 SCHED_OTHER, 5 SCHED_IDLE).
async fn policy(sb: &warren_sdk::Sandbox) -> String {
    let r = sb
        .exec(&shell(
            "python3 -c 'import os; print(os.sched_getscheduler(0))'",
        ))
        .await
        .unwrap();
    assert_eq!(r.status.exit_code, 0, "{r:?}");
    r.stdout.trim().to_string()
}

fn meminfo(field: &str) -> u64 {
    std::fs::read_to_string("/proc/meminfo")
        .unwrap()
        .lines()
        .find(|l| l.starts_with(field))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse::<u64>().ok())
        .unwrap()
        * 1024
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn classes_reach_the_cgroup_and_the_probe_tells_the_truth() {
    require_root!();
    let p = Platform::start();
    let c = p.client();
    let nodes = c.nodes().await.unwrap();
    let n = &nodes[0];
    let q = n.qos.as_ref().expect("the node reports its QoS support");
    // The probe says what the kernel has.
    let parent_cpu = if is_v1() {
        Path::new("/sys/fs/cgroup/cpu").join(&p.cgroup_parent)
    } else {
        Path::new("/sys/fs/cgroup").join(&p.cgroup_parent)
    };
    assert_eq!(q.cpu_idle, parent_cpu.join("cpu.idle").exists(), "{q:?}");
    assert_eq!(q.sched_idle_fallback, !q.cpu_idle);
    let smt = std::fs::read_to_string("/sys/devices/system/cpu/smt/control")
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| "unknown".into());
    assert_eq!(q.smt, smt);
    assert_eq!(q.psi, Path::new("/proc/pressure/memory").exists());
    // Cookies only where SMT is on: without it no two tasks share a core.
    assert!(!q.core_scheduling_used || (q.core_scheduling && q.smt == "on"));
    assert_eq!(q.swap_total, meminfo("SwapTotal:"));
    assert!(n.cpu_cores >= 1 && n.cpu_allocatable == u64::from(n.cpu_cores) * 8000);

    let ls = c
        .create(&CreateSandbox {
            cpu: Some(500),
            cpu_limit: Some(1000),
            memory: Some(ByteSize(128 << 20)),
            memory_limit: Some(ByteSize(256 << 20)),
            qos: Some(QosClass::Ls),
            ..host()
        })
        .await
        .unwrap();
    let be = c.create(&host()).await.unwrap();
    let info = be.info().await.unwrap();
    assert_eq!(info.resources.qos, QosClass::Be);
    assert_eq!(info.resources.cpu, 10);
    assert_eq!(info.resources.memory, ByteSize(64 << 20));
    assert_eq!(info.resources.memory_limit, ByteSize(2 << 30));
    // Requests count: the node's report sums them.
    let n = &c.nodes().await.unwrap()[0];
    assert_eq!(n.cpu_requested, 510);
    assert_eq!(n.memory_reserved, ByteSize((128 + 64) << 20));

    let (ls_id, be_id) = (ls.id().to_string(), be.id().to_string());
    if is_v1() {
        let cpu = |id: &str, f: &str| read(&cgroup_dir(&p, "cpu", id).join(f));
        let mem = |id: &str, f: &str| read(&cgroup_dir(&p, "memory", id).join(f));
        assert_eq!(cpu(&ls_id, "cpu.shares"), "512");
        // The least weight (an idle cgroup reads back as 3, the kernel's idle weight).
        assert!(["2", "3"].contains(&cpu(&be_id, "cpu.shares").as_str()));
        assert_eq!(cpu(&ls_id, "cpu.cfs_quota_us"), "100000");
        assert_eq!(
            mem(&ls_id, "memory.limit_in_bytes"),
            (256u64 << 20).to_string()
        );
        assert_eq!(
            mem(&ls_id, "memory.soft_limit_in_bytes"),
            (128u64 << 20).to_string()
        );
        if q.cpu_idle {
            assert_eq!(cpu(&ls_id, "cpu.idle"), "0");
            assert_eq!(cpu(&be_id, "cpu.idle"), "1");
        }
    } else {
        let f = |id: &str, f: &str| read(&cgroup_dir(&p, "", id).join(f));
        assert_eq!(f(&ls_id, "cpu.max"), "100000 100000");
        assert_eq!(f(&ls_id, "memory.max"), (256u64 << 20).to_string());
        assert_eq!(f(&ls_id, "memory.low"), (128u64 << 20).to_string());
        assert_eq!(f(&be_id, "cpu.weight"), "1");
        if q.cpu_idle {
            assert_eq!(f(&be_id, "cpu.idle"), "1");
        }
    }
    // With the cgroup idle, the processes themselves keep the normal policy.
    if q.cpu_idle {
        assert_eq!(policy(&be).await, "0");
    }
    assert_eq!(policy(&ls).await, "0");
    ls.kill().await.unwrap();
    be.kill().await.unwrap();
    p.assert_clean();
}

/// Without `cpu.idle` (here: turned off), a best-effort sandbox's commands run under
/// `SCHED_IDLE`, and an agent cannot take itself back out of it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_cpu_idle_best_effort_commands_run_sched_idle() {
    require_root!();
    let p = Platform::start_with(Some("[node]\nqos_cpu_idle = false\n"));
    let c = p.client();
    let q = c.nodes().await.unwrap()[0].qos.clone().unwrap();
    assert!(!q.cpu_idle && q.sched_idle_fallback, "{q:?}");
    let be = c.create(&host()).await.unwrap();
    let ls = c
        .create(&CreateSandbox {
            cpu: Some(100),
            qos: Some(QosClass::Ls),
            ..host()
        })
        .await
        .unwrap();
    assert_eq!(policy(&be).await, "5");
    assert_eq!(policy(&ls).await, "0");
    // Only the processes: the cgroup is not made idle as well where the knob exists.
    let idle = cgroup_dir(&p, "cpu", be.id().as_str()).join("cpu.idle");
    if idle.exists() {
        assert_eq!(read(&idle), "0");
    }
    // The agent's way back out is refused (RLIMIT_NICE is 0), as root and as the user.
    for user in ["root", "user"] {
        let r = be
            .exec(&warren_sdk::ExecRequest {
                user: Some(user.into()),
                ..shell(
                    "python3 -c 'import os; os.sched_setscheduler(0, os.SCHED_OTHER, \
                     os.sched_param(0))' 2>&1; python3 -c 'import os; \
                     print(os.sched_getscheduler(0))'",
                )
            })
            .await
            .unwrap();
        assert!(
            r.stdout.contains("PermissionError") && r.stdout.trim_end().ends_with('5'),
            "{user}: {r:?}"
        );
    }
    be.kill().await.unwrap();
    ls.kill().await.unwrap();
    p.assert_clean();
}

/// Requests are admitted up to physical memory (or cores) × their overcommit factor; past it,
/// a 429 names the resource and the numbers, and is the infrastructure's fault.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admission_counts_requests_up_to_the_factors() {
    require_root!();
    let total = meminfo("MemTotal:");
    // Room for 256Mi + 128Mi of requests, not for 2 × 256Mi.
    let factor = (448u64 << 20) as f64 / total as f64;
    let p = Platform::start_with(Some(&format!(
        "[node]\nmemory_overcommit = {factor}\ncpu_overcommit = 0.5\n"
    )));
    let c = p.client();
    let big = CreateSandbox {
        memory: Some(ByteSize(256 << 20)),
        ..host()
    };
    let a = c.create(&big).await.unwrap();
    let e = c.create(&big).await.unwrap_err();
    assert_eq!(e.code(), Some(ErrorCode::Capacity), "{e}");
    assert_eq!(e.fault(), Fault::Infrastructure);
    assert!(e.is_retryable());
    let m = e.to_string();
    assert!(m.contains("memory requests") && m.contains("256Mi"), "{m}");
    // A smaller request still fits; the limit is not what counts.
    let b = c
        .create(&CreateSandbox {
            memory: Some(ByteSize(128 << 20)),
            memory_limit: Some(ByteSize(4 << 30).min(ByteSize(total))),
            ..host()
        })
        .await
        .unwrap();
    // CPU: cores × 0.5 in all; 20m is taken.
    let cores = c.nodes().await.unwrap()[0].cpu_cores;
    let most = cores * 500 - 20;
    let cpu = |m: u32| CreateSandbox {
        cpu: Some(m),
        memory: Some(ByteSize(0)),
        ..host()
    };
    let d = c.create(&cpu(most)).await.unwrap();
    let e = c.create(&cpu(1)).await.unwrap_err();
    let m = e.to_string();
    assert!(
        m.contains("cpu requests") && m.contains("cpu_overcommit 0.5"),
        "{m}"
    );
    // The wire body carries the fault; a bad request is the request's.
    let r = p
        .http()
        .post(format!("{}/v1/sandboxes", p.url))
        .bearer_auth(&p.key)
        .json(&serde_json::json!({"image": "host", "cpu": 1}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 429);
    let body: serde_json::Value = r.json().await.unwrap();
    assert_eq!(body["error"]["fault"], "infrastructure", "{body}");
    let r = p
        .http()
        .post(format!("{}/v1/sandboxes", p.url))
        .bearer_auth(&p.key)
        .json(&serde_json::json!({"image": "host", "memory": "1Gi", "memory_limit": "512Mi"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 400);
    let body: serde_json::Value = r.json().await.unwrap();
    assert_eq!(body["error"]["fault"], "request", "{body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("more than memory_limit")
    );
    for sb in [a, b, d] {
        sb.kill().await.unwrap();
    }
    p.assert_clean();
}

/// A node whose memory is really in use refuses, whatever its requests' sum, and admits again
/// once the memory is free.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admission_refuses_under_measured_memory_pressure() {
    require_root!();
    // The node keeps all but 512Mi of what is available now free; a sandbox then uses 768Mi.
    let keep = meminfo("MemAvailable:") - (512 << 20);
    let p = Platform::start_with(Some(&format!("[node]\nmin_free_memory = {keep}\n")));
    let c = p.client();
    let hog = c
        .create(&CreateSandbox {
            memory: Some(ByteSize(0)),
            ..host()
        })
        .await
        .unwrap();
    let r = hog
        .exec(&shell(
            "python3 -c 'import time; b = b\"x\" * (768 << 20); time.sleep(120)' \
             >/dev/null 2>&1 & echo started",
        ))
        .await
        .unwrap();
    assert_eq!(r.stdout.trim(), "started");
    let deadline = Instant::now() + Duration::from_secs(30);
    let refusal = loop {
        match c.create(&host()).await {
            Ok(sb) => sb.kill().await.unwrap(),
            Err(e) => break e,
        }
        assert!(
            Instant::now() < deadline,
            "never refused; MemAvailable {}",
            meminfo("MemAvailable:")
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let m = refusal.to_string();
    assert_eq!(refusal.code(), Some(ErrorCode::Capacity), "{m}");
    // (It names the memory charged to sandboxes too once the node has sampled it.)
    assert!(
        m.contains("measured memory") && m.contains("available"),
        "{m}"
    );
    // The node's report shows the memory charged to its sandboxes (sampled every second).
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let n = &c.nodes().await.unwrap()[0];
        if n.memory_used.bytes() >= 700 << 20 {
            break;
        }
        assert!(Instant::now() < deadline, "{n:?}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    hog.kill().await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    let sb = loop {
        match c.create(&host()).await {
            Ok(sb) => break sb,
            Err(e) => assert!(Instant::now() < deadline, "still refused: {e}"),
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    sb.kill().await.unwrap();
    p.assert_clean();
}

/// Pausing gives back page cache (no swap needed), says how much, and resume puts the limit
/// back: the sandbox then runs as before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pause_reclaims_page_cache_and_resume_restores_the_limit() {
    require_root!();
    let p = Platform::start();
    let c = p.client();
    let req = CreateSandbox {
        task: Some("reclaim".into()),
        memory_limit: Some(ByteSize(512 << 20)),
        ..host()
    };
    let sb = c.create(&req).await.unwrap();
    let r = sb
        .exec(&shell(
            "cd $HOME && head -c 67108864 /dev/urandom > f && sync && cat f > /dev/null && \
             md5sum f",
        ))
        .await
        .unwrap();
    assert_eq!(r.status.exit_code, 0, "{r:?}");
    let sum = r.stdout.clone();
    let before = sb.metrics().await.unwrap();
    assert!(before.memory_cache >= 48 << 20, "{before:?}");
    let t = c.task_action("reclaim", TaskAction::Pause).await.unwrap();
    assert_eq!(t.succeeded, 1, "{t:?}");
    let freed = t.memory_freed.expect("a pause says what it freed");
    assert!(freed >= 32 << 20, "freed {freed}; before {before:?}");
    let mem = cgroup_dir(&p, "memory", sb.id().as_str());
    let usage_file = if is_v1() {
        "memory.usage_in_bytes"
    } else {
        "memory.current"
    };
    let usage: u64 = read(&mem.join(usage_file)).parse().unwrap();
    assert!(
        usage + (32 << 20) <= before.memory_used,
        "{usage} vs {before:?}"
    );
    let t = c.task_action("reclaim", TaskAction::Resume).await.unwrap();
    assert_eq!((t.succeeded, t.memory_freed), (1, None));
    let limit_file = if is_v1() {
        "memory.limit_in_bytes"
    } else {
        "memory.max"
    };
    assert_eq!(read(&mem.join(limit_file)), (512u64 << 20).to_string());
    let r = sb.exec(&shell("cd $HOME && md5sum f")).await.unwrap();
    assert_eq!(r.stdout, sum);
    // A single sandbox's pause reclaims too; transparent resume restores the limit.
    sb.pause().await.unwrap();
    let paused: u64 = read(&mem.join(usage_file)).parse().unwrap();
    assert!(paused < 48 << 20, "{paused}");
    let r = sb.exec(&shell("cd $HOME && md5sum f")).await.unwrap();
    assert_eq!(r.stdout, sum);
    assert_eq!(read(&mem.join(limit_file)), (512u64 << 20).to_string());
    sb.kill().await.unwrap();
    p.assert_clean();
}

/// A zram swap device made for the test, removed when dropped.
struct Zram {
    id: String,
}

impl Zram {
    fn make(size: &str) -> Result<Zram, String> {
        let id = std::fs::read_to_string("/sys/class/zram-control/hot_add")
            .map_err(|e| format!("no zram device to add ({e})"))?
            .trim()
            .to_string();
        let z = Zram { id };
        std::fs::write(format!("/sys/block/zram{}/disksize", z.id), size)
            .map_err(|e| format!("zram disksize: {e}"))?;
        let dev = format!("/dev/zram{}", z.id);
        for cmd in [vec!["mkswap", &dev], vec!["swapon", "-p", "100", &dev]] {
            let ok = std::process::Command::new(cmd[0])
                .args(&cmd[1..])
                .output()
                .map_err(|e| format!("{}: {e}", cmd[0]))?;
            if !ok.status.success() {
                return Err(format!(
                    "{cmd:?}: {}",
                    String::from_utf8_lossy(&ok.stderr).trim()
                ));
            }
        }
        Ok(z)
    }
}

impl Drop for Zram {
    fn drop(&mut self) {
        let dev = format!("/dev/zram{}", self.id);
        let _ = std::process::Command::new("swapoff").arg(&dev).status();
        let _ = std::fs::write(format!("/sys/block/zram{}/reset", self.id), "1");
        let _ = std::fs::write("/sys/class/zram-control/hot_remove", &self.id);
    }
}

/// With swap (a zram device made for the test), pausing pushes a sandbox's anonymous memory
/// out; resuming reads it back without the process touching it; the process is whole.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_swap_pause_reclaims_anonymous_memory() {
    require_root!();
    let _zram = if meminfo("SwapTotal:") == 0 {
        match Zram::make("1G") {
            Ok(z) => Some(z),
            Err(why) => {
                eprintln!("SKIP with_swap_pause_reclaims_anonymous_memory: no swap and {why}");
                return;
            }
        }
    } else {
        None
    };
    let p = Platform::start();
    let c = p.client();
    let sb = c
        .create(&CreateSandbox {
            task: Some("swap".into()),
            memory_limit: Some(ByteSize(1 << 30)),
            ..host()
        })
        .await
        .unwrap();
    // 128Mi of anonymous memory that checks itself when told to.
    let r = sb
        .exec(&shell(
            "python3 -c '
import hashlib, os, signal, time
b = bytearray(os.urandom(1 << 20) * 128)
d = hashlib.md5(b).hexdigest()
def check(*_):
    open(\"/tmp/check\", \"w\").write(\"ok\" if hashlib.md5(b).hexdigest() == d else \"bad\")
signal.signal(signal.SIGUSR1, check)
open(\"/tmp/ready\", \"w\").write(str(os.getpid()))
while True: time.sleep(1)
' >/dev/null 2>&1 & while [ ! -s /tmp/ready ]; do sleep 0.1; done; cat /tmp/ready",
        ))
        .await
        .unwrap();
    let pid = r.stdout.trim().to_string();
    assert!(!pid.is_empty(), "{r:?}");
    let before = sb.metrics().await.unwrap();
    assert!(before.memory_used >= 128 << 20, "{before:?}");
    let t = c.task_action("swap", TaskAction::Pause).await.unwrap();
    // The answer says what was freed by then; the reclaim goes on after it, until the memory
    // is out and stays out.
    let freed = t.memory_freed.unwrap();
    assert!(
        freed > 0 && freed <= before.memory_used,
        "freed {freed} of {before:?}"
    );
    let mut low = before.memory_used;
    common::poll_until(
        Duration::from_secs(60),
        "the reclaim pushes the memory out",
        async || {
            let was = low;
            tokio::time::sleep(Duration::from_millis(300)).await;
            low = sb.metrics().await.map_err(|e| e.to_string())?.memory_used;
            if low + (96 << 20) <= before.memory_used && was.abs_diff(low) < 1 << 20 {
                Ok(())
            } else {
                Err(format!("{low} of {before:?}"))
            }
        },
    )
    .await;
    c.task_action("swap", TaskAction::Resume).await.unwrap();
    // The resume reads the swapped-out memory back in the background (prefetch_on_resume),
    // though the process, asleep, touches none of it.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    let mut now = low;
    while now < low + (96 << 20) && std::time::Instant::now() < deadline {
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
        now = sb.metrics().await.unwrap().memory_used;
    }
    assert!(
        now >= low + (96 << 20),
        "prefetch after resume brought back {} of {freed} bytes",
        now.saturating_sub(low)
    );
    let r = sb
        .exec(&shell(format!(
            "kill -USR1 {pid}; while [ ! -s /tmp/check ]; do sleep 0.1; done; cat /tmp/check"
        )))
        .await
        .unwrap();
    assert_eq!(r.stdout, "ok", "{r:?}");
    sb.kill().await.unwrap();
    p.assert_clean();
}

/// Creates beyond what the node starts at once wait in a bounded queue; past it they are
/// refused at once with a retry hint, never left hanging or failed with a 500.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_create_queue_refuses_with_retry_after() {
    require_root!();
    let p = Platform::start_with(Some(
        "[node]\nwarm_pool = 0\nmax_concurrent_creates = 1\ncreate_queue = 0\n",
    ));
    let c = p.client();
    let req = host();
    let creates = (0..24).map(|_| c.create(&req));
    let results = futures_util::future::join_all(creates).await;
    let mut made = Vec::new();
    let mut refused = 0;
    for r in results {
        match r {
            Ok(sb) => made.push(sb),
            Err(e) => {
                assert_eq!(e.code(), Some(ErrorCode::Capacity), "{e}");
                assert!(e.to_string().contains("create_queue"), "{e}");
                assert_eq!(e.fault(), Fault::Infrastructure);
                refused += 1;
            }
        }
    }
    assert!(!made.is_empty() && refused > 0, "{} made", made.len());
    for sb in made {
        sb.kill().await.unwrap();
    }
    p.assert_clean();
}
