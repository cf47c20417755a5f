//! The REST API's bodies (`/v1/...`), shared by the control plane, the node daemon and the SDKs.
//!
//! Which operation is legal in which state is documented on each route in the OpenAPI
//! document (`/v1/openapi.json`); the short version: every operation works on a `running`
//! sandbox, and every operation on a `paused` sandbox resumes it first (transparent resume),
//! except `pause` itself and `delete`.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::id::{NodeId, SandboxId};
use crate::size::ByteSize;

/// The kind of isolation a sandbox runs in. Each node reports the backends it has; placement
/// sends a create only to nodes that have the one asked for.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum BackendKind {
    /// Linux namespaces, cgroups and seccomp around a guest agent (Warren's own runtime).
    #[default]
    Container,
}

impl BackendKind {
    /// The backend's wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            BackendKind::Container => "container",
        }
    }
}

impl std::fmt::Display for BackendKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// `POST /v1/sandboxes`: create a sandbox.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct CreateSandbox {
    /// Image: one name (e.g. `host`, the built-in image made from the host's own /usr, or an
    /// imported one such as `base/python:3.12`), or an ordered list of names, bottom layer
    /// first, as a JSON array or a comma-separated string (`base/python:3.12,tk/agent:v3`).
    /// Upper layers win where they hold the same path.
    #[serde(deserialize_with = "image_list")]
    #[cfg_attr(
        feature = "openapi",
        schema(
            pattern = "^[a-z0-9][a-z0-9._-]*(/[a-z0-9][a-z0-9._-]*)*([:@][A-Za-z0-9._-]{1,128})?(,[a-z0-9][a-z0-9._-]*(/[a-z0-9][a-z0-9._-]*)*([:@][A-Za-z0-9._-]{1,128})?)*$"
        )
    )]
    pub image: String,
    /// The backend to run it in; default `container`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backend: Option<BackendKind>,
    /// The training task this sandbox belongs to; task-level operations act on all of a task.
    /// 1 to 128 letters, digits and `. _ - : /`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(pattern = "^[A-Za-z0-9._:/-]{1,128}$"))]
    pub task: Option<String>,
    /// The project it belongs to (a path, `root/rl/job-42`): quotas count it there, and only
    /// keys holding permissions there see it. Default: the key's project.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub project: Option<String>,
    /// CPU request in millicores (1000 = one core): what the node's admission counts, and a
    /// latency-sensitive sandbox's weight. 0 to 1000 × the node's cores (at least 10 for
    /// `qos: ls`). Default: the node's `default_cpu` (10).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu: Option<u32>,
    /// CPU limit in millicores, enforced by the kernel (a CFS quota): 10 to 1000 × the node's
    /// cores, at least `cpu`. Default: the node's `default_cpu_limit` (2000, at most its
    /// cores), or `cpu` where that is more.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(minimum = 10))]
    pub cpu_limit: Option<u32>,
    /// Memory request, e.g. `64Mi` or a number of bytes: what the node's admission counts.
    /// At most the node's physical memory. Default: the node's `default_memory` (64Mi).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory: Option<ByteSize>,
    /// Memory limit, enforced by the kernel (past it the sandbox's processes are OOM-killed):
    /// 16Mi to the node's physical memory, at least `memory`. Default: the node's
    /// `default_memory_limit` (2Gi, at most its physical memory), or `memory` where that is
    /// more.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_limit: Option<ByteSize>,
    /// QoS class: `be` (best-effort, the default: runs at idle CPU priority, so it takes only
    /// CPU no latency-sensitive sandbox wants) or `ls` (latency-sensitive: weighted by its CPU
    /// request, and its memory request is protected from reclaim where the kernel can).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub qos: Option<QosClass>,
    /// Most processes and threads the sandbox may hold: 16 to the node's `max_pids`. Default
    /// 1024.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(minimum = 16))]
    pub pids: Option<u32>,
    /// Disk quota of the sandbox's writable layer, e.g. `10Gi`: writes past it fail with
    /// "Disk quota exceeded" inside the sandbox. Default: the node's `default_disk` (10Gi), at
    /// most its disk pool.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub disk: Option<ByteSize>,
    /// Absolute lifetime in seconds, 1 to the node's `max_timeout`; the sandbox is killed when
    /// it passes. Default 3600.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(minimum = 1))]
    pub timeout: Option<u64>,
    /// Free-form labels, filterable in list: at most 64, keys of 1 to 63 letters, digits and
    /// `. _ - : /`, values of at most 256 bytes.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
    /// Node labels the sandbox's node must have, all of them (e.g. `{"gpu": "h200"}`; a
    /// node's labels are its configuration's `labels`, shown by `warren node ls`). Placement
    /// considers only nodes that match; 400 when no node of the cluster does. At most 16.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub node_selector: BTreeMap<String, String>,
    /// Environment variables for every command run in the sandbox: at most 256, names of
    /// letters, digits and `_` not starting with a digit, no NUL, 32 KiB in all.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub env: BTreeMap<String, String>,
    /// Seconds without API activity (commands, files, processes) after which `on_idle`
    /// happens, 1 to the node's `max_timeout`. None: never idle.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(minimum = 1))]
    pub idle_timeout: Option<u64>,
    /// What idleness does: `pause` (default; the next operation resumes it) or `stop`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub on_idle: Option<IdleAction>,
    /// Record every exec and file write in the sandbox's trajectory log
    /// (`GET /v1/sandboxes/{id}/trajectory`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub trajectory: bool,
    /// A builder sandbox, for an image build (`warren image build` makes one): commands run
    /// as root hold what builds need (`useradd`, `chown`, package installs: `CAP_CHOWN`,
    /// `CAP_DAC_OVERRIDE`, `CAP_FOWNER`, `CAP_FSETID`, `CAP_KILL`, `CAP_SETUID`, `CAP_SETGID`,
    /// `CAP_SETFCAP`, `CAP_NET_BIND_SERVICE`, `CAP_SYS_CHROOT`, `CAP_AUDIT_WRITE`), within
    /// the sandbox's namespaces. Never make an agent's sandbox a builder: in every other
    /// sandbox root holds no capability. Layered images only (not `host`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub builder: bool,
    /// Its network: `{"mode": "none"}` for loopback only, or rules of what it may reach
    /// (`{"allow": [{"domain": "pypi.org"}, {"cidr": "203.0.113.0/24", "ports": "443"}]}`); see
    /// `NetworkPolicy`. Default: the node's — an interface with everything outbound denied
    /// (`filtered`, no rules), or loopback only on a node without a sandbox network. Changed
    /// later with `PUT /v1/sandboxes/{id}/network`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network: Option<crate::net::NetworkPolicy>,
    /// A trajectory log to replay: the new sandbox re-applies it to rebuild its state, then
    /// answers the same leading operations with the recorded results (see
    /// [`TrajectoryEntry`]). Implies `trajectory`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replay: Option<Vec<TrajectoryEntry>>,
    /// The image resolved by the control plane's catalog (layers and defaults), for the node.
    /// Whatever a client sends here is replaced.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(ignore))]
    pub resolved: Option<ResolvedImage>,
    /// A function-call worker, made by the node itself for its pools: its guest runs a call
    /// server. Never read from a request (no client can set it).
    #[serde(skip)]
    #[cfg_attr(feature = "openapi", schema(ignore))]
    pub fncall_worker: bool,
}

