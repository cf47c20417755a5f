//! `warren`: the command-line interface to Warren, and `warren up`.

mod cli;
mod daemons;
mod dev_cluster;
mod up;

fn main() -> std::process::ExitCode {
    cli::main()
}
