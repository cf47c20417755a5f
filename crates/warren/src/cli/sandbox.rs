//! `warren sandbox ...`: create, list, inspect, pause, resume and remove sandboxes.

use std::process::ExitCode;

use clap::{Args, Subcommand, ValueEnum};
use warren_sdk::{ByteSize, Client, CreateSandbox, ListFilter, SandboxInfo, SandboxState};

use super::{args, output};

/// `warren sandbox` commands.
#[derive(Debug, Subcommand)]
pub enum SandboxCommand {
    /// Create a sandbox and print its id.
    #[command(after_help = "Examples:\n  \
        id=$(warren sandbox create --image host)\n  \
        warren sandbox create --image host --task run-7 --cpu 500 --memory 1Gi --label env=swe\n  \
        warren sandbox create --image host --idempotency-key rollout-42 --json\n  \
        warren sandbox create --image host --allow-domain pypi.org --allow-domain '*.pythonhosted.org'\n  \
        warren sandbox create --image host --none      # loopback only\n\n\
        With --json, prints the whole sandbox object instead of its id. Without network flags \
        the sandbox has an interface with everything outbound denied.")]
    Create(Box<CreateArgs>),
    /// List sandboxes, oldest first.
    #[command(
        visible_alias = "list",
        after_help = "Examples:\n  warren sandbox ls\n  \
            warren sandbox ls --task run-7 --state paused\n  \
            warren sandbox ls --label env=swe --json"
    )]
    Ls(LsArgs),
    /// Show one sandbox.
    #[command(after_help = "Examples:\n  warren sandbox get $id\n  warren sandbox get $id --json")]
    Get(IdArg),
    /// Kill sandboxes and free what they held; prints each id removed.
    #[command(
        visible_alias = "kill",
        after_help = "Examples:\n  warren sandbox rm $id\n  \
            warren sandbox rm $(warren sandbox ls --json | jq -r '.[].id')\n\n\
            Removes every sandbox it can; exits 1 if any could not be removed."
    )]
    Rm(RmArgs),
    /// Freeze a sandbox: its processes stop, its memory is kept.
    #[command(after_help = "Examples:\n  warren sandbox pause $id\n\n\
        Any later operation on the sandbox (exec, cp, ...) resumes it.")]
    Pause(IdArg),
    /// Thaw a paused sandbox.
    #[command(after_help = "Examples:\n  warren sandbox resume $id")]
    Resume(IdArg),
    /// Give a sandbox a new lifetime, counted from now.
    #[command(after_help = "Examples:\n  warren sandbox timeout $id 7200     # two more hours")]
    Timeout(TimeoutArgs),
    /// Print a sandbox's trajectory log (JSON lines), for one created with --trajectory.
    #[command(after_help = "Examples:\n  warren sandbox trajectory $id > episode.jsonl")]
    Trajectory(IdArg),
}

/// Options of `sandbox timeout`.
#[derive(Debug, Args)]
pub struct TimeoutArgs {
    /// The sandbox's id.
    id: String,
    /// Seconds from now until it is killed.
    seconds: u64,
}

