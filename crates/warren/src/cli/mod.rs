//! The `warren` command line: parsing (clap), dispatch, and how errors end the process.
//!
//! Each command group has its own file; [`args`] holds the value parsers several commands share
//! and [`output`] how results are printed (tables for people, `--json` for programs).

mod args;
mod cp;
mod events;
mod exec;
mod fncall;
mod health;
mod iam;
mod image;
mod network;
mod node;
mod output;
mod ps;
mod sandbox;
mod task;

use std::process::ExitCode;

use clap::{Args, Parser, Subcommand};
use warren_sdk::{Client, Config};

const ABOUT: &str = "Warren: sandboxes for agentic RL";

const EXAMPLES: &str = "\
Getting started (on one machine, as root):
  warren up &                                   # start the platform
  id=$(warren sandbox create --image host)      # make a sandbox, print its id
  warren exec $id -- python3 -c 'print(6*7)'    # run a command in it
  warren cp ./data.csv $id:/tmp/data.csv        # copy a file in
  warren sandbox rm $id                         # kill it

Configuration:
  WARREN_URL       where Warren listens (default http://127.0.0.1:7700)
  WARREN_API_KEY   the API key (default: read from $WARREN_DATA_DIR/admin.key,
                   i.e. /var/lib/warren/admin.key, which `warren up` writes)

Exit status: 0 on success, 1 on an error (printed as `error: ...`), 2 for bad usage;
`warren exec` exits with the command's own status (see `warren exec --help`).";

/// The `warren` command.
#[derive(Debug, Parser)]
#[command(
    name = "warren",
    version,
    about = ABOUT,
    after_help = EXAMPLES,
    arg_required_else_help = true,
    propagate_version = true
)]
pub struct Cli {
    #[command(flatten)]
    global: Global,
    #[command(subcommand)]
    command: Command,
}

/// Options every command takes.
#[derive(Debug, Clone, Args)]
pub struct Global {
    /// Address of Warren's REST API [default: http://127.0.0.1:7700].
    #[arg(
        long,
        env = "WARREN_URL",
        global = true,
        hide_env_values = true,
        value_name = "URL",
        help_heading = GLOBAL
    )]
    url: Option<String>,
    /// API key [default: read from $WARREN_DATA_DIR/admin.key].
    #[arg(
        long,
        env = "WARREN_API_KEY",
        global = true,
        hide_env_values = true,
        value_name = "KEY",
        help_heading = GLOBAL
    )]
    api_key: Option<String>,
    /// Print JSON (the API's own objects) instead of tables and text.
    #[arg(long, global = true, help_heading = GLOBAL)]
    json: bool,
}

const GLOBAL: &str = "Global options";