/// An image list resolved into layers (bottom first, each once) and defaults (upper images
/// win): what a node needs to build a sandbox's root.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ResolvedImage {
    /// Layer digests, bottom first.
    pub layers: Vec<String>,
    /// Default environment (a create's `env` wins).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub env: BTreeMap<String, String>,
    /// Default user for commands.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user: Option<String>,
    /// Default working directory for commands.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workdir: Option<String>,
}

/// What an idle sandbox does.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum IdleAction {
    /// Freeze it; the next operation resumes it.
    #[default]
    Pause,
    /// Kill it.
    Stop,
}

/// The state of a sandbox.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum SandboxState {
    /// Running and answering.
    Running,
    /// Frozen: processes stopped, memory kept. Any operation resumes it.
    Paused,
    /// Its node does not answer the control plane: listed as last seen, in a state not known
    /// now (never dropped from lists while its node is a member). Operations on it are 503s
    /// naming the node until it answers again.
    Unknown,
}

impl SandboxState {
    /// The state's wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            SandboxState::Running => "running",
            SandboxState::Paused => "paused",
            SandboxState::Unknown => "unknown",
        }
    }
}

/// A sandbox's QoS class: how its CPU is scheduled against its neighbours'.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "lowercase")]
pub enum QosClass {
    /// Latency-sensitive: CPU weighted by its request; best-effort sandboxes yield to it.
    Ls,
    /// Best-effort: idle CPU priority (`cpu.idle`, or `SCHED_IDLE` where the kernel lacks it).
    #[default]
    Be,
}

impl QosClass {
    /// `ls` or `be`.
    pub fn as_str(self) -> &'static str {
        match self {
            QosClass::Ls => "ls",
            QosClass::Be => "be",
        }
    }
}

impl std::str::FromStr for QosClass {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "ls" => Ok(QosClass::Ls),
            "be" => Ok(QosClass::Be),
            _ => Err(format!(
                "unknown QoS class {s:?}: give ls (latency-sensitive) or be (best-effort)"
            )),
        }
    }
}

/// Resources a sandbox was given.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Resources {
    /// CPU request in millicores (what admission counts).
    pub cpu: u32,
    /// CPU limit in millicores (what the kernel enforces).
    #[serde(default)]
    pub cpu_limit: u32,
    /// Memory request in bytes (what admission counts).
    pub memory: ByteSize,
    /// Memory limit in bytes (what the kernel enforces).
    #[serde(default)]
    pub memory_limit: ByteSize,
    /// QoS class.
    #[serde(default)]
    pub qos: QosClass,
    /// Process and thread limit.
    pub pids: u32,
    /// Disk quota of the writable layer; absent where the node enforces none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub disk: Option<ByteSize>,
}

impl Resources {
    /// Fills the limits of a record written before requests and limits were separate (its
    /// `cpu` and `memory` were the limits).
    pub fn normalized(mut self) -> Resources {
        if self.cpu_limit == 0 {
            self.cpu_limit = self.cpu.max(10);
        }
        if self.memory_limit.bytes() == 0 {
            self.memory_limit = self.memory;
        }
        self
    }
}

/// `GET /v1/sandboxes/{id}/metrics`: what a sandbox uses, measured when asked.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct SandboxMetrics {
    /// When measured, ms since the epoch.
    pub timestamp_ms: u64,
    /// CPU time its processes used since it started, ns (those still running, and those that
    /// ended and were reaped).
    pub cpu_used_ns: u64,
    /// Its CPU use as a percentage of its CPU limit: between the previous metrics read (within
    /// the last minute) and this one, else averaged over its life so far.
    pub cpu_used_pct: f64,
    /// Its CPU limit, millicores.
    pub cpu_limit: u32,
    /// Memory charged to it, bytes (page cache included).
    pub memory_used: u64,
    /// Page cache among `memory_used`, bytes (the kernel can reclaim it).
    pub memory_cache: u64,
    /// Its memory limit, bytes.
    pub memory_limit: u64,
    /// Bytes its writable layer holds, where a disk quota measures it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub disk_used: Option<u64>,
    /// Its disk quota, bytes, where one holds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub disk_limit: Option<u64>,
}

/// A sandbox as the API shows it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Sandbox {
    /// The sandbox id; its first six characters are its node's id.
    pub id: SandboxId,
    /// The node that runs it.
    pub node: NodeId,
    /// The pool of that node (`default`, or `burst` for a node used only when the others are
    /// busy): where it went.
    #[serde(default = "default_pool")]
    pub pool: String,
    /// The backend it runs in.
    pub backend: BackendKind,
    /// The image it was created from (names, bottom first, comma-separated).
    pub image: String,
    /// The digests of its read-only layers, bottom first; empty for the built-in `host` image.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub layers: Vec<String>,
    /// Its training task, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub task: Option<String>,
    /// Its project.
    #[serde(default = "root_project")]
    pub project: String,
    /// Its labels.
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    /// Running or paused (or `unknown` while its node does not answer).
    pub state: SandboxState,
    /// Its resource limits.
    pub resources: Resources,
    /// Creation time, RFC 3339.
    pub created_at: String,
    /// When its absolute timeout kills it, RFC 3339.
    pub expires_at: String,
    /// Idle timeout in seconds, if it has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idle_timeout: Option<u64>,
    /// What idleness does.
    #[serde(default)]
    pub on_idle: IdleAction,
    /// Whether its trajectory is recorded.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub trajectory: bool,
    /// The digest (`sha256:<hex>`) of the guest agent binary it runs; absent where the node
    /// does not know (sandboxes started before nodes recorded it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub guest: Option<String>,
    /// A builder sandbox (see `CreateSandbox.builder`): its root commands hold the build
    /// capabilities.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub builder: bool,
    /// Its network: mode, addresses and policy (absent from nodes older than networks).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network: Option<crate::net::NetworkStatus>,
}

/// `POST /v1/sandboxes/{id}/timeout`: a new absolute lifetime, counted from now.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct SetTimeout {
    /// Seconds from now until the sandbox is killed: 1 to the node's `max_timeout`.
    #[cfg_attr(feature = "openapi", schema(minimum = 1))]
    pub timeout: u64,
}

/// `GET /v1/sandboxes`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct SandboxList {
    /// The sandboxes that matched, oldest first.
    pub sandboxes: Vec<Sandbox>,
}