/// Options of `sandbox create`.
#[derive(Debug, Args)]
pub struct CreateArgs {
    /// Image to run, e.g. `host` (the built-in image made from the host's /usr).
    #[arg(long, value_name = "NAME")]
    image: String,
    /// Backend to run it in [default: container].
    #[arg(long, value_name = "BACKEND", value_parser = ["container"])]
    backend: Option<String>,
    /// Training task the sandbox belongs to (task-wide operations act on all of it).
    #[arg(long, value_name = "TASK")]
    task: Option<String>,
    /// Project it belongs to, e.g. root/rl/job-42 [default: the key's project].
    #[arg(long, value_name = "PATH")]
    project: Option<String>,
    /// CPU request in millicores (1000 = one core): what the node's admission counts
    /// [default: 10].
    #[arg(long, value_name = "MILLICORES")]
    cpu: Option<u32>,
    /// CPU limit in millicores, enforced by the kernel [default: 2000, at most the node's cores].
    #[arg(long, value_name = "MILLICORES")]
    cpu_limit: Option<u32>,
    /// Memory request, e.g. 256Mi or a number of bytes: what admission counts [default: 64Mi].
    #[arg(long, value_name = "SIZE")]
    memory: Option<ByteSize>,
    /// Memory limit, enforced by the kernel, e.g. 2Gi [default: 2Gi, at most physical memory].
    #[arg(long, value_name = "SIZE")]
    memory_limit: Option<ByteSize>,
    /// QoS class: be (best-effort: idle CPU priority) or ls (latency-sensitive: weighted by
    /// its CPU request; best-effort sandboxes yield to it) [default: be].
    #[arg(long, value_name = "CLASS", value_parser = ["ls", "be"])]
    qos: Option<String>,
    /// Most processes and threads it may hold [default: 1024].
    #[arg(long, value_name = "N")]
    pids: Option<u32>,
    /// Disk quota of its writable layer, e.g. 256Mi, 10Gi [default: the node's, 10Gi].
    #[arg(long, value_name = "SIZE")]
    disk: Option<ByteSize>,
    /// Lifetime in seconds; the sandbox is killed when it passes [default: 3600].
    #[arg(long, value_name = "SECONDS")]
    timeout: Option<u64>,
    /// A label, filterable in `sandbox ls` (repeatable).
    #[arg(long = "label", short = 'l', value_name = "KEY=VALUE", value_parser = args::key_value)]
    labels: Vec<(String, String)>,
    /// A label its node must have (repeatable): placement keeps to nodes with all of them
    /// (see the nodes' labels with `warren node ls`).
    #[arg(long = "node-selector", value_name = "KEY=VALUE", value_parser = args::key_value)]
    node_selector: Vec<(String, String)>,
    /// An environment variable for every command run in it (repeatable).
    #[arg(long = "env", short = 'e', value_name = "KEY=VALUE", value_parser = args::key_value)]
    env: Vec<(String, String)>,
    /// Make retries safe: a second create with the same key returns the first sandbox.
    #[arg(long, value_name = "KEY")]
    idempotency_key: Option<String>,
    /// Seconds without API activity after which --on-idle happens.
    #[arg(long, value_name = "SECONDS")]
    idle_timeout: Option<u64>,
    /// What idleness does: pause (the next command resumes it) or stop.
    #[arg(long, value_name = "ACTION", requires = "idle_timeout", value_parser = ["pause", "stop"])]
    on_idle: Option<String>,
    /// Record every exec and file write (see `warren sandbox trajectory`).
    #[arg(long)]
    trajectory: bool,
    /// What it may reach (default: an interface with everything denied; see `warren network`).
    #[command(flatten)]
    network: super::network::PolicyArgs,
}

impl CreateArgs {
    fn request(self) -> anyhow::Result<CreateSandbox> {
        let network = if self.network.given() {
            Some(self.network.policy()?)
        } else {
            None
        };
        Ok(CreateSandbox {
            image: self.image,
            backend: self.backend.map(|_| warren_sdk::BackendKind::Container),
            task: self.task,
            project: self.project,
            cpu: self.cpu,
            cpu_limit: self.cpu_limit,
            memory: self.memory,
            memory_limit: self.memory_limit,
            qos: self
                .qos
                .as_deref()
                .map(str::parse)
                .transpose()
                .map_err(anyhow::Error::msg)?,
            pids: self.pids,
            disk: self.disk,
            timeout: self.timeout,
            labels: args::to_map(self.labels),
            node_selector: args::to_map(self.node_selector),
            env: args::to_map(self.env),
            idle_timeout: self.idle_timeout,
            on_idle: self.on_idle.map(|a| {
                if a == "stop" {
                    warren_sdk::IdleAction::Stop
                } else {
                    warren_sdk::IdleAction::Pause
                }
            }),
            trajectory: self.trajectory,
            builder: false,
            network,
            replay: None,
            resolved: None,
            fncall_worker: false,
        })
    }
}

/// Options of `sandbox ls`.
#[derive(Debug, Args)]
pub struct LsArgs {
    /// Only this task's sandboxes.
    #[arg(long, value_name = "TASK")]
    task: Option<String>,
    /// Only sandboxes with this label (repeatable: all must match).
    #[arg(long = "label", short = 'l', value_name = "KEY=VALUE", value_parser = args::key_value)]
    labels: Vec<(String, String)>,
    /// Only sandboxes in this state.
    #[arg(long, value_enum)]
    state: Option<StateArg>,
}

