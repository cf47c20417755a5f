//! `warren exec`: run a command in a sandbox, stream its output, exit with its status.

use std::io::ErrorKind;
use std::process::ExitCode;

use anyhow::Context;
use clap::Args;
use futures_util::StreamExt;
use tokio::io::{AsyncReadExt, AsyncWrite, AsyncWriteExt};
use warren_sdk::{Client, ExecEvent, ExecRequest, ExitStatus};

use super::{args, output};

/// Exit status when the command could not be run at all (like `docker run`'s 125).
pub const COULD_NOT_RUN: u8 = 125;

/// Exit status when our stdout was closed under us (128 + SIGPIPE, as a shell reports it).
const STDOUT_CLOSED: u8 = 141;

/// Options of `warren exec`.
#[derive(Debug, Args)]
#[command(after_help = "Examples:\n  \
    warren exec $id -- python3 -c 'print(6*7)'\n  \
    warren exec $id -c 'cd /tmp && ls | wc -l'        # a shell command line\n  \
    warren exec --user root --cwd /etc $id -- cat hostname\n  \
    echo hello | warren exec --stdin $id -- tr a-z A-Z\n  \
    warren exec --json $id -- uname -a                # the result as one JSON object\n\n\
    CMD runs as given, without a shell: `warren exec $id \"ls -l\"` looks for a program\n\
    named \"ls -l\". Use -c/--shell for pipes, redirections and variables. Put options\n\
    before ID; everything after ID (or after --) belongs to the command.\n\n\
    Exit status: the command's own (128+N when signal N killed it); 125 when the command\n\
    could not be run (no such sandbox, Warren unreachable, bad request); 141 when\n\
    warren's standard output was closed early.")]
pub struct ExecArgs {
    /// Run as this user, a name or uid [default: user, uid 1000]; `root` has no capabilities.
    #[arg(long, short = 'u', value_name = "USER")]
    user: Option<String>,
    /// Who runs it: agent (default) or grader, a separate user that agent processes cannot
    /// reach, with the image's pristine system files and the agent's /home/user, /workspace.
    #[arg(long, value_name = "ROLE", value_parser = ["agent", "grader"], conflicts_with = "user")]
    role: Option<String>,
    /// Working directory [default: the user's home].
    #[arg(long, short = 'w', value_name = "DIR")]
    cwd: Option<String>,
    /// An environment variable for the command (repeatable).
    #[arg(long = "env", short = 'e', value_name = "KEY=VALUE", value_parser = args::key_value)]
    env: Vec<(String, String)>,
    /// Kill the command after this many seconds [default: 600; 0 means no limit].
    #[arg(long, value_name = "SECONDS", value_parser = args::seconds)]
    timeout: Option<f64>,
    /// Read warren's standard input to its end and give it to the command.
    #[arg(long, short = 'i')]
    stdin: bool,
    /// Run this command line with /bin/sh -c instead of CMD.
    #[arg(
        long = "shell",
        short = 'c',
        value_name = "COMMAND_LINE",
        conflicts_with = "cmd"
    )]
    shell: Option<String>,
    /// The sandbox's id.
    id: String,
    /// The program and its arguments, run without a shell.
    #[arg(
        value_name = "CMD",
        trailing_var_arg = true,
        allow_hyphen_values = true,
        required_unless_present = "shell"
    )]
    cmd: Vec<String>,
}

impl ExecArgs {
    fn request(&self) -> ExecRequest {
        ExecRequest {
            cmd: self.shell.clone(),
            argv: (!self.cmd.is_empty()).then(|| self.cmd.clone()),
            env: args::to_map(self.env.clone()),
            cwd: self.cwd.clone(),
            user: self.user.clone(),
            timeout: self.timeout,
            role: self.role.as_deref().map(|r| {
                if r == "grader" {
                    warren_sdk::Role::Grader
                } else {
                    warren_sdk::Role::Agent
                }
            }),
            ..Default::default()
        }
    }
}

