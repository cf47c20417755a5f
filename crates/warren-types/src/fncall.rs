//! Function calls (the FnCall backend): a program run once on a warm worker, stateless — an
//! online judge's submission, a reward script, a snippet to evaluate.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::api::ResolvedImage;
use crate::guest::{CallResult, CallSpec};
use crate::size::ByteSize;

/// `POST /v1/fncall/run`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct FnCallRequest {
    /// Language: `python`, `bash`, `c`, `cpp`, `java`, `javascript` (or `nodejs`), `rust`,
    /// `go` — whichever toolchains the image has (`GET /v1/fncall/languages`).
    #[cfg_attr(feature = "openapi", schema(pattern = "^[a-z0-9+#_-]{1,32}$"))]
    pub language: String,
    /// The program's source.
    #[cfg_attr(feature = "openapi", schema(max_length = 4194304))]
    pub code: String,
    /// Image whose toolchains run it (default `host`, the machine's own). Its sandboxes'
    /// project rules apply: an image of the key's project or an ancestor's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
    /// Standard input of the run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stdin: Option<String>,
    /// More files beside the program: path (relative) → content, base64.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub files: BTreeMap<String, String>,
    /// Seconds the run may take (wall clock; default 10, at most 300).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(minimum = 0.001, maximum = 300))]
    pub timeout: Option<f64>,
    /// Seconds the compile may take (default 30, at most 300).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(minimum = 0.001, maximum = 300))]
    pub compile_timeout: Option<f64>,
    /// Memory of the program, its files included (default 512Mi, 16Mi to 16Gi).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(value_type = Option<String>, example = "512Mi"))]
    pub memory: Option<ByteSize>,
    /// Output kept of stdout and of stderr each; a program printing more is stopped with
    /// status `output_limit` (default 8Mi, at most 64Mi).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(value_type = Option<String>, example = "8Mi"))]
    pub max_output: Option<ByteSize>,
    /// Files to return after the run (relative paths in the working directory).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub fetch_files: Vec<String>,
    /// The project it runs for (default: the key's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub project: Option<String>,
}

/// How a call ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum FnCallStatus {
    /// The program ran and exited 0.
    Ok,
    /// The compiler refused the program (or ran out of time or memory).
    CompileError,
    /// The run took longer than its timeout.
    Timeout,
    /// The run needed more memory than it was given.
    MemoryLimit,
    /// The run exited non-zero or was killed by a signal.
    RuntimeError,
    /// The run printed more than `max_output`.
    OutputLimit,
}

impl FnCallStatus {
    /// The name in answers.
    pub fn name(self) -> &'static str {
        match self {
            FnCallStatus::Ok => "ok",
            FnCallStatus::CompileError => "compile_error",
            FnCallStatus::Timeout => "timeout",
            FnCallStatus::MemoryLimit => "memory_limit",
            FnCallStatus::RuntimeError => "runtime_error",
            FnCallStatus::OutputLimit => "output_limit",
        }
    }
}

/// What one step (the compile or the run) did.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct StepOutcome {
    /// Standard output (UTF-8, invalid sequences replaced).
    pub stdout: String,
    /// Standard error.
    pub stderr: String,
    /// Exit code, when it exited.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exit_code: Option<i32>,
    /// The signal that ended it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signal: Option<i32>,
    /// Killed at its timeout.
    pub timed_out: bool,
    /// Killed for printing more than `max_output` (what it printed up to there is kept).
    pub output_limited: bool,
    /// Wall-clock seconds.
    pub wall_time: f64,
    /// CPU seconds (user and system).
    pub cpu_time: f64,
    /// Peak resident memory, bytes.
    pub peak_memory: u64,
}

/// The answer to a call.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct FnCallResult {
    /// How it ended.
    pub status: FnCallStatus,
    /// The compile, for compiled languages.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compile: Option<StepOutcome>,
    /// The run (absent when the compile failed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run: Option<StepOutcome>,
    /// Fetched files: path → content, base64 (a file that could not be read is absent, and
    /// named in `missing_files`).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub files: BTreeMap<String, String>,
    /// Files asked for that could not be returned, with why.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub missing_files: BTreeMap<String, String>,
    /// The node that ran it.
    pub node: String,
}

/// A language a default install runs (`GET /v1/fncall/languages`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct LanguageInfo {
    /// Its name in calls.
    pub name: String,
    /// Other names accepted for it (SandboxFusion's).
    pub aliases: Vec<String>,
    /// The program's file name.
    pub file: String,
    /// The compile command, for compiled languages.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compile: Option<Vec<String>>,
    /// The run command.
    pub run: Vec<String>,
}

/// `GET /v1/fncall/languages`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct LanguageList {
    /// Every language, by name.
    pub languages: Vec<LanguageInfo>,
}

/// A call as the control plane sends it to a node (`POST /v1/node/fncall`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NodeCall {
    /// Image (a catalog name list, or `host`).
    pub image: String,
    /// Its layers, resolved by the control plane (none for `host`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resolved: Option<ResolvedImage>,
    /// Memory of the call (the worker's limit is this plus the guest's share).
    pub memory: ByteSize,
    /// What the worker's guest runs.
    pub spec: CallSpec,
}

/// A node's answer to a call.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NodeCallResult {
    /// What the guest reported.
    pub result: CallResult,
    /// The worker's memory limit was hit during the call (its OOM count rose).
    pub memory_limit: bool,
    /// A worker was there (false: one was started for this call).
    pub warm: bool,
}
