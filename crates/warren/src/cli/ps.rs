//! `warren ps`: the background processes of a sandbox.

use std::process::ExitCode;

use clap::Args;
use warren_sdk::{Client, ProcessInfo};

use super::output;

/// Options of `warren ps`.
#[derive(Debug, Args)]
#[command(after_help = "Examples:\n  warren ps $id\n  warren ps $id --json\n\n\
    Lists processes started in the background (POST /v1/sandboxes/{id}/processes) that still\n\
    run, and finished ones whose status nobody collected yet.")]
pub struct PsArgs {
    /// The sandbox's id.
    id: String,
}

/// Runs `warren ps`.
pub async fn run(client: &Client, json: bool, a: PsArgs) -> anyhow::Result<ExitCode> {
    let procs = client.sandbox(&a.id)?.processes().await?;
    if json {
        output::json(&procs)?;
        return Ok(ExitCode::SUCCESS);
    }
    let mut t = output::table(&["PROCESS", "PID", "USER", "STATUS", "COMMAND"]);
    for p in &procs {
        t.add_row([
            p.process_id.to_string(),
            p.pid.to_string(),
            p.user.clone(),
            status(p),
            p.argv.join(" "),
        ]);
    }
    output::print(&t);
    Ok(ExitCode::SUCCESS)
}

/// `running`, `exited 0`, `killed by signal 9`, `timed out`.
fn status(p: &ProcessInfo) -> String {
    match &p.exit {
        _ if p.running => "running".into(),
        Some(e) if e.timed_out => "timed out".into(),
        Some(e) => match e.signal {
            Some(sig) => format!("killed by signal {sig}"),
            None => format!("exited {}", e.exit_code),
        },
        None => "exited".into(),
    }
}

#[cfg(test)]
mod tests {
    use warren_sdk::ExitStatus;

    use super::*;

    #[test]
    fn statuses_read_as_words() {
        let mut p = ProcessInfo {
            process_id: 1,
            pid: 2,
            argv: vec!["sleep".into(), "9".into()],
            user: "user".into(),
            running: true,
            exit: None,
            pty: false,
            stdin_open: false,
        };
        assert_eq!(status(&p), "running");
        p.running = false;
        p.exit = Some(ExitStatus {
            exit_code: 3,
            ..Default::default()
        });
        assert_eq!(status(&p), "exited 3");
        p.exit = Some(ExitStatus {
            exit_code: 137,
            signal: Some(9),
            ..Default::default()
        });
        assert_eq!(status(&p), "killed by signal 9");
    }
}
