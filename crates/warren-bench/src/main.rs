//! `warren-bench`: Warren against bubblewrap and runc on this machine, in one run.
//!
//! Run as root after `cargo build --release --workspace` (it starts `target/release/warren up`
//! and uses `target/release/warren-guest`, both beside its own executable):
//!
//! ```text
//! target/release/warren-bench [--quick]
//! ```
//!
//! It prints Markdown tables of medians and percentiles, with the project's targets beside
//! them. It reports; it never fails because a number is bad. Every sandbox, container,
//! process, cgroup and temp dir it makes is removed before it exits.

mod cluster;
mod containment;
mod fncall;
mod host;
mod iam;
mod names;
mod network;
mod peers;
mod qos;
mod report;
mod rl;
mod simnode;
mod soak;
mod stats;
mod warren_lib;
mod warren_rest;

use std::path::PathBuf;

use stats::CycleStats;

/// Sizes of every measurement.
#[derive(Debug, Clone)]
pub struct Plan {
    pub quick: bool,
    /// Cycles at concurrency 1.
    pub n_c1: usize,
    /// Cycles at concurrency `conc`.
    pub n_cn: usize,
    pub conc: usize,
    /// Exec round trips on one warm sandbox.
    pub n_exec: usize,
    /// Idle Warren sandboxes for the memory measurement, created `idle_conc` at a time.
    pub n_idle: usize,
    pub idle_conc: usize,
    /// Idle bwrap instances.
    pub n_peer_idle: usize,
    /// Unrecorded cycles before each measured phase.
    pub warmup: usize,
}

impl Plan {
    fn new(quick: bool) -> Plan {
        if quick {
            Plan {
                quick,
                n_c1: 30,
                n_cn: 64,
                conc: 32,
                n_exec: 100,
                n_idle: 100,
                idle_conc: 32,
                n_peer_idle: 100,
                warmup: 3,
            }
        } else {
            Plan {
                quick,
                n_c1: 200,
                n_cn: 320,
                conc: 32,
                n_exec: 500,
                n_idle: 500,
                idle_conc: 32,
                n_peer_idle: 100,
                warmup: 5,
            }
        }
    }
}

/// One progress line about a phase.
pub fn cycle_result(r: &Result<CycleStats, String>) -> String {
    match r {
        Ok(s) => format!(
            "{}; cycle p50/p99 {}; {:.1}/s; own CPU {} per cycle; host CPU {}",
            s.count(),
            s.cycle.p50_p99(),
            s.creates_per_sec(),
            s.cpu_own_per_cycle().map(stats::ms).unwrap_or_default(),
            s.cpu()
                .map(|(per, share)| format!(
                    "{} per cycle, {:.0} % busy",
                    stats::ms(per),
                    share * 100.0
                ))
                .unwrap_or_default()
        ),
        Err(e) => format!("failed: {}", stats::short(e, 300)),
    }
}

const USAGE: &str = "\
usage: warren-bench [--quick]
       warren-bench network [--quick]
       warren-bench network-part warm|cold|names [--quick]
       warren-bench soak [--cycles N] [--every N] [--concurrency N]
       warren-bench containment [N]
       warren-bench qos [STEPS]
       warren-bench density [N]
       warren-bench reclaim [N]
       warren-bench prefetch [N]
       warren-bench cluster [SANDBOXES]
       warren-bench iam [N]
       warren-bench fncall [N]
       warren-bench rl [--episodes N] [--quick]

