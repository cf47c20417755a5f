//! `warren node ...`: the nodes that run sandboxes.

use std::process::ExitCode;

use clap::Subcommand;
use warren_sdk::Client;

use super::output;

/// `warren node` commands.
#[derive(Debug, Subcommand)]
pub enum NodeCommand {
    /// List the nodes and their load.
    #[command(
        visible_alias = "list",
        after_help = "Examples:\n  warren node ls\n  warren node ls --json\n\n\
            SANDBOXES is how many run out of the most the node admits (derived from its\n\
            memory, pids and open files). MEM REQ and CPU REQ are sandboxes' requests out of\n\
            what the node admits (physical memory or cores × overcommit). MEM USED is memory\n\
            charged to sandboxes now; AVAILABLE what the kernel reports available; CPU USED\n\
            the host's use of all cores; PSI MEM the share of the last 10 s tasks stalled for\n\
            memory. THREADS is threads in use out of kernel.pid_max. QOS says what the kernel\n\
            has: cpu.idle (else SCHED_IDLE), SMT, and core scheduling (used only with SMT on)."
    )]
    Ls,
}

/// Runs a `warren node` command.
pub async fn run(client: &Client, json: bool, cmd: NodeCommand) -> anyhow::Result<ExitCode> {
    match cmd {
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
