//! `warren fncall`: run a program once on a warm worker.

use std::io::{IsTerminal, Read};
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use clap::{Args, Subcommand};
use warren_sdk::{ByteSize, Client, FnCallRequest, FnCallStatus};

use super::output;

/// `warren fncall` commands.
#[derive(Debug, Subcommand)]
pub enum FnCallCommand {
    /// Run a program: its file, compiled first for compiled languages, with standard input
    /// from this command's.
    #[command(
        after_help = "Examples:\n  warren fncall run --lang python solve.py < input.txt\n  \
        warren fncall run --lang cpp main.cpp --timeout 2 --memory 256Mi < in\n  \
        warren fncall run --lang c prog.c --file data.txt --fetch out.txt --json\n\n\
        Prints the run's output as the program printed it and exits with its exit code (124 \
        for a timeout, 125 when it did not compile or hit a limit); --json prints the whole \
        answer."
    )]
    Run(RunArgs),
    /// The languages function calls know, with their commands.
    #[command(
        after_help = "Examples:\n  warren fncall languages\n  warren fncall languages --json"
    )]
    Languages,
    /// Each node's warm worker pools: idle and busy workers, calls, cold starts.
    #[command(
        after_help = "Examples:\n  warren fncall pools\n  warren fncall pools --json\n\n\
        IDLE workers wait warm for the next call; a pool KEEPs as many as its busiest in \
        flight over the last minute, at least 8. COLD is the calls that found no idle worker \
        and waited for one to start; STARTED the workers started, for those and in the \
        background."
    )]
    Pools,
}

/// `warren fncall run` options.
#[derive(Debug, Args)]
pub struct RunArgs {
    /// The program's source file.
    pub file: PathBuf,
    /// Its language: python, bash, c, cpp, java, javascript, rust, go.
    #[arg(long)]
    pub lang: String,
    /// Seconds the run may take.
    #[arg(long)]
    pub timeout: Option<f64>,
    /// Seconds the compile may take.
    #[arg(long)]
    pub compile_timeout: Option<f64>,
    /// Memory of the program and its files (e.g. 256Mi).
    #[arg(long)]
    pub memory: Option<ByteSize>,
    /// Another file to put beside the program (repeatable; its name is kept).
    #[arg(long = "file", value_name = "PATH")]
    pub files: Vec<PathBuf>,
    /// A file to bring back after the run (repeatable; written to the current directory).
    #[arg(long = "fetch", value_name = "NAME")]
    pub fetch: Vec<String>,
    /// The image whose toolchains run it [default: host].
    #[arg(long)]
    pub image: Option<String>,
}

pub async fn run(client: &Client, json: bool, cmd: FnCallCommand) -> anyhow::Result<ExitCode> {
    match cmd {
        FnCallCommand::Languages => {
            let langs = client.fncall_languages().await?;
            if json {
                output::json(&langs)?;
                return Ok(ExitCode::SUCCESS);
            }
            let mut t = output::table(&["LANGUAGE", "ALSO", "FILE", "COMPILE", "RUN"]);
            for l in &langs {
                t.add_row([
                    l.name.clone(),
                    l.aliases.join(", "),
                    l.file.clone(),
                    l.compile.as_ref().map_or("-".into(), |c| c.join(" ")),
                    l.run.join(" "),
                ]);
            }
            output::print(&t);
            Ok(ExitCode::SUCCESS)
        }
        FnCallCommand::Run(a) => run_one(client, json, a).await,
        FnCallCommand::Pools => pools(client, json).await,
    }
}