impl Global {
    /// A client configured from the environment, these flags overriding it.
    fn client(&self) -> anyhow::Result<Client> {
        fn given(v: &Option<String>) -> Option<&str> {
            v.as_deref().map(str::trim).filter(|v| !v.is_empty())
        }
        let mut cfg = Config::from_env();
        if let Some(url) = given(&self.url) {
            cfg.url = url.to_string();
        }
        if let Some(key) = given(&self.api_key) {
            cfg.api_key = Some(key.to_string());
        }
        Ok(Client::from_config(cfg)?)
    }
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the all-in-one platform (control plane and node) on this machine.
    Up(crate::up::UpArgs),
    /// Create, list, inspect, pause, resume and remove sandboxes.
    #[command(
        subcommand,
        visible_alias = "sb",
        after_help = "Examples:\n  id=$(warren sandbox create --image host)\n  \
            warren sandbox ls\n  warren sandbox rm $id\n\n\
            See `warren sandbox <COMMAND> --help` for each command's options."
    )]
    Sandbox(sandbox::SandboxCommand),
    /// Pause, resume or stop every sandbox of a training task at once.
    #[command(
        subcommand,
        after_help = "Examples:\n  warren task pause run-7     # training preempted\n  \
            warren task resume run-7\n  warren task stop run-7\n  warren task ls"
    )]
    Task(task::TaskCommand),
    /// What a sandbox, or every sandbox of a task, may reach: read and change at run time.
    #[command(
        subcommand,
        after_help = "Examples:\n  warren network get $id\n  \
            warren network set $id --allow-domain pypi.org --allow-domain '*.pythonhosted.org'\n  \
            warren network set --task run-7 --none"
    )]
    Network(network::NetworkCommand),
    /// Import, build, list and remove layered images.
    #[command(
        subcommand,
        after_help = "Examples:\n  warren image import ./rootfs --name base/debian:12\n  \
            warren image build --from base/debian:12 --run 'apt-get install -y git' --name ws/git:1\n  \
            warren sandbox create --image base/debian:12,ws/git:1\n  \
            warren image ls\n  warren image stats"
    )]
    Image(image::ImageCommand),
    /// Run a command in a sandbox and stream its output.
    Exec(exec::ExecArgs),
    /// Copy a file into or out of a sandbox.
    Cp(cp::CpArgs),
    /// List the background processes of a sandbox.
    Ps(ps::PsArgs),
    /// Run a node daemon that joins a control plane, or look at and cordon the nodes.
    Node(node::NodeArgs),
    /// Run the control plane alone (nodes join it with `warren node --join`).
    Server(crate::daemons::ServerArgs),
    /// Incident events: denied system calls, attempts on the guest agent, limits reached.
    #[command(
        after_help = "Examples:\n  warren events\n  warren events --sandbox $id\n  \
        warren events --task run-7 --kind seccomp --since 10m --json\n\n\
        Each event sums a burst: a million denied calls in a minute is one line with its count."
    )]
    Events(events::EventsArgs),
    /// Function calls: run a program once on a warm worker (online judges, rewards).
    #[command(
        subcommand,
        after_help = "Examples:\n  warren fncall run --lang python solve.py < input.txt\n  \
            warren fncall languages"
    )]
    Fncall(fncall::FnCallCommand),
    /// Tools for developing Warren: a whole cluster on this machine.
    #[command(
        subcommand,
        after_help = "Examples:\n  warren dev cluster --nodes 3\n\n\
            See `warren dev cluster --help` for its commands."
    )]
    Dev(DevCommand),
    /// Projects: the tree that scopes sandboxes, keys and quotas.
    #[command(
        subcommand,
        after_help = "Examples:\n  warren project create root/rl/job-42\n  warren project ls"
    )]
    Project(iam::ProjectCommand),
    /// Identities: people and service accounts.
    #[command(
        subcommand,
        after_help = "Examples:\n  warren identity create job-42-bot --project root/rl/job-42\n  \
            warren identity ls"
    )]
    Identity(iam::IdentityCommand),
    /// API keys: make (scoped to a project, with a role), list, revoke.
    #[command(
        subcommand,
        after_help = "Examples:\n  warren key create --name job-42 --project root/rl/job-42 --role runner\n  \
            warren key ls\n  warren key revoke key_1a2b3c4d5e6f"
    )]
    Key(iam::KeyCommand),
    /// Grant an identity a role (or one permission) on a project's subtree.
    #[command(
        after_help = "Examples:\n  warren grant job-42-bot --project root/rl/job-42 --role runner"
    )]
    Grant(iam::GrantArgs),
    /// Take a grant back.
    #[command(
        after_help = "Examples:\n  warren revoke job-42-bot --project root/rl/job-42 --role runner"
    )]
    Revoke(iam::GrantArgs),
    /// Who this key is: its identity, project and what it holds where.
    #[command(after_help = "Examples:\n  warren whoami\n  warren whoami --json")]
    Whoami,
    /// The audit log: keys, grants, projects, newest first.
    #[command(after_help = "Examples:\n  warren audit\n  warren audit --limit 20 --json")]
    Audit(iam::AuditArgs),
    /// Check that Warren and its nodes answer.
    #[command(after_help = "Examples:\n  warren health\n  warren health --json\n\n\
        Exits 0 when Warren answers and every node is up, 1 otherwise.")]
    Health,
}

/// `warren dev` commands.
#[derive(Debug, Subcommand)]
enum DevCommand {
    /// Run a cluster on this machine: control-plane replicas and node daemons, each node in a
    /// network namespace of its own, on PostgreSQL; commands on standard input.
    #[command(after_help = "Examples:\n  warren dev cluster --nodes 3\n  \
        warren dev cluster --nodes 2 --replicas 1 --database sqlite --node-config 'max_sandboxes = 8'\n\n\
        The first line printed is JSON: {\"ready\": {replicas, nodes, admin_key_file, ...}}. \
        Then it reads commands, one per line, and answers each with a JSON line:\n  \
        kill N             SIGKILL node N's daemon (its sandboxes run on)\n  \
        start N            start node N's daemon again (it re-adopts them)\n  \
        cut N | mend N     take node N's link down | up\n  \
        restart-replica N  stop and start replica N\n  \
        status             the cluster's state\n  \
        quit               kill every sandbox, stop everything, remove what was made\n\n\
        Needs root, iproute2, nsenter and (for --database postgres) Debian's postgresql.")]
    Cluster(crate::dev_cluster::ClusterArgs),
}