/// `POST /v1/sandboxes/{id}/exec` and `POST /v1/sandboxes/{id}/processes`.
///
/// Give either `cmd` (a shell string run by `/bin/sh -c`) or `argv` (run directly, found on
/// `PATH`), not both.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct ExecRequest {
    /// A shell command line, run with `/bin/sh -c`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cmd: Option<String>,
    /// A program and its arguments, run without a shell.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub argv: Option<Vec<String>>,
    /// Extra environment variables (over the sandbox's own).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub env: BTreeMap<String, String>,
    /// Working directory; default the user's home.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cwd: Option<String>,
    /// User name or uid to run as; default `user` (uid 1000). `root` runs as root without
    /// capabilities.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user: Option<String>,
    /// Standard input as text.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stdin: Option<String>,
    /// Standard input as base64, for binary input.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stdin_b64: Option<String>,
    /// Keep stdin open after `stdin`/`stdin_b64` (if given), for input sent later with
    /// `POST /v1/sandboxes/{id}/processes/{process_id}/stdin` (which also closes it).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub stdin_open: bool,
    /// Run on a pseudo-terminal of this size: the command is its session's controlling
    /// terminal, its output (stdout and stderr together, as a terminal shows them) comes as
    /// `stdout`, input goes in through `.../stdin`, and `.../resize` changes the size. `TERM`
    /// defaults to `xterm-256color`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pty: Option<PtySize>,
    /// Seconds before the command (its whole process group) is killed. Default 600 for exec,
    /// none for background processes; 0 means no limit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout: Option<f64>,
    /// Output kept per stream (stdout, stderr); the rest is counted, not kept. Default 64Mi.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_output: Option<ByteSize>,
    /// Stream the output as newline-delimited JSON events ([`ExecEvent`]) instead of one reply.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub stream: bool,
    /// Who runs it: `agent` (default) or `grader`, a separate user that agent processes cannot
    /// signal, trace or read, seeing the image's pristine /usr, /bin, /lib, /etc (whatever the
    /// agent changed there, even as root) and the agent's workspace (/home/user, /workspace).
    /// A grader command takes no `user`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub role: Option<Role>,
}

/// Who runs a command.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum Role {
    /// The agent: the sandbox as the agent left it, as `user` (default uid 1000) or `root`.
    #[default]
    Agent,
    /// The grader: pristine system files, the agent's workspace, its own uid.
    Grader,
}

/// How a command ended.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ExitStatus {
    /// Exit code; 128 + the signal number when a signal ended it (as shells report it); 127
    /// when the program was not found, 126 when it could not be executed.
    pub exit_code: i32,
    /// The signal that ended it, if one did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signal: Option<i32>,
    /// Whether the command's timeout killed it.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub timed_out: bool,
    /// Bytes the command wrote to stdout, kept or not.
    pub stdout_bytes: u64,
    /// Bytes the command wrote to stderr, kept or not.
    pub stderr_bytes: u64,
    /// Whether stdout was cut at `max_output`.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub stdout_truncated: bool,
    /// Whether stderr was cut at `max_output`.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub stderr_truncated: bool,
    /// Wall time from start to exit, milliseconds.
    pub duration_ms: u64,
}

/// How output bytes are carried in JSON.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum Encoding {
    /// The text as is (the bytes were valid UTF-8).
    #[default]
    Utf8,
    /// Base64 of the bytes (they were not valid UTF-8).
    Base64,
}

impl Encoding {
    fn is_utf8(&self) -> bool {
        *self == Encoding::Utf8
    }
}

/// The reply to a plain (non-streaming) exec.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ExecResult {
    /// How the command ended.
    #[serde(flatten)]
    pub status: ExitStatus,
    /// Standard output (up to `max_output`).
    pub stdout: String,
    /// Standard error (up to `max_output`).
    pub stderr: String,
    /// `base64` when stdout was not valid UTF-8.
    #[serde(default, skip_serializing_if = "Encoding::is_utf8")]
    pub stdout_encoding: Encoding,
    /// `base64` when stderr was not valid UTF-8.
    #[serde(default, skip_serializing_if = "Encoding::is_utf8")]
    pub stderr_encoding: Encoding,
    /// This is the recorded result of a replayed trajectory: the command was not run again.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub replayed: bool,
    /// This operation did not match the replayed trajectory, so replay ended here and it ran
    /// live (as will every later one).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub replay_ended: bool,
}

/// One line of a streaming exec (`"stream": true`): newline-delimited JSON, one event a line.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ExecEvent {
    /// The command started.
    Start {
        /// Its process id inside the sandbox's process table (for re-attaching).
        process_id: u64,
        /// Its pid inside the sandbox.
        pid: i32,
        /// The events that follow are a replayed trajectory's recorded ones: the command did
        /// not run again (process_id and pid are then 0).
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        replayed: bool,
        /// The command did not match the replayed trajectory: replay ended, it runs live.
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        replay_ended: bool,
    },
    /// Bytes written to stdout, base64.
    Stdout {
        /// Base64 of the bytes.
        data: String,
    },
    /// Bytes written to stderr, base64.
    Stderr {
        /// Base64 of the bytes.
        data: String,
    },
    /// The command ended; always the last event on success.
    Exit(ExitStatus),
    /// The exec failed; always the last event when sent.
    Error(crate::error::ApiError),
}

/// A background process in a sandbox.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ProcessInfo {
    /// Its id in the sandbox's process table (not a pid: never reused).
    pub process_id: u64,
    /// Its pid inside the sandbox.
    pub pid: i32,
    /// What runs.
    pub argv: Vec<String>,
    /// Who runs it.
    pub user: String,
    /// Whether it still runs.
    pub running: bool,
    /// How it ended, once it has.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exit: Option<ExitStatus>,
    /// Whether it runs on a pseudo-terminal (its output is then all `stdout`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub pty: bool,
    /// Whether its stdin is open for input (`POST .../processes/{process_id}/stdin`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub stdin_open: bool,
}

/// `GET /v1/sandboxes/{id}/processes`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ProcessList {
    /// Running processes and finished ones not yet collected, oldest first.
    pub processes: Vec<ProcessInfo>,
}

/// A terminal's size, in characters (each 1 to 4096).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct PtySize {
    /// Columns.
    #[cfg_attr(feature = "openapi", schema(minimum = 1, maximum = 4096))]
    pub cols: u16,
    /// Rows.
    #[cfg_attr(feature = "openapi", schema(minimum = 1, maximum = 4096))]
    pub rows: u16,
}

impl PtySize {
    /// Largest columns or rows accepted.
    pub const MAX: u16 = 4096;

    /// Checks both sides are 1 to [`PtySize::MAX`].
    pub fn check(&self) -> Result<(), String> {
        if (1..=Self::MAX).contains(&self.cols) && (1..=Self::MAX).contains(&self.rows) {
            Ok(())
        } else {
            Err(format!(
                "a terminal of {} columns and {} rows: each must be 1 to {}",
                self.cols,
                self.rows,
                Self::MAX
            ))
        }
    }
}

/// `POST /v1/sandboxes/{id}/processes/{process_id}/stdin`: input for a process started with
/// `stdin_open` or `pty`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct StdinRequest {
    /// Input as text.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data: Option<String>,
    /// Input as base64, for binary input.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data_b64: Option<String>,
    /// Close stdin after the input (the process reads end of file). A terminal is not
    /// closed: send its end-of-file character (`\u0004`) instead.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub close: bool,
}

