//! Building an image: a builder sandbox from base images, steps run in it as root, and what
//! they changed committed as one new layer on top (`warren image build` is this).
//!
//! ```no_run
//! # async fn demo(client: warren_sdk::Client) -> warren_sdk::Result<()> {
//! use warren_sdk::build::{BuildSpec, BuildStep};
//!
//! let spec = BuildSpec::new("ws/numpy:1", ["base/python:3.12"])
//!     .step(BuildStep::copy("./requirements.txt", "/tmp/requirements.txt"))
//!     .step(BuildStep::run("pip install -r /tmp/requirements.txt"));
//! let image = client.build_image(&spec).await?;
//! println!("{}: {} layers", image.name, image.layers.len());
//! # Ok(()) }
//! ```

use std::path::{Path, PathBuf};
use std::time::Duration;

use warren_types::api::{CreateSandbox, ExecResult, Image};
use warren_types::size::ByteSize;

use crate::error::{Error, Result};
use crate::{Client, ExecResultExt};

/// The label a builder sandbox carries, with the name of the image it builds.
pub const BUILD_LABEL: &str = "warren.build";

/// One step of a build.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BuildStep {
    /// A shell command line, run as root with `/bin/sh -c`; a non-zero exit fails the build.
    Run(String),
    /// A local file or directory copied into the image (a directory with its modes, links
    /// and extended attributes), owned by root unless `owner` says otherwise.
    Copy {
        /// The local path.
        src: PathBuf,
        /// Where in the image.
        dst: String,
        /// Who owns what was copied: `user` (uid and gid 1000, the sandbox's default user),
        /// `root`, or `UID:GID`. Default root.
        owner: Option<String>,
    },
}

impl BuildStep {
    /// A [`BuildStep::Run`].
    pub fn run(cmd: impl Into<String>) -> Self {
        BuildStep::Run(cmd.into())
    }

    /// A [`BuildStep::Copy`] owned by root.
    pub fn copy(src: impl Into<PathBuf>, dst: impl Into<String>) -> Self {
        BuildStep::Copy {
            src: src.into(),
            dst: dst.into(),
            owner: None,
        }
    }

    /// A [`BuildStep::Copy`] owned by `owner`: `user` (uid 1000, the sandbox's default user:
    /// a workspace the agent edits), `root`, or `UID:GID`.
    pub fn copy_owned(
        src: impl Into<PathBuf>,
        dst: impl Into<String>,
        owner: impl Into<String>,
    ) -> Self {
        BuildStep::Copy {
            src: src.into(),
            dst: dst.into(),
            owner: Some(owner.into()),
        }
    }
}

impl std::fmt::Display for BuildStep {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            BuildStep::Run(cmd) => write!(f, "run {cmd}"),
            BuildStep::Copy {
                src,
                dst,
                owner: None,
            } => write!(f, "copy {} {dst}", src.display()),
            BuildStep::Copy {
                src,
                dst,
                owner: Some(o),
            } => write!(f, "copy {} {dst} (owner {o})", src.display()),
        }
    }
}

/// What to build.
#[derive(Debug, Clone, PartialEq)]
pub struct BuildSpec {
    /// Name of the new image, e.g. `tk/agent:v3`.
    pub name: String,
    /// The images to start from, bottom first.
    pub from: Vec<String>,
    /// The steps, in order.
    pub steps: Vec<BuildStep>,
    /// Memory of the builder sandbox. Default 2Gi.
    pub memory: ByteSize,
    /// How long each run step may take. Default one hour.
    pub step_timeout: Duration,
    /// What the builder sandbox may reach (a package index for `pip install`, a mirror for
    /// `apt-get`). Default: the node's, everything outbound denied.
    pub network: Option<crate::NetworkPolicy>,
    /// The project the builder sandbox runs in and the image belongs to (default: the
    /// key's). The images it starts from must be that project's or an ancestor's; the key
    /// needs sandbox permissions (`runner`) and `image.build` (`builder`) there.
    pub project: Option<String>,
}