/// Parses the command line, runs the command, and turns its outcome into an exit status.
pub fn main() -> ExitCode {
    use clap::{CommandFactory, FromArgMatches};
    let matches = Cli::command().get_matches();
    let mut cli = match Cli::from_arg_matches(&matches) {
        Ok(c) => c,
        Err(e) => e.exit(),
    };
    if let Command::Image(image::ImageCommand::Build(b)) = &mut cli.command
        && let Some(m) = matches
            .subcommand_matches("image")
            .and_then(|m| m.subcommand_matches("build"))
    {
        b.order = image::build_order(m);
    }
    // The daemons run their own runtimes.
    let daemon = match std::mem::replace(&mut cli.command, Command::Health) {
        Command::Up(args) => Some(crate::up::run(args)),
        Command::Server(args) => Some(crate::daemons::run_server(args)),
        Command::Dev(DevCommand::Cluster(args)) => Some(crate::dev_cluster::run(args)),
        Command::Node(node::NodeArgs { cmd: None, daemon }) => {
            Some(crate::daemons::run_node(daemon))
        }
        other => {
            cli.command = other;
            None
        }
    };
    if let Some(r) = daemon {
        return match r {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => fail(&e, 1),
        };
    }
    let failure = match cli.command {
        Command::Exec(_) => exec::COULD_NOT_RUN,
        _ => 1,
    };
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => return fail(&e.into(), failure),
    };
    match runtime.block_on(run(cli.global, cli.command)) {
        Ok(code) => code,
        Err(e) => fail(&e, failure),
    }
}

async fn run(global: Global, command: Command) -> anyhow::Result<ExitCode> {
    let client = global.client()?;
    let json = global.json;
    match command {
        Command::Up(_)
        | Command::Server(_)
        | Command::Dev(_)
        | Command::Node(node::NodeArgs { cmd: None, .. }) => {
            unreachable!("handled before the runtime starts")
        }
        Command::Sandbox(cmd) => sandbox::run(&client, json, cmd).await,
        Command::Task(cmd) => task::run(&client, json, cmd).await,
        Command::Network(cmd) => network::run(&client, json, cmd).await,
        Command::Image(cmd) => image::run(&client, json, cmd).await,
        Command::Exec(args) => exec::run(&client, json, args).await,
        Command::Cp(args) => cp::run(&client, json, args).await,
        Command::Ps(args) => ps::run(&client, json, args).await,
        Command::Node(node::NodeArgs { cmd: Some(cmd), .. }) => node::run(&client, json, cmd).await,
        Command::Events(args) => events::run(&client, json, args).await,
        Command::Fncall(cmd) => fncall::run(&client, json, cmd).await,
        Command::Health => health::run(&client, json).await,
        Command::Project(cmd) => iam::project(&client, json, cmd).await,
        Command::Identity(cmd) => iam::identity(&client, json, cmd).await,
        Command::Key(cmd) => iam::key(&client, json, cmd).await,
        Command::Grant(a) => iam::grant(&client, json, a, true).await,
        Command::Revoke(a) => iam::grant(&client, json, a, false).await,
        Command::Whoami => iam::whoami(&client, json).await,
        Command::Audit(a) => iam::audit(&client, json, a).await,
    }
}

/// Prints `error: <message>` and returns the exit status `code`.
fn fail(e: &anyhow::Error, code: u8) -> ExitCode {
    eprintln!("error: {}", message(e));
    ExitCode::from(code)
}

/// An error's message with the context around it, down to the first SDK error: the SDK's
/// messages already say what went wrong underneath (e.g. "Connection refused").
fn message(e: &anyhow::Error) -> String {
    let mut parts = Vec::new();
    for cause in e.chain() {
        parts.push(cause.to_string());
        if cause.downcast_ref::<warren_sdk::Error>().is_some() {
            break;
        }
    }
    parts.join(": ")
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    use super::*;

    pub(super) fn parse(args: &[&str]) -> Result<Cli, clap::Error> {
        Cli::try_parse_from(std::iter::once("warren").chain(args.iter().copied()))
    }

    #[test]
    fn the_command_line_definition_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn every_command_has_an_about_line_and_an_example() {
        fn check(cmd: &clap::Command, path: &str) {
            for sub in cmd.get_subcommands() {
                let path = format!("{path} {}", sub.get_name());
                assert!(sub.get_about().is_some(), "{path} has no about line");
                let help = sub.get_after_help().map(|h| h.to_string());
                assert!(
                    help.is_some_and(|h| h.contains("Examples:")),
                    "{path} has no example"
                );
                check(sub, &path);
            }
        }
        check(&Cli::command(), "warren");
    }

    #[test]
    fn global_options_go_anywhere() {
        let cli = parse(&["sandbox", "ls", "--json", "--url", "http://h:1"]).unwrap();
        assert!(cli.global.json);
        assert_eq!(cli.global.url.as_deref(), Some("http://h:1"));
        let cli = parse(&["--json", "health"]).unwrap();
        assert!(cli.global.json);
    }

    #[test]
    fn messages_stop_at_the_sdk_error() {
        let sdk = warren_sdk::Error::Invalid("bad id".into());
        let e = anyhow::Error::new(sdk).context("removing x");
        assert_eq!(message(&e), "removing x: bad id");
        let io = std::io::Error::other("disk full");
        let e = anyhow::Error::new(io).context("writing y");
        assert_eq!(message(&e), "writing y: disk full");
    }
}
