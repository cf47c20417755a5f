//! `warren health`: whether Warren and its nodes answer.

use std::process::ExitCode;

use warren_sdk::Client;

use super::output;

/// Runs `warren health`; fails (exit 1) unless every node is up.
pub async fn run(client: &Client, json: bool) -> anyhow::Result<ExitCode> {
    let h = client.health().await?;
    if json {
        output::json(&h)?;
    } else {
        println!(
            "{}: Warren {} at {}, {}/{} nodes up",
            h.status,
            h.version,
            client.url(),
            h.nodes_up,
            h.nodes
        );
    }
    Ok(if h.status == "ok" {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}
