//! The node's errors, and their one mapping to API errors.

use std::io;

use warren_types::error::{ApiError, ErrorCode};
use warren_types::id::SandboxId;

/// Why a node operation failed.
#[derive(Debug, thiserror::Error)]
pub enum NodeError {
    /// No such sandbox on this node.
    #[error(
        "sandbox {0} not found: it was killed, timed out, or never existed; list sandboxes with GET /v1/sandboxes"
    )]
    NotFound(SandboxId),
    /// The request was wrong; the message says how.
    #[error("{0}")]
    Invalid(String),
    /// The image does not exist.
    #[error("{0}")]
    ImageNotFound(String),
    /// The node has no room.
    #[error("{message}")]
    Capacity {
        /// Why, and what to do.
        message: String,
        /// Seconds after which a retry may succeed.
        retry_after: u32,
    },
    /// The node is too busy to finish this now (a new sandbox's guest did not answer in
    /// time under load); a retry may succeed.
    #[error("{message}")]
    Busy {
        /// What did not happen in time, and what to do.
        message: String,
        /// Seconds after which a retry may succeed.
        retry_after: u32,
    },
    /// Waited past its deadline for what it needed (a function call for a worker); a retry
    /// may succeed.
    #[error("{0}")]
    Timeout(String),
    /// The sandbox ended while the request ran.
    #[error("sandbox {0} stopped while the request ran (killed, timed out, or its init died)")]
    Gone(SandboxId),
    /// A create's task was stopped while the create was in flight.
    #[error("task {task:?} was stopped while this create was in flight: {}", match sandbox {
        Some(id) => format!("its sandbox {id} was killed as it started"),
        None => "it was not started".to_string(),
    })]
    TaskStopped {
        /// The task.
        task: String,
        /// The sandbox killed, if it had started.
        sandbox: Option<SandboxId>,
    },
    /// The guest agent refused or failed the operation; code and message are its own.
    #[error("{message}")]
    Guest {
        /// Stable code from the guest.
        code: ErrorCode,
        /// Its message.
        message: String,
    },
    /// A request body was larger than allowed.
    #[error("{0}")]
    TooLarge(String),
    /// An exposed port could not be reached: not exposed (`not_found`), or nothing listens
    /// on it (`unavailable`).
    #[error("{message}")]
    Port {
        /// What to report.
        code: ErrorCode,
        /// Why, and what to do.
        message: String,
    },
    /// An image or layer operation failed; reported with the image store's one code mapping
    /// ([`warren_images::ImageError::code`]), as the control plane reports it.
    #[error(transparent)]
    Image(warren_images::ImageError),
    /// The host failed us: a bug or a broken machine. Logged at error level.
    #[error("{op}: {source}")]
    Host {
        /// What was being done.
        op: String,
        /// The underlying error.
        #[source]
        source: io::Error,
    },
}

impl NodeError {
    /// A host failure while doing `op`.
    pub fn host(op: impl Into<String>, source: io::Error) -> Self {
        NodeError::Host {
            op: op.into(),
            source,
        }
    }

    /// A backend's failure while doing `op`: one that ran out of a node resource (its kind
    /// `QuotaExceeded`, e.g. the host ports of exposed ports) is the node having no room
    /// (429), anything else a host failure.
    pub fn backend(op: impl Into<String>, source: io::Error) -> Self {
        if source.kind() == io::ErrorKind::QuotaExceeded {
            NodeError::Capacity {
                message: source.to_string(),
                retry_after: 5,
            }
        } else {
            NodeError::host(op, source)
        }
    }

    /// The error as the API reports it.
    pub fn to_api(&self) -> ApiError {
        let code = match self {
            NodeError::NotFound(_) => ErrorCode::SandboxNotFound,
            NodeError::Invalid(_) => ErrorCode::InvalidArgument,
            NodeError::ImageNotFound(_) => ErrorCode::ImageNotFound,
            NodeError::Capacity {
                message,
                retry_after,
            } => {
                return ApiError::capacity(message.clone(), *retry_after);
            }
            NodeError::Busy {
                message,
                retry_after,
            } => {
                return ApiError {
                    code: ErrorCode::Unavailable,
                    message: message.clone(),
                    retry_after_secs: Some(*retry_after),
                    fault: Some(warren_types::Fault::Infrastructure),
                };
            }
            NodeError::Timeout(message) => {
                return ApiError {
                    code: ErrorCode::Timeout,
                    message: message.clone(),
                    retry_after_secs: Some(1),
                    fault: Some(warren_types::Fault::Infrastructure),
                };
            }
            NodeError::Gone(_) | NodeError::TaskStopped { .. } => ErrorCode::SandboxGone,
            NodeError::Guest { code, .. } => *code,
            NodeError::TooLarge(_) => ErrorCode::PayloadTooLarge,
            NodeError::Port { code, .. } => *code,
            NodeError::Image(e) => return e.to_api(),
            NodeError::Host { .. } => ErrorCode::Internal,
        };
        ApiError::new(code, self.to_string())
    }
}

impl From<warren_images::ImageError> for NodeError {
    fn from(e: warren_images::ImageError) -> Self {
        NodeError::Image(e)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A node too busy to finish a create answers a retryable 503, not a 500.
    #[test]
    fn busy_is_a_retryable_unavailable() {
        let e = NodeError::Busy {
            message: "the guest did not answer in time".into(),
            retry_after: 2,
        }
        .to_api();
        assert_eq!(e.code, ErrorCode::Unavailable);
        assert_eq!(e.code.http_status(), 503);
        assert_eq!(e.retry_after_secs, Some(2));
        assert!(e.message.contains("in time"), "{}", e.message);
    }
}
