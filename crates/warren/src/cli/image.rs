//! `warren image ...`: layered images — import, build (the SDK's `build_image`), list, inspect,
//! remove, read statistics.

use std::io::{self, Write};
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use bytes::Bytes;
use clap::{Args, Subcommand};
use futures_util::StreamExt;
use indicatif::{ProgressBar, ProgressStyle};
use warren_sdk::build::BuildProgress;
use warren_sdk::tarball::tar_dir_with;
use warren_sdk::{BuildSpec, BuildStep, ByteSize, Client, ExecResultExt};

use super::output;

/// `warren image` commands.
#[derive(Debug, Subcommand)]
pub enum ImageCommand {
    /// Import an image from a directory, a tarball (.tar, .tar.gz, .tar.zst), an OCI image
    /// layout (directory or tar), a `docker save` archive or an EROFS file.
    #[command(after_help = "Examples:\n  \
        warren image import ./rootfs --name base/debian:12\n  \
        warren image import python.tar.zst --name base/python:3.12\n  \
        docker save python:3.12 -o py.tar && warren image import py.tar --name base/python:3.12\n  \
        warren image import ./oci-layout-dir --name tk/agent:v3\n  \
        warren image import ./repo --name ws/repo@4f2a1c --owner user\n\n\
        The format is found from the content. Each layer of an OCI or docker image becomes a\n\
        layer in the store, so images that share a base share its layers. Directories are\n\
        sent as tar with owners, modes, times, hard and symbolic links, device files, FIFOs\n\
        and extended attributes (sockets are left out with a note). The same content always\n\
        makes the same layer. --owner gives every file to one owner (for a workspace the\n\
        sandbox's user edits); without it the owners are kept, as a root file system needs.")]
    Import(ImportArgs),
    /// Build a new layer: run steps in a builder sandbox, keep what they changed.
    #[command(after_help = "Examples:\n  \
        warren image build --from base/python:3.12 --run 'pip install numpy' --name ws/numpy:1\n  \
        warren image build --from base/python:3.12,ws/numpy:1 --copy ./agent /opt/agent \\\n      \
        --run 'pip install -e /opt/agent' --name tk/agent:v3\n\n\
        Steps run in the order given, as root with what builds need (useradd, chown, package\n\
        installs: the builder sandbox alone holds CAP_CHOWN, CAP_SETUID and the like; agent\n\
        sandboxes never do). --copy puts files in owned by root, or by --owner. The new image\n\
        is the --from layers plus one new layer holding exactly what the steps changed; the\n\
        builder sandbox is removed.")]
    Build(Box<BuildArgs>),
    /// Pull an image from an OCI registry (Docker Hub, GHCR, a private registry).
    #[command(after_help = "Examples:\n  \
        warren image pull docker.io/library/python:3.12\n  \
        warren image pull ghcr.io/org/env:v3 --name tk/env:v3\n  \
        echo $TOKEN | warren image pull registry.local:5000/team/env:1 --insecure --username ci --password-stdin\n\n\
        The control plane fetches the manifest for this machine's platform and the layers\n\
        (digests checked) into the layer store, one layer per image layer. It refuses a\n\
        registry, token service or redirect at a private, loopback, link-local or metadata\n\
        address unless [control] registry_exempt names its range; --insecure is the\n\
        administrator's only.")]
    Pull(PullArgs),
    /// List images, or with --orphans the layers no image names.
    #[command(
        visible_alias = "list",
        after_help = "Examples:\n  warren image ls\n  warren image ls --json\n  warren image ls --orphans\n\n\
        An orphan is a layer no image names: left by an interrupted import, or by a name that\n\
        was imported again while a node did not answer. `warren image prune` removes them."
    )]
    Ls {
        /// List the layers no image names instead.
        #[arg(long)]
        orphans: bool,
    },
    /// Remove every layer no image names and no sandbox runs on.
    #[command(after_help = "Examples:\n  warren image prune\n  warren image prune --json")]
    Prune,
    /// Show an image and its layers.
    #[command(after_help = "Examples:\n  warren image inspect base/python:3.12")]
    Inspect {
        /// Image name.
        name: String,
    },
    /// Remove an image name, or a layer by digest (refused while something uses it).
    #[command(
        after_help = "Examples:\n  warren image rm tk/agent:v2\n  warren image rm sha256:4f2a...\n\n\
        Removing a name also deletes its layers that no other image and no sandbox uses."
    )]
    Rm {
        /// Image names or layer digests.
        #[arg(required = true)]
        names: Vec<String>,
    },
    /// How much of each mounted layer sandboxes have read.
    #[command(
        after_help = "Examples:\n  warren image stats\n  warren image stats --json\n\n\
        READ is what was read from the layer file since it was mounted on that node; SHARE is\n\
        READ over the layer's size: the part of an image sandboxes really use."
    )]
    Stats,
}