/// What changed in a watched directory.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum FsEventKind {
    /// A file or directory was made, or moved in.
    Create,
    /// A file was written.
    Write,
    /// A file or directory was removed.
    Remove,
    /// A file or directory was moved away (renamed: its new name, if still watched, is a
    /// `create`).
    Rename,
    /// Permissions, ownership or times changed.
    Chmod,
}

/// One change under a watched directory.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct FsEvent {
    /// What happened.
    pub kind: FsEventKind,
    /// Where, relative to the watched directory.
    pub path: String,
    /// The entry as it is when the events are collected (watches made with `entries`; none
    /// for what is gone).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub entry: Option<FileEntry>,
}

/// `POST /v1/sandboxes/{id}/watches`: watch a directory.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct WatchRequest {
    /// The directory (absolute, or relative to the user's home).
    pub path: String,
    /// Its subdirectories too, those made later included.
    #[serde(default)]
    pub recursive: bool,
    /// Whose view: the directories must be theirs to read. Default `user`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user: Option<String>,
    /// Give each event the entry it names (as it is when collected).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub entries: bool,
}

/// A watch: `POST /v1/sandboxes/{id}/watches`' answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct WatchInfo {
    /// Its id, for its events and its removal.
    pub watch_id: u64,
}

/// `GET /v1/sandboxes/{id}/watches/{watch_id}/events`: what changed since the last call.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct WatchEvents {
    /// The changes, oldest first.
    pub events: Vec<FsEvent>,
    /// Some were lost since the last call (more than the sandbox keeps per watch).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub overflowed: bool,
}

/// `POST /v1/sandboxes/{id}/processes/{process_id}/signal`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct SignalRequest {
    /// Signal name (`TERM`, `SIGKILL`, `INT`, ...) or number.
    pub signal: String,
}

/// The kind of a file system entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum FileKind {
    /// A regular file.
    File,
    /// A directory.
    Dir,
    /// A symbolic link.
    Symlink,
    /// Anything else (device, socket, fifo).
    Other,
}

/// A file or directory in a sandbox.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct FileEntry {
    /// Its name (last path component).
    pub name: String,
    /// Its absolute path in the sandbox.
    pub path: String,
    /// What it is.
    pub kind: FileKind,
    /// Size in bytes.
    pub size: u64,
    /// Permission bits, e.g. 420 (0644).
    pub mode: u32,
    /// Owner uid.
    pub uid: u32,
    /// Owner gid.
    pub gid: u32,
    /// Last modification, seconds since the epoch.
    pub modified: i64,
    /// Where a symlink points.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub link_target: Option<String>,
    /// Its metadata: the `user.e2b.<key>` extended attributes (the names E2B's envd uses), set
    /// by an upload's `metadata` or by programs in the sandbox.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub metadata: BTreeMap<String, String>,
}

/// File metadata's bounds: at most this many keys per file.
pub const FILE_METADATA_MAX_KEYS: usize = 64;
/// ... keys of at most this many bytes ...
pub const FILE_METADATA_MAX_KEY: usize = 200;
/// ... and values of at most this many bytes.
pub const FILE_METADATA_MAX_VALUE: usize = 4096;

/// Checks upload metadata (HTTP token keys, lower-cased as stored; printable ASCII values;
/// the bounds above) and returns it with its keys lower-cased.
pub fn check_file_metadata(
    m: &BTreeMap<String, String>,
) -> Result<BTreeMap<String, String>, String> {
    if m.len() > FILE_METADATA_MAX_KEYS {
        return Err(format!(
            "{} metadata keys: at most {FILE_METADATA_MAX_KEYS}",
            m.len()
        ));
    }
    let token = |c: char| c.is_ascii_alphanumeric() || "!#$%&'*+-.^_`|~".contains(c);
    let mut out = BTreeMap::new();
    for (k, v) in m {
        if k.is_empty() || k.len() > FILE_METADATA_MAX_KEY || !k.chars().all(token) {
            return Err(format!(
                "metadata key {k:?}: 1 to {FILE_METADATA_MAX_KEY} letters, digits or !#$%&'*+-.^_`|~"
            ));
        }
        if v.len() > FILE_METADATA_MAX_VALUE || !v.chars().all(|c| (' '..='~').contains(&c)) {
            return Err(format!(
                "metadata value of {k:?}: at most {FILE_METADATA_MAX_VALUE} printable ASCII characters"
            ));
        }
        out.insert(k.to_ascii_lowercase(), v.clone());
    }
    Ok(out)
}

/// `GET /v1/sandboxes/{id}/files/list`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct FileList {
    /// The directory's entries, sorted by name.
    pub entries: Vec<FileEntry>,
}

/// `POST /v1/sandboxes/{id}/files/mkdir`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct MkdirRequest {
    /// Directory to make.
    pub path: String,
    /// Make missing parents too (default true).
    #[serde(default = "yes")]
    pub parents: bool,
    /// Acting user (default `user`): the directory belongs to them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user: Option<String>,
}

/// `POST /v1/sandboxes/{id}/files/rename`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct RenameRequest {
    /// Current path.
    pub from: String,
    /// New path.
    pub to: String,
    /// Acting user (default `user`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user: Option<String>,
}

fn yes() -> bool {
    true
}

/// A task-level operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum TaskAction {
    /// Pause every sandbox of the task.
    Pause,
    /// Resume every sandbox of the task.
    Resume,
    /// Kill every sandbox of the task.
    Stop,
}

impl TaskAction {
    /// The action's wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            TaskAction::Pause => "pause",
            TaskAction::Resume => "resume",
            TaskAction::Stop => "stop",
        }
    }
}

/// A sandbox a task-level operation failed on.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct TaskFailure {
    /// The sandbox.
    pub id: SandboxId,
    /// Why.
    pub error: crate::error::ApiError,
}

/// `POST /v1/tasks/{task}/pause|resume|stop`: what happened to the task's sandboxes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct TaskResult {
    /// The task.
    pub task: String,
    /// What was done.
    pub action: TaskAction,
    /// How many sandboxes it succeeded on.
    pub succeeded: u32,
    /// The ones it failed on, with why.
    #[serde(default)]
    pub failed: Vec<TaskFailure>,
    /// For `pause`: memory the paused sandboxes' cgroups gave back before the answer, bytes
    /// (page cache, and anonymous memory where the node has swap). The nodes go on reclaiming
    /// what they had no time for in the background, so more is freed after the answer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_freed: Option<u64>,
    /// Creates of the task still in flight when it acted: after a pause they land paused, after
    /// a stop they are killed as they land (their create is answered 410), after a resume they
    /// run.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub creates_in_flight: u32,
}

/// `PUT /v1/tasks/{task}/network`: how the task's sandboxes took a new network policy.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct TaskNetworkResult {
    /// The task.
    pub task: String,
    /// How many sandboxes took it.
    pub succeeded: u32,
    /// The ones that did not, with why (a sandbox created with network mode `none` has no
    /// interface to filter).
    #[serde(default)]
    pub failed: Vec<TaskFailure>,
}

