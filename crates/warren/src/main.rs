//! `warren`: the command-line interface to Warren, and `warren up`.

mod cli;
mod up;

fn main() -> std::process::ExitCode {
    cli::main()
}