/// `warren image import`.
#[derive(Debug, Args)]
pub struct ImportArgs {
    /// A directory or a file.
    pub path: PathBuf,
    /// Name for the image, e.g. `base/python:3.12`.
    #[arg(long)]
    pub name: String,
    /// Who owns every file of the new layers: `user` (uid 1000, the sandbox's default user;
    /// use it for a workspace an agent edits), `root`, or `UID:GID`. Without it the owners
    /// in the directory or archive are kept, as a root file system needs.
    #[arg(long, value_name = "user|root|UID:GID")]
    pub owner: Option<String>,
    /// The project the image belongs to [default: the key's]: its sandboxes and those of
    /// projects below it may use the image.
    #[arg(long)]
    pub project: Option<String>,
}

/// `warren image pull`.
#[derive(Debug, Args)]
pub struct PullArgs {
    /// The image reference.
    pub reference: String,
    /// Name in Warren [default: the reference's repository and tag].
    #[arg(long)]
    pub name: Option<String>,
    /// Plain HTTP to the registry (no TLS); the administrator's key only.
    #[arg(long)]
    pub insecure: bool,
    /// Registry user name; the password is read from standard input (--password-stdin).
    #[arg(long, requires = "password_stdin")]
    pub username: Option<String>,
    /// Read the registry password or token from standard input.
    #[arg(long, requires = "username")]
    pub password_stdin: bool,
    /// The project the image belongs to [default: the key's]: its sandboxes and those of
    /// projects below it may use the image.
    #[arg(long)]
    pub project: Option<String>,
}

/// `warren image build`.
#[derive(Debug, Args)]
pub struct BuildArgs {
    /// Images to start from, bottom first (repeat, or separate with commas).
    #[arg(long, required = true, value_delimiter = ',')]
    pub from: Vec<String>,
    /// A shell command to run (repeatable; in order with --copy).
    #[arg(long, value_name = "CMD")]
    pub run: Vec<String>,
    /// Copy a local file or directory into the image (repeatable).
    #[arg(long, num_args = 2, value_names = ["SRC", "DST"])]
    pub copy: Vec<String>,
    /// Name of the new image.
    #[arg(long)]
    pub name: String,
    /// Memory for the builder sandbox.
    #[arg(long, default_value = "2Gi")]
    pub memory: ByteSize,
    /// Seconds each --run step may take.
    #[arg(long, default_value_t = 3600)]
    pub step_timeout: u64,
    /// Who owns what the --copy steps copy: `user` (uid 1000, the sandbox's default user: a
    /// workspace the agent edits), `root`, or `UID:GID` [default: root].
    #[arg(long, value_name = "user|root|UID:GID")]
    pub owner: Option<String>,
    /// The project the builder runs in and the image belongs to [default: the key's]. The
    /// --from images must be that project's or an ancestor's.
    #[arg(long)]
    pub project: Option<String>,
    /// What the builder may reach while the steps run (`--allow-domain pypi.org`, ...; see
    /// `warren network`). Default: everything outbound denied.
    #[command(flatten)]
    pub network: super::network::PolicyArgs,
    /// The order of the steps as given on the command line (filled in from the parse).
    #[arg(skip)]
    pub order: Vec<StepKind>,
}

/// Which kind of step comes next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StepKind {
    /// The next --run.
    Run,
    /// The next --copy.
    Copy,
}

/// The order of --run and --copy in the command line.
pub fn build_order(m: &clap::ArgMatches) -> Vec<StepKind> {
    let mut idx: Vec<(usize, StepKind)> = Vec::new();
    if let Some(i) = m.indices_of("run") {
        idx.extend(i.map(|i| (i, StepKind::Run)));
    }
    if let Some(i) = m.indices_of("copy") {
        idx.extend(i.step_by(2).map(|i| (i, StepKind::Copy)));
    }
    idx.sort_by_key(|(i, _)| *i);
    idx.into_iter().map(|(_, k)| k).collect()
}