/// A task and how many sandboxes it has.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct TaskInfo {
    /// The task's name.
    pub name: String,
    /// Its sandboxes.
    pub sandboxes: u32,
    /// How many of them run.
    pub running: u32,
    /// How many are paused.
    pub paused: u32,
}

/// `GET /v1/tasks`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct TaskList {
    /// Every task with at least one sandbox, by name.
    pub tasks: Vec<TaskInfo>,
}

/// One operation of a trajectory log (`GET /v1/sandboxes/{id}/trajectory` gives them as JSON
/// lines, oldest first).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum TrajectoryEntry {
    /// A command and what it gave.
    Exec {
        /// What ran.
        argv: Vec<String>,
        /// Its extra environment.
        #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
        env: BTreeMap<String, String>,
        /// Its working directory, as asked.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        cwd: Option<String>,
        /// Who ran it.
        user: String,
        /// SHA-256 of its stdin, hex (empty input: none).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        stdin_sha256: Option<String>,
        /// Its stdin, base64, so a replay can give it again.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        stdin_b64: Option<String>,
        /// What it gave.
        result: ExecResult,
    },
    /// A file written through the API.
    WriteFile {
        /// Where.
        path: String,
        /// As whom.
        user: String,
        /// Mode asked for, if any.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        mode: Option<u32>,
        /// SHA-256 of the content, hex.
        sha256: String,
        /// The content, base64.
        content_b64: String,
    },
}

/// A node that gave no part of an answer the control plane gathered from every node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct NodeFailure {
    /// The node.
    pub node: NodeId,
    /// Why: `unavailable` when it did not answer (down, unreachable, or slower than the
    /// control plane's `node_timeout_ms`), else the error it answered with.
    pub error: crate::error::ApiError,
}

/// An answer gathered from every node (`GET /v1/sandboxes`, `/v1/tasks`, `/v1/events`,
/// `/v1/images/stats`, `/v1/nodes`, `POST /v1/tasks/{task}/{action}`): what the nodes that
/// answered said, and the nodes that did not, whose part is missing.
///
/// On the wire the answer's own fields sit beside `unreachable`, which is left out when every
/// node answered, so a client that does not know it reads the answer as before.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Gathered<T> {
    /// The answer, from the nodes that gave it.
    #[serde(flatten)]
    pub answer: T,
    /// The nodes that did not answer, with why. Empty (and left out) when every node did.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub unreachable: Vec<NodeFailure>,
}

impl<T> Gathered<T> {
    /// An answer every node gave.
    pub fn complete(answer: T) -> Self {
        Gathered {
            answer,
            unreachable: Vec::new(),
        }
    }

    /// Whether every node answered.
    pub fn is_complete(&self) -> bool {
        self.unreachable.is_empty()
    }
}

impl<T> std::ops::Deref for Gathered<T> {
    type Target = T;

    fn deref(&self) -> &T {
        &self.answer
    }
}

/// A node as the control plane sees it: `GET /v1/nodes`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct NodeInfo {
    /// The node's id.
    pub id: NodeId,
    /// Warren version it runs.
    pub version: String,
    /// How many sandboxes it runs.
    pub sandboxes: u32,
    /// Most sandboxes it admits.
    pub max_sandboxes: u32,
    /// Creates starting now: each holds one of its start slots (`create_slots`).
    #[serde(default)]
    pub creates_starting: u32,
    /// Creates waiting for a start slot now; they start in arrival order.
    #[serde(default)]
    pub creates_waiting: u32,
    /// Creates it starts at once (`max_concurrent_creates`).
    #[serde(default)]
    pub create_slots: u32,
    /// The longest a create waited for a start slot over the last minute, those still waiting
    /// included, milliseconds.
    #[serde(default)]
    pub create_wait_ms: u64,
    /// Memory requested by its sandboxes (the sum of their requests), bytes.
    pub memory_reserved: ByteSize,
    /// Memory requests it may admit in all (physical memory × `memory_overcommit`), bytes.
    pub memory_allocatable: ByteSize,
    /// Memory the kernel reports available now (`MemAvailable`: free memory plus what it can
    /// reclaim), bytes.
    pub memory_available: ByteSize,
    /// Physical memory, bytes.
    #[serde(default)]
    pub memory_total: ByteSize,
    /// Memory charged to its sandboxes now (their cgroups' use, page cache included), bytes:
    /// measured, not promised.
    #[serde(default)]
    pub memory_used: ByteSize,
    /// CPU requested by its sandboxes, millicores.
    #[serde(default)]
    pub cpu_requested: u64,
    /// CPU requests it may admit in all (cores × 1000 × `cpu_overcommit`), millicores.
    #[serde(default)]
    pub cpu_allocatable: u64,
    /// CPU cores.
    #[serde(default)]
    pub cpu_cores: u32,
    /// The host's CPU use between its two latest load samples (about a second apart), percent
    /// of all cores.
    #[serde(default)]
    pub cpu_used_pct: f64,
    /// Pressure stall information where the kernel has it (`/proc/pressure`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pressure: Option<Pressure>,
    /// What the kernel supports for QoS, probed when the node started.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub qos: Option<QosSupport>,
    /// Threads in use on the host, and the host's limit (`kernel.pid_max`).
    pub threads: u32,
    /// `kernel.pid_max`.
    pub pid_max: u32,
    /// The cgroup layout it found (`v1`, `v2`, `hybrid`).
    pub cgroups: String,
    /// Largest file upload it accepts, bytes.
    pub max_upload: ByteSize,
    /// Size of its disk pool (writable layers under quota); absent where it enforces no disk
    /// quotas.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub disk_pool: Option<ByteSize>,
    /// Sum of the disk quotas of its sandboxes.
    #[serde(default)]
    pub disk_reserved: ByteSize,
    /// The backends it can run sandboxes in.
    #[serde(default)]
    pub backends: Vec<BackendKind>,
    /// The digest (`sha256:<hex>`) of the guest agent binary its new sandboxes run (the
    /// node's own copy of its `guest_binary`, made when it started).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub guest: Option<String>,
    /// A number that changes whenever the node's set of sandboxes does (a create, a removal,
    /// a re-adoption): the control plane asks for what changed only when it moved. 0 from a
    /// node that does not say.
    #[serde(default)]
    pub sandbox_generation: u64,
    /// The node's labels (its configuration's `labels`), for placement.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
    /// The pool it belongs to (`default`, or e.g. `burst`), from its configuration.
    #[serde(default = "default_pool")]
    pub pool: String,
    /// Whether new sandboxes are kept off it (`warren node cordon`); set by the control plane.
    #[serde(default)]
    pub cordoned: bool,
    /// Whether it answered the control plane's last poll; set by the control plane. A node
    /// that does not is listed with its last report.
    #[serde(default = "yes")]
    pub reachable: bool,
    /// Where the control plane reaches it (the URL it registered with), when it joined over
    /// the network.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub address: Option<String>,
    /// Its function-call worker pools, one per image and memory (none until a call came).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub fncall_pools: Vec<FnCallPool>,
    /// The most memory function calls may hold on it at once (`fncall_memory_share` of its
    /// memory admission); a call holds its memory only while it runs.
    #[serde(default)]
    pub fncall_budget: ByteSize,
    /// Memory running function calls hold now.
    #[serde(default)]
    pub fncall_held: ByteSize,
}