impl BuildSpec {
    /// A build of `name` from `from` (bottom first), with no steps yet.
    pub fn new(name: impl Into<String>, from: impl IntoIterator<Item = impl Into<String>>) -> Self {
        BuildSpec {
            name: name.into(),
            from: from.into_iter().map(Into::into).collect(),
            steps: Vec::new(),
            memory: ByteSize(2 << 30),
            step_timeout: Duration::from_secs(3600),
            network: None,
            project: None,
        }
    }

    /// Adds a step at the end.
    pub fn step(mut self, step: BuildStep) -> Self {
        self.steps.push(step);
        self
    }

    /// What is wrong with the spec, before any request.
    fn check(&self) -> Result<()> {
        if self.name.trim().is_empty() {
            return Err(Error::Invalid("the new image needs a name".into()));
        }
        if self.from.is_empty() || self.from.iter().any(|f| f.trim().is_empty()) {
            return Err(Error::Invalid(
                "give the images to build from (bottom first), none of them empty".into(),
            ));
        }
        if let Some(f) = self.from.iter().find(|f| f.contains(',')) {
            return Err(Error::Invalid(format!(
                "image {f:?} contains a comma: give each image to build from alone"
            )));
        }
        if self.steps.is_empty() {
            return Err(Error::Invalid(
                "nothing to build: give at least one run or copy step".into(),
            ));
        }
        for s in &self.steps {
            if let BuildStep::Copy { owner: Some(o), .. } = s {
                owner_ids(o)?;
            }
        }
        Ok(())
    }
}

/// Where a build is, for a progress display.
#[derive(Debug)]
pub enum BuildProgress<'a> {
    /// The builder sandbox is being created.
    Starting,
    /// Step `index` (from 0) of `total` begins.
    Step {
        /// Which step, from 0.
        index: usize,
        /// How many there are.
        total: usize,
        /// The step.
        step: &'a BuildStep,
    },
    /// Step `index` finished; `output` is a run step's result (its exit code 0).
    StepDone {
        /// Which step, from 0.
        index: usize,
        /// The step.
        step: &'a BuildStep,
        /// What a run step printed.
        output: Option<&'a ExecResult>,
    },
    /// The builder's changes are being saved as the new layer.
    Saving,
}

impl Client {
    /// Builds an image (see [`crate::build`]): a builder sandbox from `spec.from`, each step in
    /// order as root, then the changes committed as a new layer and named `spec.name`. The
    /// builder sandbox is removed whatever happens.
    ///
    /// Fails with [`Error::BuildStep`] when a run step exits non-zero (nothing is saved).
    pub async fn build_image(&self, spec: &BuildSpec) -> Result<Image> {
        self.build_image_with(spec, |_| {}).await
    }