/// Runs a `warren image` command.
pub async fn run(client: &Client, json: bool, cmd: ImageCommand) -> anyhow::Result<ExitCode> {
    match cmd {
        ImageCommand::Import(a) => import(client, json, a).await,
        ImageCommand::Build(a) => build(client, json, *a).await,
        ImageCommand::Pull(a) => {
            let password = if a.password_stdin {
                let mut s = String::new();
                io::stdin()
                    .read_line(&mut s)
                    .context("reading the password from standard input")?;
                Some(s.trim_end_matches(['\n', '\r']).to_string())
            } else {
                None
            };
            let pb = bar(None, &format!("pulling {}", a.reference));
            let r = client
                .pull_image(&warren_sdk::PullRequest {
                    reference: a.reference.clone(),
                    name: a.name,
                    insecure: a.insecure,
                    username: a.username,
                    password,
                    project: a.project,
                })
                .await;
            pb.finish_and_clear();
            let d = r.with_context(|| format!("pulling {}", a.reference))?;
            if json {
                output::json(&d)?;
            } else {
                println!(
                    "{}: {} layer(s), {}",
                    d.image.name,
                    d.layer_info.len(),
                    size(d.image.size)
                );
            }
            Ok(ExitCode::SUCCESS)
        }
        ImageCommand::Ls { orphans: true } => {
            let layers = client.layers(true).await?;
            if json {
                output::json(&layers)?;
                return Ok(ExitCode::SUCCESS);
            }
            let mut t = output::table(&["LAYER", "SIZE", "SOURCE", "CREATED"]);
            for u in &layers {
                t.add_row([
                    u.layer.digest.clone(),
                    size(u.layer.size),
                    u.layer.source.clone(),
                    u.layer.created_at.clone(),
                ]);
            }
            output::print(&t);
            Ok(ExitCode::SUCCESS)
        }
        ImageCommand::Prune => {
            let r = client.prune_layers().await?;
            if json {
                output::json(&r)?;
                return Ok(ExitCode::SUCCESS);
            }
            for l in &r.removed {
                println!("{}", l.digest);
            }
            for k in &r.kept {
                eprintln!("kept {k}: a sandbox still runs on it");
            }
            println!(
                "{} layer(s) removed, {} freed",
                r.removed.len(),
                size(r.freed)
            );
            Ok(ExitCode::SUCCESS)
        }
        ImageCommand::Ls { orphans: false } => {
            let images = client.images().await?;
            if json {
                output::json(&images)?;
                return Ok(ExitCode::SUCCESS);
            }
            let mut t = output::table(&["NAME", "PROJECT", "LAYERS", "SIZE", "SOURCE", "CREATED"]);
            for i in &images {
                t.add_row([
                    i.name.clone(),
                    i.project.clone(),
                    i.layers.len().to_string(),
                    size(i.size),
                    i.source.clone(),
                    i.created_at.clone(),
                ]);
            }
            output::print(&t);
            Ok(ExitCode::SUCCESS)
        }
        ImageCommand::Inspect { name } => {
            let d = client.image(&name).await?;
            if json {
                output::json(&d)?;
                return Ok(ExitCode::SUCCESS);
            }
            let env = d
                .image
                .env
                .iter()
                .map(|(k, v)| format!("{k}={v}"))
                .collect::<Vec<_>>()
                .join(" ");
            output::print(&output::fields(&[
                ("name", d.image.name.clone()),
                ("size", size(d.image.size)),
                ("source", d.image.source.clone()),
                ("created", d.image.created_at.clone()),
                ("creator", d.image.creator.clone()),
                ("parents", dash(d.image.parents.join(","))),
                ("env", dash(env)),
                ("user", output::or_dash(d.image.user.as_deref())),
                ("workdir", output::or_dash(d.image.workdir.as_deref())),
            ]));
            println!();
            let mut t = output::table(&["LAYER (bottom first)", "SIZE", "SOURCE", "CREATED"]);
            for l in &d.layer_info {
                t.add_row([
                    l.digest.clone(),
                    size(l.size),
                    l.source.clone(),
                    l.created_at.clone(),
                ]);
            }
            output::print(&t);
            Ok(ExitCode::SUCCESS)
        }
        ImageCommand::Rm { names } => {
            for n in &names {
                client
                    .remove_image(n)
                    .await
                    .with_context(|| format!("removing {n}"))?;
                if !json {
                    println!("{n}");
                }
            }
            if json {
                output::json(&names)?;
            }
            Ok(ExitCode::SUCCESS)
        }
        ImageCommand::Stats => {
            let s = client.image_stats().await?;
            output::warn_unreachable(&s.unreachable, "its layers and sandboxes are missing");
            if json {
                output::json(&s)?;
                return Ok(ExitCode::SUCCESS);
            }
            let mut t = output::table(&[
                "NODE",
                "LAYER",
                "MODE",
                "SIZE",
                "READ",
                "SHARE",
                "SANDBOXES",
            ]);
            for l in &s.layers {
                t.add_row([
                    l.node.to_string(),
                    short(&l.digest),
                    l.mode.clone(),
                    size(l.size),
                    size(l.read_bytes),
                    format!("{:.1}%", l.read_fraction * 100.0),
                    l.sandboxes.to_string(),
                ]);
            }
            output::print(&t);
            if !s.sandboxes.is_empty() {
                println!();
                let mut t = output::table(&["SANDBOX", "IMAGE", "IMAGE SIZE", "READ", "SHARE"]);
                for sb in &s.sandboxes {
                    t.add_row([
                        sb.id.to_string(),
                        sb.image.clone(),
                        size(sb.image_size),
                        size(sb.read_bytes),
                        format!("{:.1}%", sb.read_fraction * 100.0),
                    ]);
                }
                output::print(&t);
            }
            Ok(ExitCode::SUCCESS)
        }
    }
}

