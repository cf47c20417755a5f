//! `warren node ...`: the nodes that run sandboxes (and, with no subcommand, a node daemon).

use std::process::ExitCode;

use clap::{Args, Subcommand};
use warren_sdk::Client;

use super::output;

/// `warren node`: a node daemon, or a command about nodes.
#[derive(Debug, Args)]
#[command(
    args_conflicts_with_subcommands = true,
    after_help = "Examples:\n  warren node --join http://10.0.0.1:7700 --cluster-token-file /etc/warren/cluster.token \\\n      \
        --listen 10.0.0.5:7702\n  warren node ls\n  warren node cordon n1a2b3\n  \
        warren node drain n1a2b3 --kill\n\n\
        With no subcommand, runs a node daemon that joins the control plane at --join, serves its\n\
        API on --listen (the cluster token required) and says every heartbeat it is there.\n\
        Stopping it leaves its sandboxes running; the next start re-adopts them."
)]
pub struct NodeArgs {
    /// A command about nodes; none runs the daemon.
    #[command(subcommand)]
    pub cmd: Option<NodeCommand>,
    /// The daemon's options.
    #[command(flatten)]
    pub daemon: crate::daemons::NodeDaemonArgs,
}

/// `warren node` commands.
#[derive(Debug, Subcommand)]
pub enum NodeCommand {
    /// List the nodes and their load.
    #[command(
        visible_alias = "list",
        after_help = "Examples:\n  warren node ls\n  warren node ls --json\n\n\
            SANDBOXES is how many run out of the most the node admits (derived from its\n\
            memory, pids and open files). CREATES is creates starting out of the node's start\n\
            slots (max_concurrent_creates), then those waiting for one (+N); CREATE WAIT the\n\
            longest a create waited for a slot over the last minute. MEM REQ and CPU REQ are\n\
            sandboxes' requests out of what the node admits (physical memory or cores ×\n\
            overcommit). MEM USED is memory charged to sandboxes now; AVAILABLE what the\n\
            kernel reports available; CPU USED the host's use of all cores; PSI MEM the share\n\
            of the last 10 s tasks stalled for memory. THREADS is threads in use out of\n\
            kernel.pid_max. QOS says what the kernel has: cpu.idle (else SCHED_IDLE), SMT, and\n\
            core scheduling (used only with SMT on)."
    )]
    Ls,
    /// Keep new sandboxes off a node; its sandboxes run on.
    #[command(after_help = "Examples:\n  warren node cordon n1a2b3")]
    Cordon {
        /// The node's id (warren node ls).
        node: String,
    },
    /// Let new sandboxes on a cordoned node again.
    #[command(after_help = "Examples:\n  warren node uncordon n1a2b3")]
    Uncordon {
        /// The node's id (warren node ls).
        node: String,
    },
    /// Remove a node from the cluster for good (a retired machine); refused while it answers.
    #[command(
        after_help = "Examples:\n  warren node drain n1a2b3 --kill && (stop its daemon) && warren node rm n1a2b3"
    )]
    Rm {
        /// The node's id (warren node ls).
        node: String,
    },
    /// Cordon a node and wait until its sandboxes are gone (ended by their owners or
    /// timeouts, or killed with --kill). Exits 0 once it runs none, 1 if some remain at the
    /// end of --wait.
    #[command(after_help = "Examples:\n  warren node drain n1a2b3 --wait 3600\n  \
        warren node drain n1a2b3 --kill")]
    Drain {
        /// The node's id (warren node ls).
        node: String,
        /// Kill its sandboxes instead of waiting for them to end.
        #[arg(long)]
        kill: bool,
        /// Seconds to wait for its sandboxes to be gone.
        #[arg(long, default_value_t = 60)]
        wait: u64,
    },
}

