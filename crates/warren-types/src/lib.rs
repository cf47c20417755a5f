//! Warren's shared vocabulary: the types every other crate speaks.
//!
//! This crate sits at the bottom of the dependency graph. It does no I/O, links no async runtime
//! and no syscall layer, so the guest agent (which ships into every sandbox) can depend on it
//! without growing.
//!
//! - [`id`]: node and sandbox identifiers (a sandbox id encodes its node).
//! - [`size`]: byte sizes as users write them (`512Mi`, `1G`, `1048576`).
//! - [`api`]: the REST API's request and response bodies, shared by the control plane, the node
//!   daemon and the SDKs.
//! - [`error`]: the stable error codes and the JSON error body.
//! - [`events`]: incident events (what sandboxes tried that the platform stopped).
//! - [`guest`]: the host ↔ guest agent protocol (frames, requests, replies, version).
//! - [`path`]: validation of paths that users pass to the file API.
//! - [`denied`]: the always-denied destinations (reviewed data, `policy/denied-addresses.txt`).
//! - [`net`]: network policies (rules by CIDR, domain, port and protocol) and their parsed form.

pub mod api;
pub mod denied;
pub mod error;
pub mod events;
pub mod fncall;
pub mod guest;
pub mod id;
pub mod net;
pub mod owner;
pub mod path;
pub mod project;
pub mod size;

pub use error::{ApiError, ErrorCode, Fault};
pub use id::{NodeId, SandboxId};
pub use size::ByteSize;