fn dash(s: String) -> String {
    if s.is_empty() { "-".into() } else { s }
}

fn short(digest: &str) -> String {
    digest.chars().take(19).collect()
}

/// Bytes as people read them.
fn size(n: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = n as f64;
    let mut u = 0;
    while v >= 1024.0 && u < UNITS.len() - 1 {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{n} B")
    } else {
        format!("{v:.1} {}", UNITS[u])
    }
}

fn bar(len: Option<u64>, what: &str) -> ProgressBar {
    let pb = match len {
        Some(n) => ProgressBar::new(n).with_style(
            ProgressStyle::with_template("{msg} [{bar:30}] {bytes}/{total_bytes} {bytes_per_sec}")
                .unwrap_or_else(|_| ProgressStyle::default_bar())
                .progress_chars("=> "),
        ),
        None => ProgressBar::new_spinner().with_style(
            ProgressStyle::with_template("{spinner} {msg} {bytes} {bytes_per_sec}")
                .unwrap_or_else(|_| ProgressStyle::default_spinner()),
        ),
    };
    pb.set_message(what.to_string());
    pb.enable_steady_tick(std::time::Duration::from_millis(120));
    pb
}

/// A spinner with elapsed time on standard error (drawn only on a terminal).
fn spinner(msg: String) -> ProgressBar {
    let pb = ProgressBar::new_spinner().with_style(
        ProgressStyle::with_template("{spinner} {msg} ({elapsed})")
            .unwrap_or_else(|_| ProgressStyle::default_spinner()),
    );
    pb.set_message(msg);
    pb.enable_steady_tick(std::time::Duration::from_millis(120));
    pb
}

/// Ends a spinner, leaving its last line (the step and how long it took) on a terminal, or
/// printing the step on standard error otherwise.
fn finish(pb: ProgressBar) {
    if pb.is_hidden() {
        eprintln!("{}", pb.message());
    } else {
        pb.finish();
    }
}

/// A body being uploaded.
type ByteStream = std::pin::Pin<Box<dyn futures_util::Stream<Item = io::Result<Bytes>> + Send>>;

async fn import(client: &Client, json: bool, a: ImportArgs) -> anyhow::Result<ExitCode> {
    let md =
        std::fs::metadata(&a.path).with_context(|| format!("cannot read {}", a.path.display()))?;
    let (stream, len, source): (ByteStream, Option<u64>, Option<&str>) = if md.is_dir() {
        let oci = a.path.join("oci-layout").is_file();
        let note = |rel: &std::path::Path, why: &str| {
            eprintln!("note: {} is left out: it is {why}", rel.display());
        };
        (
            Box::pin(tar_dir_with(&a.path, note)),
            None,
            (!oci).then_some("directory"),
        )
    } else {
        let f = tokio::fs::File::open(&a.path)
            .await
            .with_context(|| format!("cannot open {}", a.path.display()))?;
        (
            Box::pin(tokio_util::io::ReaderStream::with_capacity(f, 256 * 1024)),
            Some(md.len()),
            None,
        )
    };
    let pb = bar(len, "uploading");
    let pb2 = pb.clone();
    let counted = stream.inspect(move |c| {
        if let Ok(c) = c {
            pb2.inc(c.len() as u64);
            if pb2.length().is_some_and(|l| pb2.position() >= l) {
                pb2.set_message("converting to EROFS layers");
            }
        }
    });
    let result = client
        .import_image_with(
            &a.name,
            reqwest::Body::wrap_stream(counted),
            &warren_sdk::ImportOptions {
                source,
                owner: a.owner.as_deref(),
                project: a.project.as_deref(),
            },
        )
        .await;
    pb.finish_and_clear();
    let d = result.with_context(|| format!("importing {} as {}", a.path.display(), a.name))?;
    if json {
        output::json(&d)?;
    } else {
        println!(
            "{}: {} layer(s), {} ({})",
            d.image.name,
            d.layer_info.len(),
            size(d.image.size),
            d.image.source
        );
    }
    Ok(ExitCode::SUCCESS)
}