    /// [`build_image`](Self::build_image), telling `progress` where it is.
    pub async fn build_image_with(
        &self,
        spec: &BuildSpec,
        mut progress: impl FnMut(BuildProgress<'_>),
    ) -> Result<Image> {
        spec.check()?;
        progress(BuildProgress::Starting);
        let sb = self
            .create(&CreateSandbox {
                image: spec.from.join(","),
                memory: Some(spec.memory),
                timeout: Some(24 * 3600),
                labels: [(BUILD_LABEL.to_string(), spec.name.clone())].into(),
                builder: true,
                network: spec.network.clone(),
                project: spec.project.clone(),
                ..CreateSandbox::default()
            })
            .await?;
        let result = async {
            let root = sb.as_user("root");
            let total = spec.steps.len();
            for (index, step) in spec.steps.iter().enumerate() {
                progress(BuildProgress::Step { index, total, step });
                let output = match step {
                    BuildStep::Run(cmd) => {
                        let mut req = crate::shell(cmd);
                        req.user = Some("root".into());
                        req.timeout = Some(spec.step_timeout.as_secs_f64());
                        let out = sb.exec(&req).await?;
                        if out.status.exit_code != 0 || out.status.timed_out {
                            return Err(step_failed(index, cmd, &out));
                        }
                        Some(out)
                    }
                    BuildStep::Copy { src, dst, owner } => {
                        copy_in(&root, src, dst).await?;
                        match owner {
                            Some(o) => Some(give_to(&sb, index, dst, o).await?),
                            None => None,
                        }
                    }
                };
                progress(BuildProgress::StepDone {
                    index,
                    step,
                    output: output.as_ref(),
                });
            }
            progress(BuildProgress::Saving);
            sb.commit(&spec.name).await
        }
        .await;
        // The builder is of no use after the build, whether it succeeded or not.
        let _ = sb.kill().await;
        result
    }
}

/// The error for run step `index` that did not exit 0.
fn step_failed(index: usize, cmd: &str, out: &ExecResult) -> Error {
    let why = match (out.status.signal, out.status.timed_out) {
        (_, true) => "a timeout (step_timeout)".to_string(),
        (Some(s), _) => format!("signal {s}"),
        (None, _) => format!("exit code {}", out.status.exit_code),
    };
    Error::BuildStep {
        step: index + 1,
        cmd: cmd.to_string(),
        why,
        stdout: out.stdout_data().unwrap_or_default(),
        stderr: out.stderr_data().unwrap_or_default(),
    }
}

/// `UID:GID` of an owner given as `user`, `root` or `UID:GID`.
fn owner_ids(owner: &str) -> Result<(u32, u32)> {
    let o = warren_types::owner::Owner::parse(owner).map_err(Error::Invalid)?;
    Ok((o.uid, o.gid))
}

/// Gives what a copy step put at `dst` to `owner`: `chown -R` in the builder, as root (a
/// builder's root may). Needs `chown` in the image.
async fn give_to(sb: &crate::Sandbox, index: usize, dst: &str, owner: &str) -> Result<ExecResult> {
    let (uid, gid) = owner_ids(owner)?;
    let mut req = crate::argv(["chown", "-R", "-h", &format!("{uid}:{gid}"), "--", dst]);
    req.user = Some("root".into());
    let out = sb.exec(&req).await?;
    if out.status.exit_code != 0 {
        return Err(step_failed(
            index,
            &format!("chown -R {uid}:{gid} {dst}"),
            &out,
        ));
    }
    Ok(out)
}

/// Copies a local file or directory to `dst` in the sandbox.
async fn copy_in(root: &crate::Sandbox, src: &Path, dst: &str) -> Result<()> {
    let md = tokio::fs::metadata(src).await.map_err(|e| Error::Local {
        op: "read",
        path: src.to_path_buf(),
        source: e,
    })?;
    if md.is_dir() {
        root.upload_tar(
            dst,
            reqwest::Body::wrap_stream(crate::tarball::tar_dir(src)),
        )
        .await
    } else {
        use std::os::unix::fs::PermissionsExt;
        root.upload_file(src, dst, Some(md.permissions().mode() & 0o7777))
            .await
            .map(drop)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn specs_are_checked_before_any_request() {
        let ok = BuildSpec::new("a/b:1", ["base"]).step(BuildStep::run("true"));
        assert!(ok.check().is_ok());
        for (spec, words) in [
            (BuildSpec::new("a/b:1", ["base"]), "nothing to build"),
            (
                BuildSpec::new("", ["base"]).step(BuildStep::run("true")),
                "needs a name",
            ),
            (
                BuildSpec::new("a", Vec::<String>::new()).step(BuildStep::run("true")),
                "images to build from",
            ),
            (
                BuildSpec::new("a", ["x,y"]).step(BuildStep::run("true")),
                "contains a comma",
            ),
        ] {
            let e = spec.check().unwrap_err();
            assert!(matches!(e, Error::Invalid(_)), "{e:?}");
            assert!(e.to_string().contains(words), "{e}");
        }
        assert_eq!(
            BuildStep::copy("./agent", "/opt/agent").to_string(),
            "copy ./agent /opt/agent"
        );
    }
}
