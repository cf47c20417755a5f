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
    /// Seconds the call may wait for a worker while the node is busy (default: its own
    /// timeouts, compile and run, together; at most 600). Past it the call is answered 429
    /// with Retry-After.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(minimum = 0.001, maximum = 600))]
    pub queue_timeout: Option<f64>,
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
    /// The project the call is made for: calls waiting on a node take turns by project.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub project: Option<String>,
    /// How long the call may wait on the node for memory and a worker, milliseconds (none:
    /// its steps' timeouts together).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wait_ms: Option<u64>,
}

impl NodeCall {
    /// How long the call may wait for memory and a worker: `wait_ms`, else its steps'
    /// timeouts together (its own budget).
    pub fn wait(&self) -> std::time::Duration {
        self.wait_ms.map_or_else(
            || {
                self.spec
                    .steps
                    .iter()
                    .map(|s| std::time::Duration::from_millis(s.timeout_ms))
                    .sum()
            },
            std::time::Duration::from_millis,
        )
    }
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

/// `POST /v1/fncall/batch`: one program over many test cases — compiled once, each case run
/// with its own stdin and judged by a checker.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct FnCallBatchRequest {
    /// Language, as for `/v1/fncall/run`.
    pub language: String,
    /// The program's source.
    #[cfg_attr(feature = "openapi", schema(max_length = 4194304))]
    pub code: String,
    /// The test cases, in order (1 to 1000).
    #[cfg_attr(feature = "openapi", schema(min_items = 1, max_items = 1000))]
    pub cases: Vec<TestCase>,
    /// How a case's output is judged against its `expected` (default `exact`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checker: Option<Checker>,
    /// Image whose toolchains run it (default `host`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
    /// More files beside the program: path → content, base64.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub files: BTreeMap<String, String>,
    /// Seconds each case may run (default 10, at most 300).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(minimum = 0.001, maximum = 300))]
    pub timeout: Option<f64>,
    /// Seconds the compile may take (default 30, at most 300).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(minimum = 0.001, maximum = 300))]
    pub compile_timeout: Option<f64>,
    /// Memory of each run (default 512Mi, 16Mi to 16Gi).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(value_type = Option<String>, example = "512Mi"))]
    pub memory: Option<ByteSize>,
    /// Output kept of each case's stdout and stderr (default 1Mi; all cases together at most
    /// 64Mi).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(value_type = Option<String>, example = "1Mi"))]
    pub max_output: Option<ByteSize>,
    /// The project it runs for (default: the key's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub project: Option<String>,
    /// Seconds each chunk of cases may wait for a worker while the node is busy (default: its own
    /// timeouts, compile and run, together; at most 600). Past it the call is answered 429
    /// with Retry-After.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(minimum = 0.001, maximum = 600))]
    pub queue_timeout: Option<f64>,
}

/// One test case.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct TestCase {
    /// Standard input of the run.
    #[serde(default)]
    pub stdin: String,
    /// The expected output; without it the case is only run (`passed` absent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expected: Option<String>,
}

/// How a case's output is compared with what is expected.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum Checker {
    /// Byte for byte.
    Exact,
    /// The same words (runs of non-whitespace) in the same order: spacing and line ends do not
    /// matter.
    Whitespace,
    /// Word by word; words that are both numbers may differ by `tolerance`, absolute or
    /// relative to the expected value (default 1e-6).
    Float {
        /// Allowed difference.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        tolerance: Option<f64>,
    },
    /// A program of your own, run for each case in a function call of its own language with
    /// the files `input.txt`, `output.txt` and `expected.txt` in its working directory (and
    /// their paths as arguments, testlib's order: input, output, expected). Exit 0 accepts;
    /// what it prints is the case's `checker_message`.
    Custom {
        /// Its language.
        language: String,
        /// Its source.
        code: String,
    },
}

/// One case's outcome.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct CaseResult {
    /// How the run ended.
    pub status: FnCallStatus,
    /// The run.
    pub run: StepOutcome,
    /// Whether the output matched (absent without `expected`, or when the run failed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub passed: Option<bool>,
    /// What a custom checker printed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checker_message: Option<String>,
}

/// The answer to a batch.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct FnCallBatchResult {
    /// `ok`, or `compile_error` (then no case ran).
    pub status: FnCallStatus,
    /// The compile, for compiled languages.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compile: Option<StepOutcome>,
    /// Each case, in order.
    pub cases: Vec<CaseResult>,
    /// Cases that passed.
    pub passed: usize,
    /// Nodes that ran it.
    pub nodes: Vec<String>,
}
