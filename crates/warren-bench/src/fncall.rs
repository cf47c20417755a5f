//! `warren-bench fncall [N]`: function calls through `warren up`'s REST API — calls/s and
//! latency of a trivial program per language, at concurrency 1 and more — beside, in the same
//! run, a bare namespaced spawn of the same program (`unshare --fork --pid --mount --ipc`, no
//! Warren at all: the floor) and the same work done with one fresh container sandbox per call
//! (create, exec, kill).

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use warren_sdk::{Client, CreateSandbox, FnCallRequest, FnCallStatus};

use crate::warren_rest::{CGROUP_PARENT, WarrenUp, wait_healthy};

fn pct(v: &mut [f64], p: f64) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(|a, b| a.total_cmp(b));
    v[((v.len() as f64 - 1.0) * p).round() as usize]
}

/// One measured row.
struct Row {
    what: String,
    conc: usize,
    n: usize,
    errors: usize,
    per_s: f64,
    p50: f64,
    p99: f64,
}

fn line(r: &Row) -> String {
    format!(
        "| {} | {} | {} | {:.0} | {:.2} | {:.2} | {} |\n",
        r.what, r.conc, r.n, r.per_s, r.p50, r.p99, r.errors
    )
}

/// Runs `op` `n` times, `conc` at a time; latencies in ms.
async fn drive<F, Fut>(what: &str, n: usize, conc: usize, op: F) -> Row
where
    F: Fn() -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = bool> + Send,
{
    let op = Arc::new(op);
    let next = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let t0 = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..conc {
        let (op, next) = (op.clone(), next.clone());
        tasks.push(tokio::spawn(async move {
            let mut lat = Vec::new();
            let mut errors = 0;
            while next.fetch_add(1, std::sync::atomic::Ordering::Relaxed) < n {
                let t = Instant::now();
                if op().await {
                    lat.push(t.elapsed().as_secs_f64() * 1e3);
                } else {
                    errors += 1;
                }
            }
            (lat, errors)
        }));
    }
    let mut lat = Vec::new();
    let mut errors = 0;
    for t in tasks {
        if let Ok((l, e)) = t.await {
            lat.extend(l);
            errors += e;
        }
    }
    let wall = t0.elapsed().as_secs_f64();
    Row {
        what: what.into(),
        conc,
        n,
        errors,
        per_s: lat.len() as f64 / wall,
        p50: pct(&mut lat, 0.5),
        p99: pct(&mut lat, 0.99),
    }
}

