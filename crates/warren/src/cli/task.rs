//! `warren task ...`: pause, resume or stop every sandbox of a training task at once.

use std::process::ExitCode;

use clap::{Args, Subcommand};
use warren_sdk::{Client, TaskAction};

use super::output;

/// `warren task` commands.
#[derive(Debug, Subcommand)]
pub enum TaskCommand {
    /// Freeze every sandbox of a task (e.g. when training is preempted).
    #[command(after_help = "Examples:\n  warren task pause run-7\n\n\
        Any later operation on one of the sandboxes resumes it; `warren task resume` resumes all.")]
    Pause(TaskArg),
    /// Thaw every paused sandbox of a task.
    #[command(after_help = "Examples:\n  warren task resume run-7")]
    Resume(TaskArg),
    /// Kill every sandbox of a task.
    #[command(
        visible_alias = "rm",
        after_help = "Examples:\n  warren task stop run-7"
    )]
    Stop(TaskArg),
    /// List tasks with their sandbox counts.
    #[command(
        visible_alias = "list",
        after_help = "Examples:\n  warren task ls\n  warren task ls --json"
    )]
    Ls,
}

/// A task name.
#[derive(Debug, Args)]
pub struct TaskArg {
    /// The task's name (as given to `sandbox create --task`).
    task: String,
}

/// Runs a `warren task` command. Exits 1 when the action failed on any sandbox, or a node did
/// not answer (its sandboxes were not reached).
pub async fn run(client: &Client, json: bool, cmd: TaskCommand) -> anyhow::Result<ExitCode> {
    let (task, action) = match cmd {
        TaskCommand::Ls => {
            let tasks = client.tasks().await?;
            output::warn_unreachable(&tasks.unreachable, "its sandboxes are not counted");
            if json {
                output::json(&tasks.items)?;
            } else {
                let mut t = output::table(&["TASK", "SANDBOXES", "RUNNING", "PAUSED"]);
                for task in &tasks {
                    t.add_row([
                        task.name.clone(),
                        task.sandboxes.to_string(),
                        task.running.to_string(),
                        task.paused.to_string(),
                    ]);
                }
                output::print(&t);
            }
            return Ok(ExitCode::SUCCESS);
        }
        TaskCommand::Pause(a) => (a.task, TaskAction::Pause),
        TaskCommand::Resume(a) => (a.task, TaskAction::Resume),
        TaskCommand::Stop(a) => (a.task, TaskAction::Stop),
    };
    let r = client.task_action(&task, action).await?;
    if json {
        output::json(&r)?;
    } else {
        println!("{} {}: {} sandboxes", r.task, action.as_str(), r.succeeded);
        for f in &r.failed {
            eprintln!("error: {}: {}", f.id, f.error.message);
        }
    }
    output::warn_unreachable(&r.unreachable, "its sandboxes were not reached");
    Ok(if r.failed.is_empty() && r.is_complete() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}