/// A node's pool of function-call workers for one image and memory size.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct FnCallPool {
    /// The image (its name as calls give it).
    pub image: String,
    /// The calls' memory (rounded up to a power of two; each worker's limit is 48 MiB more,
    /// its request while idle 16 MiB).
    pub memory: ByteSize,
    /// Idle workers, warm for the next call.
    pub idle: u32,
    /// Calls running now.
    pub busy: u32,
    /// Calls waiting now: for the node's FnCall memory budget, or for a worker.
    #[serde(default)]
    pub queued: u32,
    /// Workers being started now.
    #[serde(default)]
    pub starting: u32,
    /// How many idle workers it keeps now: its most calls in flight over the last seconds,
    /// at least 8, at most as many as its budget lets run at once.
    pub keep: u32,
    /// Calls asked of it since it was made (a pool left with no worker and no call is
    /// forgotten).
    pub calls: u64,
    /// Of those, calls that found no idle worker and waited for one (given back by another
    /// call, or started).
    pub cold_calls: u64,
    /// Workers it started, not counting starts that failed.
    pub workers_started: u64,
    /// Calls that waited past their deadline for the budget or a worker (answered 429, or 504
    /// on `/run_code`).
    #[serde(default)]
    pub timed_out: u64,
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

fn root_project() -> String {
    crate::project::ROOT.to_string()
}

fn default_pool() -> String {
    DEFAULT_POOL.to_string()
}

impl NodeInfo {
    /// What the control plane knows of a node it has not heard from yet: its id, and
    /// nothing else (zeros, not reachable).
    pub fn unknown(id: NodeId) -> NodeInfo {
        NodeInfo {
            id,
            version: String::new(),
            sandboxes: 0,
            max_sandboxes: 0,
            creates_starting: 0,
            creates_waiting: 0,
            create_slots: 0,
            create_wait_ms: 0,
            memory_reserved: ByteSize(0),
            memory_allocatable: ByteSize(0),
            memory_available: ByteSize(0),
            memory_total: ByteSize(0),
            memory_used: ByteSize(0),
            cpu_requested: 0,
            cpu_allocatable: 0,
            cpu_cores: 0,
            cpu_used_pct: 0.0,
            pressure: None,
            qos: None,
            threads: 0,
            pid_max: 0,
            cgroups: String::new(),
            max_upload: ByteSize(0),
            disk_pool: None,
            disk_reserved: ByteSize(0),
            backends: Vec::new(),
            guest: None,
            sandbox_generation: 0,
            labels: BTreeMap::new(),
            pool: default_pool(),
            cordoned: false,
            reachable: false,
            address: None,
            fncall_pools: Vec::new(),
            fncall_budget: ByteSize(0),
            fncall_held: ByteSize(0),
        }
    }
}

/// `GET /v1/node/sandboxes?since=N` (node API): what changed in a node's set of sandboxes
/// since its generation `N`, so the control plane's view of every node's sandboxes follows
/// without asking for all of them each time.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct SandboxChanges {
    /// The generation this answer brings the view to.
    pub generation: u64,
    /// `sandboxes` is the whole set (the node no longer holds the changes since `N`, or was
    /// restarted): the view replaces what it had.
    pub full: bool,
    /// Sandboxes added since `N` (or all of them), as they are now.
    pub sandboxes: Vec<Sandbox>,
    /// Sandboxes removed since `N`.
    #[serde(default)]
    pub removed: Vec<SandboxId>,
}

/// The pool a node is in unless its configuration says otherwise.
pub const DEFAULT_POOL: &str = "default";

/// The pool of nodes used only when the default pool is busy (cloud bursting), and only for
/// images the control plane's `burst_images` names.
pub const BURST_POOL: &str = "burst";

/// `POST /v1/cluster/nodes`: a node joins the cluster, or says it is still there (its
/// heartbeat). Authenticated by the cluster token, not an API key.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct NodeRegistration {
    /// The node's id (made once, kept in its state directory).
    #[cfg_attr(feature = "openapi", schema(value_type = String, pattern = "^[a-z][a-z0-9]{5}$"))]
    pub id: NodeId,
    /// Where the control plane reaches its API: `http://HOST:PORT`.
    pub url: String,
    /// Warren version it runs.
    pub version: String,
}

/// The answer to a node's registration.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct NodeRegistered {
    /// How often to say it is still there, milliseconds.
    pub heartbeat_ms: u64,
    /// Addresses the node's sandboxes must never reach, as the control plane resolved them:
    /// its database's and the cluster's nodes'. The node adds them to its always-denied
    /// ranges (which no `exempt` reopens).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[cfg_attr(feature = "openapi", schema(value_type = Vec<String>))]
    pub deny: Vec<std::net::IpAddr>,
}

/// The share of the last 10 seconds in which some task stalled for a resource (PSI `some
/// avg10`), percent.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Pressure {
    /// Waiting for CPU.
    pub cpu: f64,
    /// Waiting for memory (reclaim, swap-in, refaults).
    pub memory: f64,
    /// Waiting for I/O.
    pub io: f64,
}

/// What a node's kernel supports for QoS, probed at start; every field says what is, never
/// what was hoped for.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct QosSupport {
    /// The cgroup `cpu.idle` knob (kernel 5.15+; v2, and v1's cpu controller): best-effort
    /// sandboxes' cgroups are made idle.
    pub cpu_idle: bool,
    /// Without `cpu.idle`, best-effort sandboxes' commands run under `SCHED_IDLE` instead.
    pub sched_idle_fallback: bool,
    /// Simultaneous multithreading: `on`, `off`, `forceoff`, `notsupported` or
    /// `notimplemented` (`/sys/devices/system/cpu/smt/control`), or `unknown`.
    pub smt: String,
    /// Whether the kernel has core scheduling (`PR_SCHED_CORE`, `CONFIG_SCHED_CORE`).
    pub core_scheduling: bool,
    /// Whether latency-sensitive sandboxes get a core-scheduling cookie of their own: only
    /// with core scheduling and SMT on (without SMT no two tasks share a core anyway).
    pub core_scheduling_used: bool,
    /// Whether pressure stall information is readable.
    pub psi: bool,
    /// How a paused sandbox's memory is reclaimed: `memory.reclaim` (cgroup v2) or
    /// `limit` (cgroup v1: a temporary lower limit).
    pub memory_reclaim: String,
    /// Swap the node has, bytes: without it only page cache can be reclaimed.
    pub swap_total: u64,
}

/// `GET /v1/nodes`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct NodeList {
    /// Every node the control plane knows, answering or not.
    pub nodes: Vec<NodeInfo>,
}