async fn build(client: &Client, json: bool, a: BuildArgs) -> anyhow::Result<ExitCode> {
    let spec = build_spec(a)?;
    let mut pb: Option<ProgressBar> = None;
    let r = client
        .build_image_with(&spec, |p: BuildProgress<'_>| match p {
            BuildProgress::Starting => pb = Some(spinner("starting the builder sandbox".into())),
            BuildProgress::Step { index, total, step } => {
                end(&mut pb);
                pb = Some(spinner(format!("step {}/{total}: {step}", index + 1)));
            }
            BuildProgress::StepDone { output, .. } => {
                end(&mut pb);
                if let Some(out) = output {
                    write_output(
                        &out.stdout_data().unwrap_or_default(),
                        &out.stderr_data().unwrap_or_default(),
                    );
                }
            }
            BuildProgress::Saving => {
                end(&mut pb);
                pb = Some(spinner("saving the new layer".into()));
            }
        })
        .await;
    end(&mut pb);
    let image = match r {
        Ok(image) => image,
        Err(e) => {
            if let warren_sdk::Error::BuildStep { stdout, stderr, .. } = &e {
                write_output(stdout, stderr);
                return Err(e.into());
            }
            return Err(anyhow::Error::new(e).context(format!("building {}", spec.name)));
        }
    };
    if json {
        output::json(&image)?;
    } else {
        println!(
            "{}: {} layers, {}",
            image.name,
            image.layers.len(),
            size(image.size)
        );
    }
    Ok(ExitCode::SUCCESS)
}

/// Ends the spinner shown, if any.
fn end(pb: &mut Option<ProgressBar>) {
    if let Some(pb) = pb.take() {
        finish(pb);
    }
}

/// A step's output, on standard error (standard output is for the result).
fn write_output(stdout: &[u8], stderr: &[u8]) {
    let _ = io::stderr().write_all(stdout);
    let _ = io::stderr().write_all(stderr);
}

/// The SDK's build spec from the command line, the steps in the order they were given.
fn build_spec(a: BuildArgs) -> anyhow::Result<BuildSpec> {
    if a.run.is_empty() && a.copy.is_empty() {
        anyhow::bail!("nothing to build: give at least one --run or --copy step");
    }
    let order = if a.order.len() == a.run.len() + a.copy.len() / 2 {
        a.order.clone()
    } else {
        // Without the parse's order: copies first, then commands.
        std::iter::repeat_n(StepKind::Copy, a.copy.len() / 2)
            .chain(std::iter::repeat_n(StepKind::Run, a.run.len()))
            .collect()
    };
    let (mut runs, mut copies) = (a.run.into_iter(), a.copy.chunks(2));
    let mut spec = BuildSpec::new(a.name, a.from);
    spec.memory = a.memory;
    spec.step_timeout = std::time::Duration::from_secs(a.step_timeout);
    spec.project = a.project;
    if a.network.given() {
        spec.network = Some(a.network.policy()?);
    }
    for kind in order {
        spec.steps.push(match kind {
            StepKind::Run => BuildStep::Run(runs.next().context("step order")?),
            StepKind::Copy => {
                let pair = copies.next().context("step order")?;
                match &a.owner {
                    Some(o) => BuildStep::copy_owned(&pair[0], pair[1].clone(), o.clone()),
                    None => BuildStep::copy(&pair[0], pair[1].clone()),
                }
            }
        });
    }
    Ok(spec)
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::{CommandFactory, FromArgMatches};

    #[test]
    fn build_steps_keep_their_order() {
        let m = crate::cli::Cli::command()
            .try_get_matches_from([
                "warren", "image", "build", "--from", "a,b", "--run", "one", "--copy", "x", "/y",
                "--run", "two", "--name", "n",
            ])
            .unwrap();
        let b = m
            .subcommand_matches("image")
            .unwrap()
            .subcommand_matches("build")
            .unwrap();
        assert_eq!(
            build_order(b),
            vec![StepKind::Run, StepKind::Copy, StepKind::Run]
        );
        let cli = crate::cli::Cli::from_arg_matches(&m).unwrap();
        let dbg = format!("{cli:?}");
        assert!(dbg.contains("from: [\"a\", \"b\"]"), "{dbg}");
    }

    #[test]
    fn sizes_read_well() {
        assert_eq!(size(512), "512 B");
        assert_eq!(size(1536), "1.5 KiB");
        assert_eq!(size(3 << 30), "3.0 GiB");
    }
}