Benchmarks Warren (through `warren up`'s REST API, and its node library in-process) against
bubblewrap and runc on this machine and prints Markdown tables. Run as root, after
`cargo build --release --workspace`: it starts the `warren` and `warren-guest` binaries that
sit beside its own executable.

  --quick   fewer iterations (a smoke run of every measurement)

`soak` runs create -> exec -> destroy cycles (default 20000, 8 at a time) and prints, at the
start, every --every cycles (default 5000) and at the end, what the host holds: mounts,
cgroups (Warren's and the kernel's count, dead ones included), network namespaces,
processes, the daemon's descriptors and RSS, SUnreclaim and MemAvailable.

`qos` reproduces the DSec paper's interference experiment (STEPS per run, default 300):
a latency-sensitive sandbox's step latency beside best-effort load at 0, 50 and 100 %,
unprotected, with SCHED_IDLE and with cpu.idle. `density` creates idle sandboxes up to N
(default 20000) and reports creates/s, exec latency and memory at every 2000. `reclaim`
pauses a task of N sandboxes (default 500) holding 20 MiB each, without swap and with a zram
device made for the run. `prefetch` pauses N sandboxes (default 200) whose processes hold
20 MiB each to swap and resumes them, with prefetch_on_resume off and on.

`cluster` runs the real control plane (`warren server`) against 160 simulated nodes in this
process (SANDBOXES creates, default 100000): creates/s through one and two replicas,
placement latency, imbalance, a 32K burst and its task pause, a replica restarted to a
complete view, and k = 1, 2, 3 and least-loaded-of-all with and without the overlay.

`iam` measures what authorisation adds to a request (N times, default 100000): a key's
principal from the cache and the create path's check, against the key check it replaced, and
the uncached path, on SQLite and PostgreSQL.

`fncall` measures function calls (N per row, default 2000): calls/s and latency of a trivial
program in bash, Python and C at concurrency 1 and more, beside a bare namespaced spawn of the
same program and one fresh container sandbox per call, in the same run.

`rl` runs a training step's load on one node (N episodes per rollout, default 1000; 200 with
--quick): a rollout of episodes (create, write, 5 execs, read, kill) with a reward call per
episode through the unmodified `sandbox-fusion` client and a task pause in the middle, beside
the same rollout without reward calls; then a 200-call burst through that client beside the
node's plain rate at 4 calls in flight. The driver is sdk/python/bench/rl.py, run in a virtual
environment (target/bench-venv, or $WARREN_BENCH_VENV) made and updated with pip first.

`containment` measures what the defences cost (N creates per variant, default 50): create and
exec with and without the disk quota and the system-call filter, and the disk-quota
mechanisms (btrfs subvolume and quota group; an ext4 file system per sandbox).
";

/// Runs this program with `args` in a new network namespace (made here, deleted after), its
/// stdout captured or passed through. Blocking.
fn in_fresh_netns(
    args: &[String],
    capture: bool,
) -> Result<(std::process::ExitStatus, String), String> {
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let name = format!(
        "warren-bench-{}-{}",
        std::process::id(),
        args.get(1).map(String::as_str).unwrap_or("main")
    );
    let ip = |a: &[&str]| {
        std::process::Command::new("ip")
            .args(a)
            .status()
            .is_ok_and(|s| s.success())
    };
    if !ip(&["netns", "add", &name]) || !ip(&["-n", &name, "link", "set", "lo", "up"]) {
        ip(&["netns", "del", &name]);
        return Err("could not make a network namespace (ip netns add)".into());
    }
    let mut cmd = std::process::Command::new("nsenter");
    cmd.arg(format!("--net=/run/netns/{name}"))
        .arg("--")
        .arg(&exe)
        .args(args)
        .env("WARREN_BENCH_NETNS", &name);
    let out = if capture {
        cmd.output()
            .map(|o| (o.status, String::from_utf8_lossy(&o.stdout).into_owned()))
    } else {
        cmd.status().map(|s| (s, String::new()))
    };
    ip(&["netns", "del", &name]);
    out.map_err(|e| format!("nsenter: {e}"))
}

/// Runs this program with `args` in a new network namespace and returns what it printed.
pub fn run_in_fresh_netns(args: &[String]) -> Result<String, String> {
    match in_fresh_netns(args, true)? {
        (status, out) if status.success() => Ok(out),
        (status, _) => Err(format!("exited with {status}")),
    }
}

