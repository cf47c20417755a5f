//! Warren's node library called directly, in this process: the runtime's own create path
//! without HTTP, the control plane, or the SDK.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::bail;
use warren_node::{Node, NodeConfig};
use warren_types::ByteSize;
use warren_types::api::{CreateSandbox, ExecRequest};

use crate::host;
use crate::stats::{CycleStats, Phases, run_cycles};
use crate::{Plan, cycle_result};

/// The cgroup parent of the in-process node.
pub const CGROUP_PARENT: &str = "warren-bench-lib";

pub struct LibResults {
    pub c1: Result<CycleStats, String>,
    pub cn: Result<CycleStats, String>,
    pub exec: Result<CycleStats, String>,
    /// Warm-pool inits the node held once it had settled after its start.
    pub warm_pool: usize,
    pub notes: Vec<String>,
}

fn create_req() -> CreateSandbox {
    CreateSandbox {
        image: "host".into(),
        memory: Some(ByteSize(64 << 20)),
        ..Default::default()
    }
}

fn true_req() -> anyhow::Result<warren_node::exec::Prepared> {
    Ok(warren_node::exec::prepare(
        &ExecRequest {
            argv: Some(vec!["true".into()]),
            ..Default::default()
        },
        None,
    )?)
}

async fn cycle(node: Arc<Node>) -> anyhow::Result<Phases> {
    let t0 = Instant::now();
    let (view, _) = node.create(create_req(), None).await?;
    let t1 = Instant::now();
    let ex = match true_req() {
        Ok(p) => node.exec(&view.id, p).await.map_err(anyhow::Error::from),
        Err(e) => Err(e),
    };
    let t2 = Instant::now();
    let killed = node.kill(&view.id).await;
    let t3 = Instant::now();
    let ex = ex?;
    if ex.status.exit_code != 0 {
        bail!("`true` exited {}: {}", ex.status.exit_code, ex.stderr);
    }
    killed?;
    Ok(Phases {
        create: Some(t1 - t0),
        exec: Some(t2 - t1),
        destroy: Some(t3 - t2),
    })
}

/// The node's configuration: its defaults, or with `cold` its warm pool turned off. The pool
/// setting is given by name through serde, so that this crate builds against a node without
/// one (the cold run then reports that it has nothing to turn off).
fn config(state_dir: &Path, guest: &Path, cold: bool) -> Result<NodeConfig, String> {
    // Loopback-only sandboxes, the figures before sandbox networks (the `network` part of
    // the run measures those, each node in a namespace of its own: two nodes with networks
    // in one namespace is refused).
    if !cold {
        let mut cfg = NodeConfig {
            state_dir: state_dir.to_path_buf(),
            cgroup_parent: CGROUP_PARENT.into(),
            guest_binary: Some(guest.to_path_buf()),
            ..Default::default()
        };
        cfg.network.enabled = false;
        return Ok(cfg);
    }
    serde_json::from_value(serde_json::json!({
        "state_dir": state_dir,
        "cgroup_parent": CGROUP_PARENT,
        "guest_binary": guest,
        "warm_pool": 0,
        "network": { "enabled": false },
    }))
    .map_err(|e| format!("this build's NodeConfig cannot turn a warm pool off ({e})"))
}