async fn pools(client: &Client, json: bool) -> anyhow::Result<ExitCode> {
    let nodes = client.nodes().await?;
    if json {
        let all: Vec<_> = nodes
            .items
            .iter()
            .flat_map(|n| {
                n.fncall_pools.iter().map(|p| {
                    let mut v = serde_json::to_value(p).unwrap_or_default();
                    v["node"] = n.id.to_string().into();
                    v
                })
            })
            .collect();
        output::json(&all)?;
    } else {
        let mut t = output::table(&[
            "NODE",
            "IMAGE",
            "MEMORY",
            "IDLE",
            "BUSY",
            "QUEUED",
            "STARTING",
            "KEEP",
            "CALLS",
            "COLD",
            "STARTED",
            "TIMED OUT",
        ]);
        for n in &nodes.items {
            for p in &n.fncall_pools {
                t.add_row([
                    n.id.to_string(),
                    p.image.clone(),
                    p.memory.to_string(),
                    p.idle.to_string(),
                    p.busy.to_string(),
                    p.queued.to_string(),
                    p.starting.to_string(),
                    p.keep.to_string(),
                    p.calls.to_string(),
                    p.cold_calls.to_string(),
                    p.workers_started.to_string(),
                    p.timed_out.to_string(),
                ]);
            }
        }
        output::print(&t);
    }
    output::warn_unreachable(&nodes.unreachable, "its pools are as it last reported them");
    Ok(ExitCode::SUCCESS)
}

async fn run_one(client: &Client, json: bool, a: RunArgs) -> anyhow::Result<ExitCode> {
    use base64::Engine;
    let b64 = base64::engine::general_purpose::STANDARD;
    let code = std::fs::read_to_string(&a.file)
        .with_context(|| format!("reading {}", a.file.display()))?;
    let mut stdin = String::new();
    if !std::io::stdin().is_terminal() {
        std::io::stdin()
            .read_to_string(&mut stdin)
            .context("reading standard input")?;
    }
    let mut files = std::collections::BTreeMap::new();
    for f in &a.files {
        let name = f
            .file_name()
            .and_then(|n| n.to_str())
            .with_context(|| format!("{} has no usable file name", f.display()))?;
        let data = std::fs::read(f).with_context(|| format!("reading {}", f.display()))?;
        files.insert(name.to_string(), b64.encode(data));
    }
    let r = client
        .fncall(&FnCallRequest {
            language: a.lang,
            code,
            image: a.image,
            stdin: Some(stdin),
            files,
            timeout: a.timeout,
            compile_timeout: a.compile_timeout,
            memory: a.memory,
            fetch_files: a.fetch.clone(),
            ..Default::default()
        })
        .await?;
    for (name, data) in &r.files {
        // Only a plain name, written here: never a path the answer chose.
        if a.fetch.contains(name) && !name.contains('/') && name != ".." && name != "." {
            std::fs::write(name, b64.decode(data).unwrap_or_default())
                .with_context(|| format!("writing {name}"))?;
        }
    }
    if json {
        output::json(&r)?;
    } else {
        use std::io::Write;
        if let Some(c) = &r.compile
            && r.status == FnCallStatus::CompileError
        {
            eprint!("{}{}", c.stdout, c.stderr);
        }
        if let Some(run) = &r.run {
            print!("{}", run.stdout);
            eprint!("{}", run.stderr);
            let _ = std::io::stdout().flush();
        }
        for (name, why) in &r.missing_files {
            eprintln!("warren: {name} not fetched: {why}");
        }
        if r.status != FnCallStatus::Ok {
            let run = r.run.as_ref();
            eprintln!(
                "warren: {} ({:.3} s, {} peak)",
                serde_json::to_value(r.status)?.as_str().unwrap_or("failed"),
                run.map_or(0.0, |s| s.wall_time),
                ByteSize(run.map_or(0, |s| s.peak_memory)),
            );
        }
    }
    Ok(ExitCode::from(match r.status {
        FnCallStatus::Ok => 0,
        FnCallStatus::Timeout => 124,
        FnCallStatus::RuntimeError => r
            .run
            .as_ref()
            .and_then(|s| s.exit_code.or(s.signal.map(|x| 128 + x)))
            .map_or(1, |c| c.clamp(1, 255) as u8),
        _ => 125,
    }))
}
