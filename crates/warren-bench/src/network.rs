//! `warren-bench network`: what sandbox networks cost, in-process on the node library, beside
//! bubblewrap's `--unshare-all` (a new, empty network namespace per run) in the same run.
//!
//! - create latency, p50/p99: network `none` (loopback only), `filtered` from the warm pool
//!   (the default), `filtered` with a policy of rules (one firewall transaction on the create
//!   path), `filtered` without a warm pool (namespace, interface and elements on the request);
//! - whole create→exec→destroy cycles per second at 32 in flight with the network on and off,
//!   and bwrap's;
//! - a task's policy change: N sandboxes of one task, alternately allowed a CIDR and denied
//!   everything, each change timed end to end (`Node::set_task_network`).
//!
//! The whole benchmark runs in a network namespace of its own (see `main`), so the node's
//! interfaces and firewall table never touch the machine's own namespace.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use warren_node::{Node, NodeConfig};
use warren_types::ByteSize;
use warren_types::api::{CreateSandbox, ExecRequest};
use warren_types::net::{NetRule, NetworkPolicy};

use crate::stats::{CycleStats, Phases, Samples, run_cycles};
use crate::{Plan, cycle_result, host, peers};

const CGROUP_PARENT: &str = "warren-bench-net";

/// What it measured.
pub struct NetResults {
    /// Create only (then a kill, not timed), at concurrency 1, per variant.
    pub creates: Vec<(&'static str, Result<CycleStats, String>)>,
    /// Whole cycles at `plan.conc` in flight.
    pub cycles: Vec<(&'static str, Result<CycleStats, String>)>,
    /// A task's policy change: how many sandboxes, and the times.
    pub task_change: Result<(usize, Samples), String>,
    pub notes: Vec<String>,
}

fn req(network: Option<NetworkPolicy>, task: Option<&str>) -> CreateSandbox {
    CreateSandbox {
        image: "host".into(),
        memory: Some(ByteSize(64 << 20)),
        network,
        task: task.map(str::to_string),
        ..Default::default()
    }
}

fn with_rules() -> NetworkPolicy {
    NetworkPolicy {
        allow: vec![
            NetRule::cidr("192.0.2.0/24"),
            NetRule::domain("pypi.org"),
            NetRule {
                ports: Some("53".into()),
                protocol: Some(warren_types::net::Protocol::Udp),
                ..NetRule::default()
            },
        ],
        ..NetworkPolicy::default()
    }
}

async fn start(state: &Path, guest: &Path, warm: bool) -> Result<Arc<Node>, String> {
    let mut cfg = NodeConfig {
        state_dir: state.to_path_buf(),
        cgroup_parent: CGROUP_PARENT.into(),
        guest_binary: Some(guest.to_path_buf()),
        ..Default::default()
    };
    // The resolver is never asked here; any address does.
    cfg.network.dns_upstream = Some("192.0.2.53".into());
    if !warm {
        cfg.warm_pool = 0;
        cfg.warm_per_image = 0;
    }
    let (node, _) = Node::start(cfg)
        .await
        .map_err(|e| format!("Node::start: {e}"))?;
    Ok(node)
}

async fn create_only(node: Arc<Node>, network: Option<NetworkPolicy>) -> anyhow::Result<Phases> {
    let t0 = Instant::now();
    let (view, _) = node.create(req(network, None), None).await?;
    let took = t0.elapsed();
    node.kill(&view.id).await?;
    Ok(Phases {
        create: Some(took),
        exec: None,
        destroy: None,
    })
}

async fn cycle(node: Arc<Node>, network: Option<NetworkPolicy>) -> anyhow::Result<Phases> {
    let t0 = Instant::now();
    let (view, _) = node.create(req(network, None), None).await?;
    let t1 = Instant::now();
    let p = warren_node::exec::prepare(
        &ExecRequest {
            argv: Some(vec!["true".into()]),
            ..Default::default()
        },
        None,
    )?;
    let ex = node.exec(&view.id, p).await;
    let t2 = Instant::now();
    node.kill(&view.id).await?;
    let t3 = Instant::now();
    let ex = ex?;
    anyhow::ensure!(
        ex.status.exit_code == 0,
        "`true` exited {}",
        ex.status.exit_code
    );
    Ok(Phases {
        create: Some(t1 - t0),
        exec: Some(t2 - t1),
        destroy: Some(t3 - t2),
    })
}

async fn creates(
    plan: &Plan,
    node: &Arc<Node>,
    what: &str,
    network: Option<NetworkPolicy>,
) -> Result<CycleStats, String> {
    host::settle_warm_pool(CGROUP_PARENT, Duration::from_secs(10)).await;
    eprintln!("warren-bench: network: creates, {what}");
    let n = node.clone();
    let r = run_cycles(plan.warmup, plan.n_c1, 1, move |_, _| {
        create_only(n.clone(), network.clone())
    })
    .await;
    eprintln!("  {}", cycle_result(&r));
    r
}

async fn task_change(plan: &Plan, node: &Arc<Node>) -> Result<(usize, Samples), String> {
    let n = if plan.quick { 100 } else { 500 };
    eprintln!("warren-bench: network: a task of {n} sandboxes changes policy");
    let mut ids = Vec::with_capacity(n);
    let mut left = n;
    while left > 0 {
        let batch = left.min(32);
        let made = futures_util::future::join_all(
            (0..batch).map(|_| node.create(req(None, Some("bench-task")), None)),
        )
        .await;
        for m in made {
            ids.push(m.map_err(|e| format!("create: {e}"))?.0.id);
        }
        left -= batch;
    }
    let allow = NetworkPolicy {
        allow: vec![NetRule::cidr("192.0.2.0/24")],
        ..NetworkPolicy::default()
    };
    let mut samples = Samples::default();
    for i in 0..if plan.quick { 6 } else { 10 } {
        let p = if i % 2 == 0 {
            allow.clone()
        } else {
            NetworkPolicy::default()
        };
        let t = Instant::now();
        let r = node
            .set_task_network("bench-task", p, None)
            .await
            .map_err(|e| format!("set_task_network: {e}"))?;
        let took = t.elapsed();
        if r.succeeded as usize != n {
            return Err(format!(
                "{} of {n} took the policy: {:?}",
                r.succeeded, r.failed
            ));
        }
        samples.push(took);
    }
    eprintln!("  task change p50/p99 {}", samples.p50_p99());
    for id in &ids {
        let _ = node.kill(id).await;
    }
    Ok((n, samples))
}

/// One part of the measurements, on one node: `warm` (the default pool: creates of each kind,
/// cycles, a task's change) or not (creates without a warm pool). A node's network needs a
/// namespace to itself, so each part runs in a process of its own (see [`run_parts`]).
pub async fn part(plan: &Plan, exe_dir: &Path, warm: bool) -> Result<NetResults, String> {
    host::preflight_cgroup_parent(CGROUP_PARENT).map_err(|e| format!("{e:#}"))?;
    let work = tempfile::Builder::new()
        .prefix("warren-bench-net.")
        .tempdir()
        .map_err(|e| format!("temp dir: {e}"))?;
    let guest = exe_dir.join("warren-guest");
    let mut notes = Vec::new();
    let mut out_creates = Vec::new();
    let mut out_cycles = Vec::new();
    let mut task = Err("not measured in this part".to_string());
    let node = start(&work.path().join("node"), &guest, warm).await?;
    if warm {
        out_creates.push((
            "none (loopback only)",
            creates(plan, &node, "network none", Some(NetworkPolicy::none())).await,
        ));
        out_creates.push((
            "filtered, warm pool (default)",
            creates(plan, &node, "filtered, pooled", None).await,
        ));
        out_creates.push((
            "filtered with 3 rules, warm pool",
            creates(plan, &node, "filtered with rules", Some(with_rules())).await,
        ));
        for (what, net) in [
            ("Warren, filtered (default)", None),
            ("Warren, none", Some(NetworkPolicy::none())),
        ] {
            host::settle_warm_pool(CGROUP_PARENT, Duration::from_secs(10)).await;
            eprintln!(
                "warren-bench: network: cycles at {} in flight, {what}",
                plan.conc
            );
            let n = node.clone();
            let r = run_cycles(plan.warmup, plan.n_cn, plan.conc, move |_, _| {
                cycle(n.clone(), net.clone())
            })
            .await;
            eprintln!("  {}", cycle_result(&r));
            out_cycles.push((what, r));
        }
        task = task_change(plan, &node).await;
    } else {
        out_creates.push((
            "filtered, no warm pool",
            creates(plan, &node, "filtered, no pool", None).await,
        ));
        out_creates.push((
            "none, no warm pool",
            creates(plan, &node, "none, no pool", Some(NetworkPolicy::none())).await,
        ));
    }
    let left = node.kill_all().await;
    if left > 0 {
        notes.push(format!("{left} sandboxes were left and killed"));
    }
    node.shutdown().await;
    node.remove_network_if_unused();
    node.unmount_unused_layers();
    node.unmount_disk_pool_if_unused();
    tokio::time::sleep(Duration::from_millis(300)).await;
    for p in host::remove_cgroup_parent(CGROUP_PARENT, true) {
        notes.push(format!("cgroup left behind: {p}"));
    }
    if warm {
        eprintln!("warren-bench: network: bwrap --unshare-all cycles");
        out_cycles.push(("bwrap --unshare-all", peers::bwrap(plan).await.cn));
    }
    Ok(NetResults {
        creates: out_creates,
        cycles: out_cycles,
        task_change: task,
        notes,
    })
}

/// Runs both parts, each as `warren-bench network-part` in a network namespace of its own, and
/// returns their tables. Blocking.
pub fn run_parts(quick: bool) -> String {
    let mut out = String::from("## Sandbox networks\n\n");
    for part in ["warm", "cold", "names"] {
        let mut args = vec!["network-part".to_string(), part.to_string()];
        if quick {
            args.push("--quick".into());
        }
        match crate::run_in_fresh_netns(&args) {
            Ok(text) => out.push_str(&text),
            Err(e) => out.push_str(&format!("Part {part} not measured: {e}\n\n")),
        }
    }
    out
}

/// The results as Markdown.
pub fn render(plan: &Plan, r: &Result<NetResults, String>) -> String {
    let mut s = String::new();
    let r = match r {
        Ok(r) => r,
        Err(e) => {
            s.push_str(&format!("Not measured: {e}\n\n"));
            return s;
        }
    };
    s.push_str(&format!(
        "Create latency (node library, in-process; {} creates each, one at a time):\n\n\
         | network | create p50 / p99 |\n|---|---|\n",
        plan.n_c1
    ));
    for (what, c) in &r.creates {
        let v = match c {
            Ok(c) => c.create.p50_p99(),
            Err(e) => format!("failed: {}", crate::stats::short(e, 120)),
        };
        s.push_str(&format!("| {what} | {v} |\n"));
    }
    if r.cycles.is_empty() {
        s.push('\n');
        return s;
    }
    s.push_str(&format!(
        "\nWhole create→exec→destroy cycles, {} in flight ({} cycles):\n\n\
         | | cycles/s | cycle p50 / p99 | host CPU per cycle |\n|---|---|---|---|\n",
        plan.conc, plan.n_cn
    ));
    let mut bwrap_rate = None;
    for (what, c) in &r.cycles {
        match c {
            Ok(c) => {
                if what.starts_with("bwrap") {
                    bwrap_rate = Some(c.creates_per_sec());
                }
                s.push_str(&format!(
                    "| {what} | {:.0} | {} | {} |\n",
                    c.creates_per_sec(),
                    c.cycle.p50_p99(),
                    c.cpu()
                        .map(|(per, _)| crate::stats::ms(per))
                        .unwrap_or_else(|| "—".into())
                ));
            }
            Err(e) => s.push_str(&format!(
                "| {what} | failed: {} | | |\n",
                crate::stats::short(e, 120)
            )),
        }
    }
    if let (Some(b), Some((_, Ok(w)))) = (bwrap_rate, r.cycles.first()) {
        s.push_str(&format!(
            "\nWarren with the network on does {:.2}× bwrap's cycles per second (goal ≥ 1.2×).\n",
            w.creates_per_sec() / b.max(1e-9)
        ));
    }
    match &r.task_change {
        Ok((n, t)) => s.push_str(&format!(
            "\nA task's policy change, {n} sandboxes on the node, one firewall transaction: \
             p50 / p99 {} over {} changes (goal: in effect within 100 ms).\n",
            t.p50_p99(),
            t.len()
        )),
        Err(e) => s.push_str(&format!("\nTask policy change: failed: {e}\n")),
    }
    for n in &r.notes {
        s.push_str(&format!("\nNote: {n}\n"));
    }
    s.push('\n');
    s
}