/// Runs a `warren node` command.
pub async fn run(client: &Client, json: bool, cmd: NodeCommand) -> anyhow::Result<ExitCode> {
    match cmd {
        NodeCommand::Cordon { node } => {
            let n = client.cordon(&node, true).await?;
            if json {
                output::json(&n)?;
            } else {
                println!(
                    "node {} cordoned: no new sandboxes go there ({} run on)",
                    n.id, n.sandboxes
                );
            }
        }
        NodeCommand::Uncordon { node } => {
            let n = client.cordon(&node, false).await?;
            if json {
                output::json(&n)?;
            } else {
                println!("node {} takes new sandboxes again", n.id);
            }
        }
        NodeCommand::Rm { node } => {
            client.remove_node(&node).await?;
            if !json {
                println!("node {node} removed from the cluster");
            }
        }
        NodeCommand::Drain { node, kill, wait } => {
            return drain(client, json, &node, kill, wait).await;
        }
        NodeCommand::Ls => {
            let nodes = client.nodes().await?;
            output::warn_unreachable(&nodes.unreachable, "its figures are from its last report");
            if json {
                output::json(&nodes.items)?;
                return Ok(ExitCode::SUCCESS);
            }
            let mut t = output::table(&[
                "ID",
                "VERSION",
                "SANDBOXES",
                "CREATES",
                "CREATE WAIT",
                "MEM REQ",
                "CPU REQ",
                "MEM USED",
                "AVAILABLE",
                "CPU USED",
                "PSI MEM",
                "THREADS",
                "CGROUPS",
                "QOS",
            ]);
            for n in &nodes {
                t.add_row([
                    n.id.to_string(),
                    n.version.clone(),
                    format!("{}/{}", n.sandboxes, n.max_sandboxes),
                    creates(n),
                    format!("{:.1}s", n.create_wait_ms as f64 / 1000.0),
                    format!("{}/{}", n.memory_reserved, n.memory_allocatable),
                    format!("{}m/{}m", n.cpu_requested, n.cpu_allocatable),
                    n.memory_used.to_string(),
                    n.memory_available.to_string(),
                    format!("{:.0}%", n.cpu_used_pct),
                    n.pressure
                        .map_or("-".into(), |p| format!("{:.1}%", p.memory)),
                    format!("{}/{}", n.threads, n.pid_max),
                    n.cgroups.clone(),
                    n.qos.as_ref().map_or("-".into(), qos_summary),
                ]);
            }
            output::print(&t);
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// A node's creates: starting out of its start slots, and `+N` waiting.
fn creates(n: &warren_sdk::NodeInfo) -> String {
    let mut s = format!("{}/{}", n.creates_starting, n.create_slots);
    if n.creates_waiting > 0 {
        s.push_str(&format!(" +{}", n.creates_waiting));
    }
    s
}

/// Cordons `node`, kills its sandboxes if asked, and waits up to `wait` seconds for it to
/// run none.
async fn drain(
    client: &Client,
    json: bool,
    node: &str,
    kill: bool,
    wait: u64,
) -> anyhow::Result<ExitCode> {
    let n = client.cordon(node, true).await?;
    if !json {
        eprintln!("node {} cordoned", n.id);
    }
    let now = std::time::Instant::now();
    let deadline = now
        .checked_add(std::time::Duration::from_secs(wait))
        .unwrap_or(now + std::time::Duration::from_secs(365 * 86400));
    let mut killed = 0usize;
    let mut rounds = 0u32;
    loop {
        let all = client.list(&Default::default()).await?;
        let mine: Vec<_> = all.items.iter().filter(|s| s.node == n.id).collect();
        if all.unreachable.iter().any(|u| u.node == n.id) {
            anyhow::bail!(
                "node {} does not answer, so its sandboxes cannot be counted or killed; it stays \
                 cordoned",
                n.id
            );
        }
        // Drained only when a fresh list shows none: a create placed before the cordon
        // reached every replica may still land, and is killed on the next round.
        let left = mine.len();
        if left == 0 {
            if json {
                output::json(
                    &serde_json::json!({"node": n.id, "drained": true, "killed": killed}),
                )?;
            } else {
                println!(
                    "node {} drained{}",
                    n.id,
                    if kill {
                        format!(" ({killed} sandboxes killed)")
                    } else {
                        String::new()
                    }
                );
            }
            return Ok(ExitCode::SUCCESS);
        }
        // Killing: at least one round, whatever --wait, then rounds until the deadline.
        if kill && (rounds == 0 || std::time::Instant::now() < deadline) {
            rounds += 1;
            for s in &mine {
                match client.sandbox(s.id.as_str())?.kill().await {
                    Ok(()) => killed += 1,
                    Err(e) if e.is_not_found() => {}
                    Err(e) => return Err(e.into()),
                }
            }
            continue;
        }
        if std::time::Instant::now() >= deadline {
            if json {
                output::json(&serde_json::json!({"node": n.id, "drained": false, "left": left}))?;
            } else {
                eprintln!(
                    "node {} still runs {left} sandboxes after {wait} s; it stays cordoned (warren node drain {} --kill ends them)",
                    n.id, n.id
                );
            }
            return Ok(ExitCode::from(1));
        }
        if !json {
            eprintln!("node {}: {left} sandboxes left", n.id);
        }
        tokio::time::sleep(
            std::time::Duration::from_secs(2).min(deadline - std::time::Instant::now()),
        )
        .await;
    }
}

/// `cpu.idle, SMT notsupported, no core scheduling`, as the node found its kernel.
fn qos_summary(q: &warren_sdk::QosSupport) -> String {
    format!(
        "{}, SMT {}, {}",
        if q.cpu_idle { "cpu.idle" } else { "SCHED_IDLE" },
        q.smt,
        match (q.core_scheduling, q.core_scheduling_used) {
            (_, true) => "core scheduling",
            (true, false) => "core scheduling unused (no SMT)",
            (false, _) => "no core scheduling",
        }
    )
}