/// A sandbox state, as a flag value.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum StateArg {
    /// Running and answering.
    Running,
    /// Frozen.
    Paused,
}

impl From<StateArg> for SandboxState {
    fn from(s: StateArg) -> Self {
        match s {
            StateArg::Running => SandboxState::Running,
            StateArg::Paused => SandboxState::Paused,
        }
    }
}

/// One sandbox id.
#[derive(Debug, Args)]
pub struct IdArg {
    /// The sandbox's id (as `sandbox create` printed it).
    id: String,
}

/// Options of `sandbox rm`.
#[derive(Debug, Args)]
pub struct RmArgs {
    /// Ids of the sandboxes to remove.
    #[arg(required = true, value_name = "ID")]
    ids: Vec<String>,
}

/// Runs a `warren sandbox` command.
pub async fn run(client: &Client, json: bool, cmd: SandboxCommand) -> anyhow::Result<ExitCode> {
    match cmd {
        SandboxCommand::Create(a) => {
            let key = a.idempotency_key.clone();
            let req = a.request()?;
            let sb = match key {
                Some(key) => client.create_idempotent(&req, &key).await?,
                None => client.create(&req).await?,
            };
            match (json, sb.snapshot()) {
                (true, Some(info)) => output::json(info)?,
                _ => println!("{}", sb.id()),
            }
        }
        SandboxCommand::Ls(a) => {
            let filter = ListFilter {
                task: a.task,
                labels: args::to_map(a.labels),
                state: a.state.map(Into::into),
            };
            let list = client.list(&filter).await?;
            if json {
                output::json(&list.items)?;
            } else {
                output::print(&list_table(&list));
            }
            output::warn_unreachable(&list.unreachable, "its sandboxes are missing");
        }
        SandboxCommand::Get(a) => show(json, &client.get(&a.id).await?)?,
        SandboxCommand::Rm(a) => return remove(client, json, &a.ids).await,
        SandboxCommand::Pause(a) => {
            let info = client.sandbox(&a.id)?.pause().await?;
            brief(json, &info)?;
        }
        SandboxCommand::Resume(a) => {
            let info = client.sandbox(&a.id)?.resume().await?;
            brief(json, &info)?;
        }
        SandboxCommand::Timeout(a) => {
            let info = client.sandbox(&a.id)?.set_timeout(a.seconds).await?;
            if json {
                output::json(&info)?;
            } else {
                println!("{} expires {}", info.id, info.expires_at);
            }
        }
        SandboxCommand::Trajectory(a) => {
            for e in client.sandbox(&a.id)?.trajectory().await? {
                println!("{}", serde_json::to_string(&e)?);
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// Kills each sandbox, all at once; prints the ids removed and an error line for each failure.
async fn remove(client: &Client, json: bool, ids: &[String]) -> anyhow::Result<ExitCode> {
    let kills = ids.iter().map(|id| async move {
        let res = match client.sandbox(id) {
            Ok(sb) => sb.kill().await,
            Err(e) => Err(e),
        };
        (id, res)
    });
    let mut removed = Vec::new();
    let mut failed = false;
    for (id, res) in futures_util::future::join_all(kills).await {
        match res {
            Ok(()) => {
                if !json {
                    println!("{id}");
                }
                removed.push(id.as_str());
            }
            Err(e) => {
                eprintln!("error: {id}: {e}");
                failed = true;
            }
        }
    }
    if json {
        output::json(&serde_json::json!({ "removed": removed }))?;
    }
    Ok(if failed {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    })
}

fn list_table(list: &[SandboxInfo]) -> comfy_table::Table {
    let mut t = output::table(&[
        "ID", "IMAGE", "STATE", "TASK", "QOS", "CPU", "MEMORY", "CREATED", "EXPIRES", "LABELS",
    ]);
    for sb in list {
        t.add_row([
            sb.id.to_string(),
            sb.image.clone(),
            sb.state.as_str().to_string(),
            output::or_dash(sb.task.as_deref()),
            sb.resources.qos.as_str().to_string(),
            format!(
                "{}/{}",
                output::cpu(sb.resources.cpu),
                output::cpu(sb.resources.cpu_limit)
            ),
            format!("{}/{}", sb.resources.memory, sb.resources.memory_limit),
            sb.created_at.clone(),
            sb.expires_at.clone(),
            output::labels(&sb.labels),
        ]);
    }
    t
}

/// One sandbox, field by field.
fn show(json: bool, sb: &SandboxInfo) -> anyhow::Result<()> {
    if json {
        return output::json(sb);
    }
    output::print(&output::fields(&[
        ("id", sb.id.to_string()),
        ("state", sb.state.as_str().to_string()),
        ("image", sb.image.clone()),
        ("task", output::or_dash(sb.task.as_deref())),
        ("node", sb.node.to_string()),
        ("backend", sb.backend.to_string()),
        ("qos", sb.resources.qos.as_str().to_string()),
        ("cpu", output::cpu(sb.resources.cpu)),
        ("cpu limit", output::cpu(sb.resources.cpu_limit)),
        ("memory", sb.resources.memory.to_string()),
        ("memory limit", sb.resources.memory_limit.to_string()),
        ("pids", sb.resources.pids.to_string()),
        ("labels", output::labels(&sb.labels)),
        ("created", sb.created_at.clone()),
        ("expires", sb.expires_at.clone()),
    ]));
    Ok(())
}

/// The id and new state after pause or resume.
fn brief(json: bool, sb: &SandboxInfo) -> anyhow::Result<()> {
    if json {
        return output::json(sb);
    }
    println!("{} {}", sb.id, sb.state.as_str());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::super::tests::parse;
    use super::*;

    fn create_request(extra: &[&str]) -> Result<CreateSandbox, clap::Error> {
        let mut argv = vec!["sandbox", "create", "--image", "host"];
        argv.extend_from_slice(extra);
        match parse(&argv)?.command {
            super::super::Command::Sandbox(SandboxCommand::Create(a)) => {
                Ok(a.request().expect("a valid request"))
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn create_flags_become_the_request() {
        let req = create_request(&[
            "--task",
            "t",
            "--cpu",
            "500",
            "--memory",
            "1Gi",
            "--pids",
            "64",
            "--timeout",
            "60",
            "-l",
            "a=1",
            "--label",
            "b=x=y",
            "--env",
            "PATH=/bin",
        ])
        .unwrap();
        assert_eq!(req.image, "host");
        assert_eq!(req.task.as_deref(), Some("t"));
        assert_eq!(req.cpu, Some(500));
        assert_eq!(req.memory, Some(ByteSize(1 << 30)));
        assert_eq!(req.pids, Some(64));
        assert_eq!(req.timeout, Some(60));
        assert_eq!(req.labels.get("b").map(String::as_str), Some("x=y"));
        assert_eq!(req.env.get("PATH").map(String::as_str), Some("/bin"));
    }

    #[test]
    fn sizes_are_parsed_as_people_write_them() {
        assert_eq!(
            create_request(&["--memory", "512Mi"]).unwrap().memory,
            Some(ByteSize(512 << 20))
        );
        assert_eq!(
            create_request(&["--memory", "2G"]).unwrap().memory,
            Some(ByteSize(2 << 30))
        );
        assert_eq!(
            create_request(&["--memory", "4096"]).unwrap().memory,
            Some(ByteSize(4096))
        );
        let err = create_request(&["--memory", "1.5G"])
            .unwrap_err()
            .to_string();
        assert!(err.contains("is not a size"), "{err}");
        let err = create_request(&["--label", "novalue"])
            .unwrap_err()
            .to_string();
        assert!(err.contains("KEY=VALUE"), "{err}");
    }

    #[test]
    fn create_needs_an_image() {
        assert!(parse(&["sandbox", "create"]).is_err());
    }

    #[test]
    fn ls_filters_and_rm_ids_parse() {
        let cli = parse(&["sb", "list", "--state", "paused", "-l", "k=v"]).unwrap();
        match cli.command {
            super::super::Command::Sandbox(SandboxCommand::Ls(a)) => {
                assert_eq!(a.state, Some(StateArg::Paused));
                assert_eq!(a.labels, vec![("k".to_string(), "v".to_string())]);
            }
            other => panic!("{other:?}"),
        }
        assert!(parse(&["sandbox", "ls", "--state", "dead"]).is_err());
        assert!(parse(&["sandbox", "rm"]).is_err());
        assert!(parse(&["sandbox", "rm", "a", "b"]).is_ok());
    }
}