/// Runs this program again inside a network namespace of its own: the nodes it starts give
/// sandboxes interfaces and a firewall table, which must not land in the machine's own
/// namespace. `None` when already inside one (or not root: then nothing that needs a
/// namespace runs anyway).
fn in_own_netns(args: &[String]) -> Option<std::process::ExitCode> {
    if std::env::var_os("WARREN_BENCH_NETNS").is_some() {
        return None;
    }
    let root = std::fs::read_to_string("/proc/self/status")
        .ok()
        .is_some_and(|s| {
            s.lines()
                .any(|l| l.starts_with("Uid:") && l.split_whitespace().nth(1) == Some("0"))
        });
    if !root {
        return None;
    }
    Some(match in_fresh_netns(args, false) {
        Ok((s, _)) if s.success() => std::process::ExitCode::SUCCESS,
        Ok((s, _)) => std::process::ExitCode::from(s.code().unwrap_or(1).clamp(1, 255) as u8),
        Err(e) => {
            eprintln!("warren-bench: {e}");
            std::process::ExitCode::FAILURE
        }
    })
}

fn main() -> std::process::ExitCode {
    let mut quick = false;
    let args: Vec<String> = std::env::args().skip(1).collect();
    // `rl`'s driver needs its packages, and pip the package index: installed here, before the
    // run moves into a network namespace with no route out.
    if args.first().map(String::as_str) == Some("rl")
        && std::env::var_os("WARREN_BENCH_NETNS").is_none()
    {
        let installed = std::env::current_exe()
            .ok()
            .and_then(|e| e.parent().map(PathBuf::from))
            .ok_or_else(|| anyhow::anyhow!("cannot tell where its own executable is"))
            .and_then(|dir| rl::prepare_venv(&dir));
        if let Err(e) = installed {
            eprintln!("warren-bench rl: {e:#}");
            return std::process::ExitCode::FAILURE;
        }
    }
    if let Some(code) = in_own_netns(&args) {
        return code;
    }
    if args.first().map(String::as_str) == Some("network") {
        print!(
            "{}",
            network::run_parts(args.iter().any(|a| a == "--quick"))
        );
        return std::process::ExitCode::SUCCESS;
    }
    if args.first().map(String::as_str) == Some("network-part") {
        let quick = args.iter().any(|a| a == "--quick");
        return match args.get(1).map(String::as_str) {
            Some("names") => names_main(quick),
            Some("cold") => network_main(quick, false),
            _ => network_main(quick, true),
        };
    }
    if args.first().map(String::as_str) == Some("soak") {
        return soak_main(&args[1..]);
    }
    if let Some(which @ ("qos" | "density" | "reclaim" | "prefetch")) =
        args.first().map(String::as_str)
    {
        let n = args.get(1).and_then(|v| v.parse::<usize>().ok());
        return qos_main(which, n);
    }
    if args.first().map(String::as_str) == Some("iam") {
        let n = args.get(1).and_then(|v| v.parse().ok()).unwrap_or(100_000);
        let (_, rt) = match exe_dir_and_runtime() {
            Ok(x) => x,
            Err(code) => return code,
        };
        return match rt.block_on(iam::run(n)) {
            Ok(out) => {
                print!("{out}");
                std::process::ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("warren-bench iam: {e:#}");
                std::process::ExitCode::FAILURE
            }
        };
    }
    if args.first().map(String::as_str) == Some("fncall") {
        let n = args.get(1).and_then(|v| v.parse().ok()).unwrap_or(2000);
        let (exe_dir, rt) = match exe_dir_and_runtime() {
            Ok(x) => x,
            Err(code) => return code,
        };
        return match rt.block_on(fncall::run(&exe_dir, n)) {
            Ok(out) => {
                print!("{out}");
                std::process::ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("warren-bench fncall: {e:#}");
                std::process::ExitCode::FAILURE
            }
        };
    }
    if args.first().map(String::as_str) == Some("rl") {
        return rl_main(&args[1..]);
    }
    if args.first().map(String::as_str) == Some("cluster") {
        let n = args.get(1).and_then(|v| v.parse().ok()).unwrap_or(100_000);
        let (exe_dir, rt) = match exe_dir_and_runtime() {
            Ok(x) => x,
            Err(code) => return code,
        };
        return match rt.block_on(cluster::run(&exe_dir, n)) {
            Ok(out) => {
                print!("{out}");
                std::process::ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("warren-bench cluster: {e:#}");
                std::process::ExitCode::FAILURE
            }
        };
    }
    if args.first().map(String::as_str) == Some("containment") {
        let n = args.get(1).and_then(|v| v.parse().ok()).unwrap_or(50);
        return containment_main(n);
    }
    for a in args {
        match a.as_str() {
            "--quick" => quick = true,
            "-h" | "--help" => {
                print!("{USAGE}");
                return std::process::ExitCode::SUCCESS;
            }
            other => {
                eprint!("warren-bench: unknown argument {other:?}\n\n{USAGE}");
                return std::process::ExitCode::from(2);
            }
        }
    }
    let exe_dir: PathBuf = match std::env::current_exe()
        .ok()
        .and_then(|e| e.parent().map(PathBuf::from))
    {
        Some(d) => d,
        None => {
            eprintln!("warren-bench: cannot tell where its own executable is");
            return std::process::ExitCode::FAILURE;
        }
    };
    let root = std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("Uid:"))
                .and_then(|v| v.split_whitespace().nth(1).map(|e| e == "0"))
        })
        .unwrap_or(false);
    if !root {
        eprintln!(
            "warren-bench: not running as root: Warren, runc and the cgroup readings need root, so \
             most measurements will report that they did not run"
        );
    }
    let plan = Plan::new(quick);
    let machine = host::Machine::read();
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("warren-bench: tokio runtime: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    let results = rt.block_on(async {
        let started = std::time::Instant::now();
        let rest = warren_rest::run(&plan, &exe_dir).await;
        if let Err(e) = &rest {
            eprintln!("warren-bench: REST measurements failed: {e}");
        }
        let lib = warren_lib::run(&plan, &exe_dir, false).await;
        if let Err(e) = &lib {
            eprintln!("warren-bench: node library measurements failed: {e}");
        }
        let lib_cold = warren_lib::run(&plan, &exe_dir, true).await;
        if let Err(e) = &lib_cold {
            eprintln!("warren-bench: node library (no warm pool) measurements failed: {e}");
        }
        let plain = peers::plain(&plan).await;
        let plain_exec = peers::plain_exec(&plan).await;
        let bwrap = peers::bwrap(&plan).await;
        let runc = peers::runc(&plan).await;
        if let Err(e) = &runc {
            eprintln!("warren-bench: runc failed: {e}");
        }
        let bwrap_idle = peers::bwrap_idle(plan.n_peer_idle).await;
        report::Results {
            rest,
            lib,
            lib_cold,
            plain,
            plain_exec,
            bwrap,
            runc,
            bwrap_idle,
            took: started.elapsed(),
            loadavg_end: host::Machine::loadavg(),
        }
    });
    // Do not wait for stray blocking tasks (e.g. a stuck guest socket) at exit.
    rt.shutdown_timeout(std::time::Duration::from_secs(2));
    print!("{}", report::render(&plan, &machine, &results));
    print!("{}", network::run_parts(quick));
    std::process::ExitCode::SUCCESS
}