/// `GET /v1/health`: no authentication; says the control plane answers and its nodes do.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Health {
    /// `ok`, or `degraded` when a node does not answer.
    pub status: String,
    /// Warren's version.
    pub version: String,
    /// Nodes that answered.
    pub nodes_up: u32,
    /// Nodes known.
    pub nodes: u32,
    /// The domain of the `<port>-<sandbox id>.<domain>` route to exposed ports, where the
    /// control plane has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sandbox_domain: Option<String>,
}

/// Accepts an image as a string or an array of strings; arrays become comma-separated.
fn image_list<'de, D: serde::Deserializer<'de>>(d: D) -> Result<String, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum OneOrMany {
        One(String),
        Many(Vec<String>),
    }
    match OneOrMany::deserialize(d)? {
        OneOrMany::One(s) => Ok(s),
        OneOrMany::Many(v) => {
            if v.iter().any(|s| s.contains(',')) {
                return Err(serde::de::Error::custom(
                    "an image name in a list cannot contain a comma",
                ));
            }
            Ok(v.join(","))
        }
    }
}

/// A named, versioned reference to an ordered list of layers (`GET /v1/images`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Image {
    /// Its name, e.g. `base/python:3.12` or `ws/django@4f2a1c`.
    pub name: String,
    /// Layer digests (`sha256:…`), bottom first.
    pub layers: Vec<String>,
    /// Total size of its layer files in bytes.
    pub size: u64,
    /// When it was made, RFC 3339.
    pub created_at: String,
    /// Who made it (the identity of the key that built it).
    pub creator: String,
    /// The project it belongs to: readable by keys of that subtree, usable by sandboxes of
    /// that project and below (`root`'s by every sandbox).
    #[serde(default = "crate::project::root")]
    pub project: String,
    /// The images it was built on, bottom first (for `image build`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub parents: Vec<String>,
    /// What it was made from: `directory`, `tar`, `tar+gzip`, `tar+zstd`, `oci`,
    /// `docker-save`, `erofs` or `build`.
    pub source: String,
    /// Default environment for its sandboxes (a create's `env` wins).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub env: BTreeMap<String, String>,
    /// Default user for commands, from the image's configuration.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user: Option<String>,
    /// Default working directory for commands.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workdir: Option<String>,
}

/// One layer file in the store.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Layer {
    /// `sha256:` and the hex digest of the EROFS file.
    pub digest: String,
    /// Size of the EROFS file in bytes.
    pub size: u64,
    /// When it was written, RFC 3339.
    pub created_at: String,
    /// Who wrote it.
    pub creator: String,
    /// What it was made from.
    pub source: String,
}

/// A layer with the images that name it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct LayerUse {
    /// The layer.
    pub layer: Layer,
    /// The images whose layer lists name it, by name; empty for an orphan (a layer that only
    /// a running sandbox, or nothing, still uses).
    pub images: Vec<String>,
}

/// `GET /v1/layers`: layers in the store, by digest.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct LayerList {
    /// The layers.
    pub layers: Vec<LayerUse>,
}

/// `POST /v1/layers/prune`: what was removed and what was kept.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct PruneResult {
    /// The orphan layers deleted.
    pub removed: Vec<Layer>,
    /// Bytes of layer files freed.
    pub freed: u64,
    /// Orphans kept because a sandbox still runs on them, as `digest (sandbox id, …)`.
    pub kept: Vec<String>,
}

/// `GET /v1/images`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ImageList {
    /// Named images, by name.
    pub images: Vec<Image>,
}

/// `GET /v1/images/{name}`: an image with its layers.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ImageDetail {
    /// The image.
    #[serde(flatten)]
    pub image: Image,
    /// Its layers, bottom first.
    pub layer_info: Vec<Layer>,
}

/// `POST /v1/sandboxes/{id}/commit`: turn a sandbox's changes into a new layer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct CommitRequest {
    /// Name of the new image: the sandbox's layers plus the new one on top.
    #[cfg_attr(
        feature = "openapi",
        schema(
            pattern = "^[a-z0-9][a-z0-9._-]*(/[a-z0-9][a-z0-9._-]*)*([:@][A-Za-z0-9._-]{1,128})?$",
            max_length = 255
        )
    )]
    pub name: String,
    /// The project the image belongs to (default: the sandbox's). The key needs
    /// `image.build` there.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub project: Option<String>,
}

/// How one mounted layer has been read on one node (`GET /v1/images/stats`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct LayerStats {
    /// The node that has it mounted.
    pub node: NodeId,
    /// The layer.
    pub digest: String,
    /// Size of its file.
    pub size: u64,
    /// How it is mounted: `loop` (a loop device with direct I/O) or `file` (EROFS straight
    /// from the file).
    pub mode: String,
    /// Bytes read from the layer file since it was mounted: the loop device's read counter,
    /// or (`file`) the file's pages that entered the page cache.
    pub read_bytes: u64,
    /// `read_bytes` / `size`.
    pub read_fraction: f64,
    /// Sandboxes on this node using it.
    pub sandboxes: u32,
}

/// Storage reads of one sandbox.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct SandboxReadStats {
    /// The sandbox.
    pub id: SandboxId,
    /// Its image.
    pub image: String,
    /// Its layers, bottom first.
    pub layers: Vec<String>,
    /// Total size of its layer files.
    pub image_size: u64,
    /// Bytes its processes caused to be read from storage (`read_bytes` of their I/O
    /// accounting, exited processes included): its layers' devices and its writable layer.
    pub read_bytes: u64,
    /// `read_bytes` / `image_size`.
    pub read_fraction: f64,
}

/// `GET /v1/images/stats`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ImageStats {
    /// Mounted layers, per node.
    pub layers: Vec<LayerStats>,
    /// Sandboxes made from layered images.
    pub sandboxes: Vec<SandboxReadStats>,
}

/// `POST /v1/images/pull`: fetch an image from an OCI registry into the layer store.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct PullRequest {
    /// The image reference, e.g. `docker.io/library/python:3.12` or
    /// `registry.example.com:5000/team/env@sha256:…`.
    pub reference: String,
    /// Name for it in Warren; default: its repository and tag (`library/python:3.12`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Talk plain HTTP to the registry (a registry without TLS). The administrator's key only
    /// (403 otherwise). A registry at a private, loopback, link-local or metadata address is
    /// refused either way unless `[control] registry_exempt` names its range.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub insecure: bool,
    /// Registry user name (with `password`); anonymous when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub username: Option<String>,
    /// Registry password or token.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub password: Option<String>,
    /// The project the image belongs to (default: the key's). The key needs `image.build`
    /// there.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub project: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::{ApiError, ErrorCode};

    #[test]
    fn gathered_answers_keep_the_old_shape_and_name_missing_nodes_beside_it() {
        let full = Gathered::complete(TaskList { tasks: Vec::new() });
        assert_eq!(serde_json::to_string(&full).unwrap(), r#"{"tasks":[]}"#);
        // An old body (no `unreachable`) reads as complete.
        let old: Gathered<TaskList> = serde_json::from_str(r#"{"tasks":[]}"#).unwrap();
        assert!(old.is_complete());
        let node: NodeId = "node22".parse().unwrap();
        let partial = Gathered {
            answer: TaskList { tasks: Vec::new() },
            unreachable: vec![NodeFailure {
                node: node.clone(),
                error: ApiError::new(ErrorCode::Unavailable, "node node22 does not answer"),
            }],
        };
        let v = serde_json::to_value(&partial).unwrap();
        assert_eq!(v["tasks"], serde_json::json!([]));
        assert_eq!(v["unreachable"][0]["node"], "node22");
        assert_eq!(v["unreachable"][0]["error"]["code"], "unavailable");
        let back: Gathered<TaskList> = serde_json::from_value(v).unwrap();
        assert_eq!(back, partial);
        assert!(!back.is_complete());
    }
}

/// A project: a node of the tree that scopes sandboxes, keys and quotas.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Project {
    /// Its path, `root/rl/job-42`.
    pub path: String,
    /// When it was made (RFC 3339).
    pub created_at: String,
    /// The identity that made it.
    pub created_by: String,
    /// Most sandboxes at once in it and below it; none: no limit of its own.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_sandboxes: Option<u64>,
    /// Most CPU requested in it and below it, millicores.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_cpu: Option<u64>,
    /// Most memory requested in it and below it, bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_memory: Option<u64>,
    /// Most function calls in flight at once in it and below it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_fncalls: Option<u64>,
}

