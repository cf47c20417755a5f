//! Command-line parsing and commands (placeholder until the CLI lands).

use clap::Parser;

#[derive(Parser)]
#[command(name = "warren", version, about = "Warren: sandboxes for agentic RL")]
enum Cli {
    /// Run the all-in-one platform (control plane and node) on this machine.
    Up(crate::up::UpArgs),
}

pub fn main() -> std::process::ExitCode {
    match Cli::parse() {
        Cli::Up(args) => match crate::up::run(args) {
            Ok(()) => std::process::ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("error: {e:#}");
                std::process::ExitCode::FAILURE
            }
        },
    }
}