/// Runs one part of `warren-bench network` (`part` gets the plan and the directory of this
/// executable, where the guest binary is) on a runtime of its own and prints what it returns.
fn network_part_main<F, Fut>(quick: bool, part: F) -> std::process::ExitCode
where
    F: FnOnce(Plan, PathBuf) -> Fut,
    Fut: std::future::Future<Output = String>,
{
    let Some(exe_dir) = std::env::current_exe()
        .ok()
        .and_then(|e| e.parent().map(PathBuf::from))
    else {
        eprintln!("warren-bench: cannot tell where its own executable is");
        return std::process::ExitCode::FAILURE;
    };
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("warren-bench: tokio runtime: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    let text = rt.block_on(part(Plan::new(quick), exe_dir));
    rt.shutdown_timeout(std::time::Duration::from_secs(2));
    print!("{text}");
    std::process::ExitCode::SUCCESS
}

/// `warren-bench network-part warm|cold [--quick]`.
fn network_main(quick: bool, warm: bool) -> std::process::ExitCode {
    network_part_main(quick, |plan, exe_dir| async move {
        let r = network::part(&plan, &exe_dir, warm).await;
        network::render(&plan, &r)
    })
}

/// `warren-bench network-part names [--quick]`: firewall writes and the transparent proxy's
/// cost per connection.
fn names_main(quick: bool) -> std::process::ExitCode {
    network_part_main(quick, |plan, exe_dir| async move {
        names::part(&plan, &exe_dir).await
    })
}

/// `warren-bench soak ...`.
fn soak_main(args: &[String]) -> std::process::ExitCode {
    let (mut cycles, mut every, mut conc) = (20_000u64, 5_000u64, 8usize);
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let v = it.next().and_then(|v| v.parse::<u64>().ok());
        match (a.as_str(), v) {
            ("--cycles", Some(v)) => cycles = v,
            ("--every", Some(v)) => every = v.max(1),
            ("--concurrency", Some(v)) => conc = v.max(1) as usize,
            _ => {
                eprint!("warren-bench: bad soak arguments {args:?}\n\n{USAGE}");
                return std::process::ExitCode::from(2);
            }
        }
    }
    let Some(exe_dir) = std::env::current_exe()
        .ok()
        .and_then(|e| e.parent().map(PathBuf::from))
    else {
        eprintln!("warren-bench: cannot tell where its own executable is");
        return std::process::ExitCode::FAILURE;
    };
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("warren-bench: tokio runtime: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    match rt.block_on(soak::run(&exe_dir, cycles, every, conc)) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("warren-bench soak: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

/// `warren-bench rl [--episodes N] [--quick]`.
fn rl_main(args: &[String]) -> std::process::ExitCode {
    let (mut quick, mut episodes) = (false, None);
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--quick" => quick = true,
            "--episodes" => match it.next().map(|v| v.parse::<usize>()) {
                Some(Ok(n)) if n >= 2 => episodes = Some(n),
                _ => {
                    eprint!("warren-bench: --episodes takes a number, 2 or more\n\n{USAGE}");
                    return std::process::ExitCode::from(2);
                }
            },
            other => {
                eprint!("warren-bench: unknown rl argument {other:?}\n\n{USAGE}");
                return std::process::ExitCode::from(2);
            }
        }
    }
    let episodes = episodes.unwrap_or(if quick {
        rl::QUICK_EPISODES
    } else {
        rl::EPISODES
    });
    let (exe_dir, rt) = match exe_dir_and_runtime() {
        Ok(x) => x,
        Err(code) => return code,
    };
    match rt.block_on(rl::run(&exe_dir, episodes)) {
        Ok(out) => {
            print!("{out}");
            std::process::ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("warren-bench rl: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

/// `warren-bench containment [N]`.
/// The directory of this executable (where `warren-guest` is) and a runtime, or why not.
fn exe_dir_and_runtime() -> Result<(PathBuf, tokio::runtime::Runtime), std::process::ExitCode> {
    let Some(exe_dir) = std::env::current_exe()
        .ok()
        .and_then(|e| e.parent().map(PathBuf::from))
    else {
        eprintln!("warren-bench: cannot tell where its own executable is");
        return Err(std::process::ExitCode::FAILURE);
    };
    match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => Ok((exe_dir, rt)),
        Err(e) => {
            eprintln!("warren-bench: tokio runtime: {e}");
            Err(std::process::ExitCode::FAILURE)
        }
    }
}

fn qos_main(which: &str, n: Option<usize>) -> std::process::ExitCode {
    let (exe_dir, rt) = match exe_dir_and_runtime() {
        Ok(x) => x,
        Err(code) => return code,
    };
    let out = rt.block_on(async {
        match which {
            "qos" => qos::interference(&exe_dir, n.unwrap_or(300).max(20)).await,
            "density" => qos::density(&exe_dir, n.unwrap_or(20_000).max(1)).await,
            "prefetch" => qos::prefetch(&exe_dir, n.unwrap_or(200).max(1)).await,
            _ => qos::reclaim(&exe_dir, n.unwrap_or(500).max(1)).await,
        }
    });
    print!("{out}");
    std::process::ExitCode::SUCCESS
}

fn containment_main(n: usize) -> std::process::ExitCode {
    let (exe_dir, rt) = match exe_dir_and_runtime() {
        Ok(x) => x,
        Err(code) => return code,
    };
    match rt.block_on(containment::run(&exe_dir, n.max(1))) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("warren-bench containment: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