/// Runs `warren exec`; the exit status is the command's.
pub async fn run(client: &Client, json: bool, a: ExecArgs) -> anyhow::Result<ExitCode> {
    let mut req = a.request();
    if a.stdin {
        let mut input = Vec::new();
        tokio::io::stdin()
            .read_to_end(&mut input)
            .await
            .context("reading standard input for --stdin")?;
        warren_sdk::set_stdin(&mut req, input);
    }
    let sb = client.sandbox(&a.id)?;
    if json {
        let res = sb.exec(&req).await?;
        output::json(&res)?;
        return Ok(ExitCode::from(exit_code(&res.status)));
    }
    let mut events = sb.exec_stream(&req).await?;
    let mut stdout = tokio::io::stdout();
    let mut stderr = tokio::io::stderr();
    while let Some(event) = events.next().await {
        match event? {
            ExecEvent::Start { .. } => {}
            ExecEvent::Stdout { data } => {
                let bytes = warren_sdk::decode_data(&data)?;
                if let Err(e) = write(&mut stdout, &bytes).await {
                    if e.kind() == ErrorKind::BrokenPipe {
                        return Ok(ExitCode::from(STDOUT_CLOSED));
                    }
                    return Err(anyhow::Error::new(e).context("writing to standard output"));
                }
            }
            ExecEvent::Stderr { data } => {
                // Nowhere to report a failure to write to stderr: keep the exit status.
                let _ = write(&mut stderr, &warren_sdk::decode_data(&data)?).await;
            }
            ExecEvent::Exit(status) => {
                explain(&a, &status);
                return Ok(ExitCode::from(exit_code(&status)));
            }
            ExecEvent::Error(e) => anyhow::bail!("{}", e.message),
        }
    }
    anyhow::bail!("the output stream ended without the command's exit status")
}

async fn write(w: &mut (impl AsyncWrite + Unpin), bytes: &[u8]) -> std::io::Result<()> {
    w.write_all(bytes).await?;
    w.flush().await
}

/// The exit status to end with: the command's, 128 + N when signal N killed it.
pub fn exit_code(status: &ExitStatus) -> u8 {
    let code = match status.signal {
        Some(sig) if status.exit_code < 128 => 128 + sig,
        _ => status.exit_code,
    };
    u8::try_from(code).unwrap_or(1)
}

/// A note on stderr when the status needs one to be understood.
fn explain(a: &ExecArgs, status: &ExitStatus) {
    if status.timed_out {
        eprintln!(
            "warren: the command ran past its timeout and was killed; allow more with --timeout SECONDS"
        );
    } else if status.exit_code == 127
        && let [only] = a.cmd.as_slice()
        && only.contains(' ')
    {
        eprintln!(
            "warren: {only:?} was run as one program name; to run a shell command line use -c {only:?}"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::parse;
    use super::*;

    fn exec_args(argv: &[&str]) -> Result<ExecArgs, clap::Error> {
        let mut full = vec!["exec"];
        full.extend_from_slice(argv);
        match parse(&full)?.command {
            super::super::Command::Exec(a) => Ok(a),
            other => panic!("{other:?}"),
        }
    }

    const ID: &str = "abcdef0123456789wxyz";

    #[test]
    fn everything_after_the_id_is_the_command() {
        let a = exec_args(&[ID, "--", "python3", "-c", "print(6*7)"]).unwrap();
        assert_eq!(a.id, ID);
        assert_eq!(a.cmd, ["python3", "-c", "print(6*7)"]);
        assert_eq!(a.shell, None);

        // Without `--`, flags after the program still belong to it.
        let a = exec_args(&[ID, "ls", "-la", "--color"]).unwrap();
        assert_eq!(a.cmd, ["ls", "-la", "--color"]);
    }

    #[test]
    fn a_single_argument_stays_one_argv_entry() {
        let req = exec_args(&[ID, "ls -la"]).unwrap().request();
        assert_eq!(req.argv, Some(vec!["ls -la".to_string()]));
        assert_eq!(req.cmd, None);
    }

    #[test]
    fn shell_mode_and_options_fill_the_request() {
        let a = exec_args(&[
            "-u",
            "root",
            "--cwd",
            "/tmp",
            "-e",
            "A=1",
            "--timeout",
            "2.5",
            "-i",
            "-c",
            "echo $A",
            ID,
        ])
        .unwrap();
        assert!(a.stdin);
        let req = a.request();
        assert_eq!(req.cmd.as_deref(), Some("echo $A"));
        assert_eq!(req.argv, None);
        assert_eq!(req.user.as_deref(), Some("root"));
        assert_eq!(req.cwd.as_deref(), Some("/tmp"));
        assert_eq!(req.timeout, Some(2.5));
        assert_eq!(req.env.get("A").map(String::as_str), Some("1"));
    }

    #[test]
    fn a_command_is_required_and_only_one_kind() {
        assert!(exec_args(&[ID]).is_err());
        assert!(exec_args(&["-c", "ls", ID, "ls"]).is_err());
        assert!(exec_args(&["--timeout", "-1", ID, "ls"]).is_err());
    }

    #[test]
    fn exit_codes_follow_the_shell_convention() {
        let st = |exit_code, signal| ExitStatus {
            exit_code,
            signal,
            ..Default::default()
        };
        assert_eq!(exit_code(&st(0, None)), 0);
        assert_eq!(exit_code(&st(3, None)), 3);
        assert_eq!(exit_code(&st(137, Some(9))), 137);
        assert_eq!(exit_code(&st(-1, Some(15))), 143);
        assert_eq!(exit_code(&st(300, None)), 1);
    }
}