/// Runs the node-library measurements; every sandbox is killed and the cgroups removed
/// before this returns. With `cold`, the node runs without its warm pool of pre-started
/// inits, so that every create takes the whole path.
pub async fn run(plan: &Plan, exe_dir: &Path, cold: bool) -> Result<LibResults, String> {
    host::preflight_cgroup_parent(CGROUP_PARENT).map_err(|e| format!("{e:#}"))?;
    let work = tempfile::Builder::new()
        .prefix("warren-bench-lib.")
        .tempdir()
        .map_err(|e| format!("temp dir: {e}"))?;
    let cfg = config(
        &work.path().join("node"),
        &exe_dir.join("warren-guest"),
        cold,
    )?;
    let (node, _) = Node::start(cfg)
        .await
        .map_err(|e| format!("Node::start: {e}"))?;
    let what = if cold {
        "node library without warm pool"
    } else {
        "node library"
    };
    let warm = host::settle_warm_pool(CGROUP_PARENT, Duration::from_secs(10)).await;
    eprintln!("warren-bench: {what}: {warm} warm-pool inits");

    eprintln!("warren-bench: {what}, create→exec→destroy at concurrency 1");
    let n = node.clone();
    let c1 = run_cycles(plan.warmup, plan.n_c1, 1, move |_, _| cycle(n.clone())).await;
    eprintln!("  {}", cycle_result(&c1));
    let mut notes = Vec::new();
    leftovers(&node, what, "after the concurrency-1 cycles", &mut notes);

    host::settle_warm_pool(CGROUP_PARENT, Duration::from_secs(10)).await;
    eprintln!(
        "warren-bench: {what}, create→exec→destroy at concurrency {}",
        plan.conc
    );
    let n = node.clone();
    let cn = run_cycles(plan.warmup, plan.n_cn, plan.conc, move |_, _| {
        cycle(n.clone())
    })
    .await;
    eprintln!("  {}", cycle_result(&cn));
    leftovers(
        &node,
        what,
        &format!("after the concurrency-{} cycles", plan.conc),
        &mut notes,
    );

    host::settle_warm_pool(CGROUP_PARENT, Duration::from_secs(10)).await;
    eprintln!("warren-bench: {what}, exec round trip on one warm sandbox");
    let exec = exec_round_trip(plan, &node).await;
    eprintln!("  {}", cycle_result(&exec));
    leftovers(&node, what, "after the exec round trips", &mut notes);

    let left = tokio::time::timeout(Duration::from_secs(120), node.kill_all())
        .await
        .unwrap_or(0);
    if left > 0 {
        notes.push(format!(
            "{what}: {left} sandboxes were still running at the end and were killed"
        ));
    }
    // Its disk pool's mount goes too (it was left mounted under the temp dir before).
    node.unmount_unused_layers();
    node.unmount_disk_pool_if_unused();
    drop(node);
    // Teardown deletes writable layers on background threads; let them finish before the
    // temp dir goes.
    tokio::time::sleep(Duration::from_millis(300)).await;
    for p in host::remove_cgroup_parent(CGROUP_PARENT, true) {
        notes.push(format!("cgroup left behind: {p}"));
    }
    Ok(LibResults {
        c1,
        cn,
        exec,
        warm_pool: warm,
        notes,
    })
}

/// Notes sandboxes that should be gone: known to the node, or with a cgroup under our parent.
fn leftovers(node: &Node, what: &str, when: &str, notes: &mut Vec<String>) {
    let listed = node.list(&warren_node::node::ListFilter::default()).len();
    let (cgroups, _) = host::count_sandbox_cgroups(CGROUP_PARENT);
    if listed > 0 || cgroups > 0 {
        let msg = format!(
            "{what}: {when}: {listed} sandboxes still known to the node and {cgroups} sandbox cgroups still present (expected none)"
        );
        eprintln!("  {msg}");
        notes.push(msg);
    }
}

async fn exec_round_trip(plan: &Plan, node: &Arc<Node>) -> Result<CycleStats, String> {
    let (view, _) = crate::stats::bounded(async { Ok(node.create(create_req(), None).await?) })
        .await
        .map_err(|e| format!("create: {e:#}"))?;
    let (n, id) = (node.clone(), view.id.clone());
    let r = run_cycles(plan.warmup, plan.n_exec, 1, move |_, _| {
        let (n, id) = (n.clone(), id.clone());
        async move {
            let p = true_req()?;
            let t = Instant::now();
            let ex = n.exec(&id, p).await?;
            let took = t.elapsed();
            if ex.status.exit_code != 0 {
                bail!("`true` exited {}", ex.status.exit_code);
            }
            Ok(Phases {
                exec: Some(took),
                ..Default::default()
            })
        }
    })
    .await;
    let killed = crate::stats::bounded(async { Ok(node.kill(&view.id).await?) }).await;
    match (r, killed) {
        (Ok(r), Ok(())) => Ok(r),
        (Err(e), _) => Err(e),
        (Ok(_), Err(e)) => Err(format!("kill: {e:#}")),
    }
}