/// A bare namespaced spawn: `unshare` makes PID, mount and IPC namespaces and runs the program
/// (what a call's step needs at the least, without Warren).
fn bare(argv: &[&str]) -> bool {
    std::process::Command::new("unshare")
        .args(["--fork", "--pid", "--mount", "--ipc", "--"])
        .args(argv)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// Runs the benchmark; returns its Markdown.
pub async fn run(exe_dir: &Path, n: usize) -> anyhow::Result<String> {
    crate::host::preflight_cgroup_parent(CGROUP_PARENT)?;
    let work = tempfile::Builder::new()
        .prefix("warren-bench-fncall.")
        .tempdir()?;
    let (mut up, url, data) = WarrenUp::start(exe_dir, work.path())?;
    let r = measure(&mut up, &url, &data, n, work.path()).await;
    let clean = up.stop();
    let left = crate::host::remove_cgroup_parent(CGROUP_PARENT, !clean);
    let mut out = match r {
        Ok(s) => s,
        Err(e) => anyhow::bail!("{e:#}; warren up's log ends: {}", up.log_tail(10)),
    };
    for p in left {
        out.push_str(&format!("\nNote: cgroup left behind: {p}\n"));
    }
    Ok(out)
}

async fn measure(
    up: &mut WarrenUp,
    url: &str,
    data: &Path,
    n: usize,
    work: &Path,
) -> anyhow::Result<String> {
    let probe = Client::new(url, None)?;
    wait_healthy(&probe, up).await?;
    let key = std::fs::read_to_string(data.join("admin.key"))?;
    let client = Client::new(url, Some(key.trim()))?;
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    let mut out = format!(
        "## Function calls\n\n\
         A trivial program per call through `warren up`'s REST API (client on the same \
         machine, {cpus} CPUs), {n} calls per row after a warm-up; latencies in ms. The peers, \
         in the same run: a bare namespaced spawn of the same program (`unshare --fork --pid \
         --mount --ipc`, no Warren: the floor), and one fresh container sandbox per call \
         (create, exec, kill through the same API).\n\n\
         | workload | concurrency | calls | calls/s | p50 ms | p99 ms | errors |\n\
         |---|---|---|---|---|---|---|\n"
    );
    // The C program is compiled once, here, so that its bare spawn runs the same binary.
    let c_src = work.join("t.c");
    std::fs::write(&c_src, "int main(void){return 0;}")?;
    let c_bin = work.join("t");
    let cc = std::process::Command::new("gcc")
        .arg("-O2")
        .arg("-o")
        .arg(&c_bin)
        .arg(&c_src)
        .status()?;
    anyhow::ensure!(cc.success(), "gcc failed");
    let c_bin_s = c_bin.display().to_string();
    for (what, argv) in [
        ("bare spawn: bash -c true", vec!["bash", "-c", "true"]),
        ("bare spawn: C binary", vec![c_bin_s.as_str()]),
        (
            "bare spawn: /usr/bin/python3 -c pass",
            vec!["/usr/bin/python3", "-c", "pass"],
        ),
    ] {
        let argv: Vec<String> = argv.iter().map(|s| s.to_string()).collect();
        for _ in 0..5 {
            let a: Vec<&str> = argv.iter().map(String::as_str).collect();
            bare(&a);
        }
        let argv = Arc::new(argv);
        // At 1 (its latency) and at 2 per CPU (what the machine can do at all).
        for conc in [1, 2 * cpus] {
            let argv = argv.clone();
            let row = drive(what, n.min(500), conc, move || {
                let argv = argv.clone();
                async move {
                    tokio::task::spawn_blocking(move || {
                        let a: Vec<&str> = argv.iter().map(String::as_str).collect();
                        bare(&a)
                    })
                    .await
                    .unwrap_or(false)
                }
            })
            .await;
            out.push_str(&line(&row));
        }
    }
    let calls: [(&str, &str, &str); 3] = [
        ("fncall: bash `true`", "bash", "true"),
        ("fncall: python `pass`", "python", "pass"),
        (
            "fncall: C, compiled and run",
            "c",
            "int main(void){return 0;}",
        ),
    ];
    for (what, lang, code) in calls {
        let req = Arc::new(FnCallRequest {
            language: lang.into(),
            code: code.into(),
            ..Default::default()
        });
        let c = client.clone();
        let once = {
            let (c, req) = (c.clone(), req.clone());
            move || {
                let (c, req) = (c.clone(), req.clone());
                async move { matches!(c.fncall(&req).await, Ok(r) if r.status == FnCallStatus::Ok) }
            }
        };
        for _ in 0..10 {
            once().await;
        }
        let count = if lang == "c" { n.min(200) } else { n };
        for conc in [1, 2 * cpus, 8 * cpus] {
            let row = drive(what, count, conc, once.clone()).await;
            out.push_str(&line(&row));
        }
    }
    // A judge's load: one C program compiled once and run over many cases (one request
    // of 64 cases at a time; the row counts cases).
    let batch = Arc::new(warren_types::fncall::FnCallBatchRequest {
        language: "c".into(),
        code: "#include <stdio.h>\nint main(void){int a;if(scanf(\"%d\",&a)!=1)return 1;\
               printf(\"%d\\n\",2*a);return 0;}"
            .into(),
        cases: (0..64)
            .map(|i| warren_types::fncall::TestCase {
                stdin: format!("{i}\n"),
                expected: Some(format!("{}\n", 2 * i)),
            })
            .collect(),
        ..Default::default()
    });
    let batch_once = {
        let (c, req) = (client.clone(), batch.clone());
        move || {
            let (c, req) = (c.clone(), req.clone());
            async move { matches!(c.fncall_batch(&req).await, Ok(r) if r.passed == 64) }
        }
    };
    for _ in 0..3 {
        batch_once().await;
    }
    for conc in [1, 2 * cpus] {
        let rounds = (n / 64).clamp(4, 40);
        let mut row = drive(
            "fncall batch: C compiled once, 64 cases a request (per case)",
            rounds,
            conc,
            batch_once.clone(),
        )
        .await;
        // Cases, not requests: the rate and the count scale by 64; latencies are a request's.
        row.per_s *= 64.0;
        row.n *= 64;
        row.errors *= 64;
        out.push_str(&line(&row));
    }
    // One fresh container sandbox per call.
    let sandbox_per_call = {
        let c = client.clone();
        move || {
            let c = c.clone();
            async move {
                let Ok(sb) = c
                    .create(&CreateSandbox {
                        image: "host".into(),
                        network: Some(warren_sdk::NetworkPolicy::none()),
                        ..Default::default()
                    })
                    .await
                else {
                    return false;
                };
                let ok = sb
                    .exec(&warren_sdk::argv(["bash", "-c", "true"]))
                    .await
                    .is_ok_and(|r| r.status.exit_code == 0);
                ok & sb.kill().await.is_ok()
            }
        }
    };
    for _ in 0..5 {
        sandbox_per_call().await;
    }
    for conc in [1, 2 * cpus, 8 * cpus] {
        let row = drive(
            "sandbox per call: create, exec `bash -c true`, kill",
            n.min(300),
            conc,
            sandbox_per_call.clone(),
        )
        .await;
        out.push_str(&line(&row));
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    Ok(out)
}
