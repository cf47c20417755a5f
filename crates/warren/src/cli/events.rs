//! `warren events`: incident events (what sandboxes tried that the platform stopped or cut).

use std::process::ExitCode;

use clap::Args;
use warren_sdk::{Client, EventFilter, EventKind};

use super::output;

/// `warren events` options.
#[derive(Debug, Args)]
pub struct EventsArgs {
    /// Only this sandbox's events (also after it is gone).
    #[arg(long)]
    sandbox: Option<String>,
    /// Only events of this task's sandboxes.
    #[arg(long)]
    task: Option<String>,
    /// Only this kind: seccomp, management, disk_quota, output_truncated, pids_limit, oom_kill,
    /// network, create_queued.
    #[arg(long, value_parser = parse_kind)]
    kind: Option<EventKind>,
    /// Only events since then: an RFC 3339 time or a duration back from now (10m, 2h).
    #[arg(long)]
    since: Option<String>,
}

fn parse_kind(s: &str) -> Result<EventKind, String> {
    EventKind::parse(s).ok_or_else(|| {
        let known: Vec<&str> = EventKind::ALL.iter().map(|k| k.name()).collect();
        format!("unknown kind {s:?} (known: {})", known.join(", "))
    })
}

/// Lists events, oldest first.
pub async fn run(client: &Client, json: bool, a: EventsArgs) -> anyhow::Result<ExitCode> {
    let events = client
        .events(&EventFilter {
            sandbox: a.sandbox,
            task: a.task,
            kind: a.kind,
            since: a.since,
        })
        .await?;
    output::warn_unreachable(&events.unreachable, "its events are missing");
    if json {
        output::json(&events.items)?;
        return Ok(ExitCode::SUCCESS);
    }
    let mut t = output::table(&[
        "LAST", "SANDBOX", "TASK", "KIND", "COUNT", "DETAIL", "PROCESS",
    ]);
    for e in &events {
        let process = match (&e.pid, &e.comm) {
            (Some(p), Some(c)) => format!("{p} {c}"),
            (Some(p), None) => p.to_string(),
            _ => "-".into(),
        };
        t.add_row([
            e.last_at.clone(),
            e.sandbox.to_string(),
            e.task.clone().unwrap_or_else(|| "-".into()),
            e.kind.name().to_string(),
            e.count.to_string(),
            e.detail.clone(),
            process,
        ]);
    }
    output::print(&t);
    Ok(ExitCode::SUCCESS)
}
