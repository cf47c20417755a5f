//! Rust SDK for Warren's REST API: create sandboxes, run commands in them, move files.
//!
//! ```no_run
//! # async fn demo() -> warren_sdk::Result<()> {
//! use warren_sdk::{Client, CreateSandbox, ExecResultExt};
//!
//! // WARREN_URL (default http://127.0.0.1:7700) and WARREN_API_KEY, or the key file that
//! // `warren up` writes.
//! let client = Client::from_env()?;
//! let sb = client
//!     .create(&CreateSandbox { image: "host".into(), task: Some("rollout-7".into()), ..Default::default() })
//!     .await?;
//! sb.write_file("/tmp/in.txt", "hello\n").await?;
//! let out = sb.exec(&warren_sdk::argv(["wc", "-c", "/tmp/in.txt"])).await?;
//! println!("exit {}: {}", out.status.exit_code, String::from_utf8_lossy(&out.stdout_data()?));
//! sb.kill().await?;
//! # Ok(()) }
//! ```
//!
//! - [`Client`]: the connection to Warren; sandbox-independent operations (create, list,
//!   nodes, health). Cheap to clone, safe to share between tasks.
//! - [`Sandbox`]: a handle on one sandbox; lifecycle ([`sandbox`]), commands ([`exec`]),
//!   background processes ([`process`]) and files ([`files`]).
//! - Images: import, pull, list, remove ([`images`]), and [`build`] (`Client::build_image`).
//! - Answers gathered from every node name the nodes that did not answer ([`listing`]).
//! - [`Error`]: one error type; [`Error::Api`] carries the server's code and message.
//! - [`config`]: where the address and the API key come from.
//!
//! The request and response bodies are [`warren_types::api`]'s, re-exported here.

pub mod build;
pub mod client;
pub mod config;
pub mod error;
pub mod exec;
pub mod files;
pub mod fncall;
pub mod iam;
pub mod images;
pub mod listing;
mod ndjson;
pub mod process;
pub mod sandbox;
pub mod tarball;

pub use build::{BuildSpec, BuildStep};
pub use client::{Client, EventFilter, ListFilter};
pub use config::Config;
pub use error::{Error, Result};
pub use exec::{ExecEvents, ExecResultExt, argv, decode_data, set_stdin, shell};
pub use files::FileStream;
pub use images::ImportOptions;
pub use listing::Listing;
pub use sandbox::Sandbox;

/// A sandbox as the API describes it (`warren_types::api::Sandbox`), named apart from the
/// [`Sandbox`] handle.
pub use warren_types::api::Sandbox as SandboxInfo;
pub use warren_types::api::{
    ApiKey, AuditEntry, AuditList, Binding, CreateIdentity, CreateKey, Grant, Identity, NewApiKey,
    Project, ProjectQuota, WhoAmI,
};
pub use warren_types::api::{
    BackendKind, CreateSandbox, Encoding, ExecEvent, ExecRequest, ExecResult, ExitStatus,
    FileEntry, FileKind, FsEvent, FsEventKind, Gathered, Health, IdleAction, Image, ImageDetail,
    ImageStats, Layer, LayerUse, NodeFailure, NodeInfo, Pressure, ProcessInfo, PtySize,
    PullRequest, QosClass, QosSupport, Resources, Role, SandboxMetrics, SandboxState, TaskAction,
    TaskInfo, TaskNetworkResult, TaskResult, TrajectoryEntry, WatchEvents, WatchRequest,
};
pub use warren_types::events::NetEvent;
pub use warren_types::events::{Event, EventKind};
pub use warren_types::fncall::{
    CaseResult, Checker, FnCallBatchRequest, FnCallBatchResult, FnCallRequest, FnCallResult,
    FnCallStatus, LanguageInfo, StepOutcome, TestCase,
};
pub use warren_types::net::{
    ExposedPort, NetRule, NetworkMode, NetworkPolicy, NetworkStatus, Protocol,
};
pub use warren_types::{ApiError, ByteSize, ErrorCode, Fault, NodeId, SandboxId};

#[cfg(test)]
mod fake;