/// `POST /v1/projects`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct CreateProject {
    /// The new project's path; missing ancestors are made with it (the key needs
    /// `project.admin` on each one's parent). Segments: 1 to 63 lowercase letters, digits,
    /// `- _ .`, not starting with `.`.
    #[cfg_attr(
        feature = "openapi",
        schema(pattern = "^root(/[a-z0-9._-]{1,63}){1,15}$")
    )]
    pub path: String,
}

/// `PUT /v1/projects/{path}`: its quotas (each absent: no limit of its own).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct ProjectQuota {
    /// Most sandboxes at once.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_sandboxes: Option<u64>,
    /// Most CPU requested, millicores.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_cpu: Option<u64>,
    /// Most memory requested, bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_memory: Option<ByteSize>,
    /// Most function calls in flight at once (`/v1/fncall/*` and `/run_code`; a batch
    /// counts once for each worker it runs on at a time). Over it a call is answered 429.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_fncalls: Option<u64>,
}

/// `GET /v1/projects`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ProjectList {
    /// The projects the key may see, by path.
    pub projects: Vec<Project>,
}

/// An identity: a person or a service account.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Identity {
    /// Its name.
    pub name: String,
    /// `user` or `service`.
    pub kind: String,
    /// The project it was made in (whoever holds `iam.delegate` there manages it).
    pub project: String,
    /// When (RFC 3339).
    pub created_at: String,
    /// By whom.
    pub created_by: String,
}

/// `POST /v1/identities`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct CreateIdentity {
    /// 1 to 63 lowercase letters, digits, `- _ . @`.
    #[cfg_attr(feature = "openapi", schema(pattern = "^[a-z0-9._@-]{1,63}$"))]
    pub name: String,
    /// `user` or `service` (default `service`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    /// Where it is made (default: the key's project).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub project: Option<String>,
}

/// `GET /v1/identities`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct IdentityList {
    /// The identities the key manages.
    pub identities: Vec<Identity>,
}

/// A binding: an identity holds a role (or one permission) on a project's subtree.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Binding {
    /// Whose.
    pub identity: String,
    /// Where.
    pub project: String,
    /// A role (`viewer`, `runner`, `builder`, `project-admin`, `admin`) or a permission
    /// (`sandbox.exec`, ...).
    pub grant: String,
    /// When (RFC 3339).
    #[serde(default)]
    pub created_at: String,
    /// By whom.
    #[serde(default)]
    pub created_by: String,
}

/// `POST /v1/bindings` and `DELETE /v1/bindings`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct GrantRequest {
    /// The identity.
    pub identity: String,
    /// The project (its whole subtree).
    pub project: String,
    /// A role or a permission.
    pub grant: String,
}

/// `GET /v1/bindings`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct BindingList {
    /// Bindings of the identities the key manages.
    pub bindings: Vec<Binding>,
}

/// An API key, never its secret.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ApiKey {
    /// Its id (`key_...`), for revoking it.
    pub id: String,
    /// Its name.
    pub name: String,
    /// The identity it acts as.
    pub identity: String,
    /// The project subtree it acts in.
    pub project: String,
    /// Its role (or permission): it may do what this allows and its identity may.
    pub role: String,
    /// When it was made (RFC 3339).
    pub created_at: String,
    /// By whom.
    pub created_by: String,
    /// When it expires (RFC 3339).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_at: Option<String>,
    /// When it was revoked (RFC 3339).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revoked_at: Option<String>,
    /// When it was last used (to within a minute; RFC 3339).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_used_at: Option<String>,
}

/// `POST /v1/keys`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct CreateKey {
    /// A name for lists (1 to 63 characters).
    pub name: String,
    /// The identity it acts as (default: the calling key's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub identity: Option<String>,
    /// The project subtree it acts in (default: the calling key's project).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub project: Option<String>,
    /// Its role or permission (default `runner`); the caller must hold all of it there.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub role: Option<String>,
    /// Seconds until it expires (default: never).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(minimum = 1))]
    pub expires_in: Option<u64>,
    /// The secret's form: `warren` (`wrn_...`, the default) or `e2b` (`e2b_` + 40 hex
    /// digits, the form E2B SDKs insist on: for the E2B gateway, which then acts with this
    /// key's identity, project and role).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub form: Option<String>,
}

/// `POST /v1/keys`: the key, and its secret — shown this once.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct NewApiKey {
    /// The key.
    #[serde(flatten)]
    pub key: ApiKey,
    /// The secret to send as `Authorization: Bearer ...`; not stored, not shown again.
    pub secret: String,
}

/// `GET /v1/keys`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ApiKeyList {
    /// The keys the calling key manages.
    pub keys: Vec<ApiKey>,
}

/// One grant of the calling key: a subtree and what it holds there.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Grant {
    /// The subtree.
    pub project: String,
    /// Its permissions there.
    pub permissions: Vec<String>,
}

/// `GET /v1/whoami`: the calling key.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct WhoAmI {
    /// The identity it acts as.
    pub identity: String,
    /// Its id.
    pub key_id: String,
    /// Its project.
    pub project: String,
    /// Where it holds what.
    pub grants: Vec<Grant>,
}

/// An audit record.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct AuditEntry {
    /// Its number.
    pub id: i64,
    /// When (RFC 3339).
    pub at: String,
    /// The identity that acted.
    pub actor: String,
    /// With which key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key_id: Option<String>,
    /// What: `project.create`, `key.revoke`, ...
    pub action: String,
    /// On what.
    pub target: String,
    /// In which project.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub project: Option<String>,
    /// From which address.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source: Option<String>,
    /// More.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
}

/// `GET /v1/audit`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct AuditList {
    /// Newest first.
    pub entries: Vec<AuditEntry>,
}
