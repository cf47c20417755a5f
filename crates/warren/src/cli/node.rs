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
            SANDBOXES is how many run out of the most the node admits. MEMORY is what\n\
            sandboxes were promised out of what the node may promise (physical memory ×\n\
            overcommit); AVAILABLE is what the kernel reports free now. THREADS is threads\n\
            in use on the host out of kernel.pid_max."
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
                "MEMORY",
                "AVAILABLE",
                "THREADS",
                "CGROUPS",
            ]);
            for n in &nodes {
                t.add_row([
                    n.id.to_string(),
                    n.version.clone(),
                    format!("{}/{}", n.sandboxes, n.max_sandboxes),
                    format!("{}/{}", n.memory_reserved, n.memory_allocatable),
                    n.memory_available.to_string(),
                    format!("{}/{}", n.threads, n.pid_max),
                    n.cgroups.clone(),
                ]);
            }
            output::print(&t);
        }
    }
    Ok(ExitCode::SUCCESS)
}
