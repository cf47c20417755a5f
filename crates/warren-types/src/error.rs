//! Stable error codes and the JSON error body every Warren API returns.
//!
//! ```json
//! {"error": {"code": "sandbox_not_found", "message": "sandbox \"ab…\" not found: it was killed or never existed; list sandboxes with GET /v1/sandboxes"}}
//! ```
//!
//! The code is stable and meant for programs; the message is for people and says what was
//! wrong and what to do. Each code maps to one HTTP status, here, so every server agrees.

use std::fmt;

use serde::{Deserialize, Serialize};

/// A stable, machine-readable error code.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum ErrorCode {
    /// The request was malformed or a value was out of range (400).
    InvalidArgument,
    /// No API key, or a wrong one (401).
    Unauthenticated,
    /// The key is valid but may not do this (403).
    PermissionDenied,
    /// The sandbox does not exist (404).
    SandboxNotFound,
    /// The image does not exist (404).
    ImageNotFound,
    /// A process id inside a sandbox does not exist (404).
    ProcessNotFound,
    /// A file or directory inside a sandbox does not exist (404).
    FileNotFound,
    /// No such route (404).
    NotFound,
    /// The operation conflicts with the current state (409), e.g. a file exists.
    Conflict,
    /// The request body is larger than allowed (413).
    PayloadTooLarge,
    /// The node (or every node) has no room: retry later or ask for less (429).
    Capacity,
    /// The sandbox stopped while the request ran (410).
    SandboxGone,
    /// The operation did not finish in time (504).
    Timeout,
    /// A node could not be reached (503).
    Unavailable,
    /// A bug or an unexpected failure of the host (500). Logged with details.
    Internal,
}

impl ErrorCode {
    /// The HTTP status this code is sent with.
    pub fn http_status(self) -> u16 {
        match self {
            ErrorCode::InvalidArgument => 400,
            ErrorCode::Unauthenticated => 401,
            ErrorCode::PermissionDenied => 403,
            ErrorCode::SandboxNotFound
            | ErrorCode::ImageNotFound
            | ErrorCode::ProcessNotFound
            | ErrorCode::FileNotFound
            | ErrorCode::NotFound => 404,
            ErrorCode::Conflict => 409,
            ErrorCode::SandboxGone => 410,
            ErrorCode::PayloadTooLarge => 413,
            ErrorCode::Capacity => 429,
            ErrorCode::Internal => 500,
            ErrorCode::Unavailable => 503,
            ErrorCode::Timeout => 504,
        }
    }

    /// The code's wire name, e.g. `sandbox_not_found`.
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorCode::InvalidArgument => "invalid_argument",
            ErrorCode::Unauthenticated => "unauthenticated",
            ErrorCode::PermissionDenied => "permission_denied",
            ErrorCode::SandboxNotFound => "sandbox_not_found",
            ErrorCode::ImageNotFound => "image_not_found",
            ErrorCode::ProcessNotFound => "process_not_found",
            ErrorCode::FileNotFound => "file_not_found",
            ErrorCode::NotFound => "not_found",
            ErrorCode::Conflict => "conflict",
            ErrorCode::PayloadTooLarge => "payload_too_large",
            ErrorCode::Capacity => "capacity",
            ErrorCode::SandboxGone => "sandbox_gone",
            ErrorCode::Timeout => "timeout",
            ErrorCode::Unavailable => "unavailable",
            ErrorCode::Internal => "internal",
        }
    }
}

/// Whose fault an error is, so a trainer knows what to do with the episode that saw it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum Fault {
    /// The platform's: no room, a node that did not answer, a bug. Retry the call (after
    /// `retry_after_secs` where given); a trainer masks such an episode out of the loss
    /// instead of scoring it.
    Infrastructure,
    /// The agent's own doing inside its sandbox (it used up its memory and was killed, it
    /// ended its own init): score the episode as the agent earned it.
    Agent,
    /// The caller's request: a bad argument, an unknown id, a conflict with the sandbox's
    /// state. Retrying the same request gives the same answer.
    Request,
}

impl ErrorCode {
    /// Whose fault an error with this code is, unless the error says otherwise.
    pub fn default_fault(self) -> Fault {
        match self {
            ErrorCode::Capacity
            | ErrorCode::Unavailable
            | ErrorCode::Internal
            | ErrorCode::Timeout => Fault::Infrastructure,
            _ => Fault::Request,
        }
    }
}

impl fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// An error as the API reports it: a stable code and a message for people.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ApiError {
    /// Stable code for programs.
    pub code: ErrorCode,
    /// What was wrong and what to do about it.
    pub message: String,
    /// For `capacity` and `unavailable`: seconds after which a retry may succeed (also sent
    /// as `Retry-After`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry_after_secs: Option<u32>,
    /// Whose fault it is: `infrastructure` (retryable: mask the episode, retry the call),
    /// `agent` (the sandbox's own doing) or `request` (the call itself was wrong). Absent in
    /// answers of older servers: then it follows from `code`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fault: Option<Fault>,
}

impl ApiError {
    /// An error with `code` and `message`.
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        ApiError {
            code,
            message: message.into(),
            retry_after_secs: None,
            fault: Some(code.default_fault()),
        }
    }

    /// Shorthand for [`ErrorCode::InvalidArgument`].
    pub fn invalid(message: impl Into<String>) -> Self {
        Self::new(ErrorCode::InvalidArgument, message)
    }

    /// Shorthand for [`ErrorCode::Internal`].
    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(ErrorCode::Internal, message)
    }

    /// A `capacity` refusal that may be retried after `secs`.
    pub fn capacity(message: impl Into<String>, secs: u32) -> Self {
        ApiError {
            code: ErrorCode::Capacity,
            message: message.into(),
            retry_after_secs: Some(secs),
            fault: Some(Fault::Infrastructure),
        }
    }

    /// The same error, marked as the fault of `fault`.
    pub fn with_fault(mut self, fault: Fault) -> Self {
        self.fault = Some(fault);
        self
    }

    /// Whose fault it is: as marked, else as its code implies.
    pub fn fault(&self) -> Fault {
        self.fault.unwrap_or(self.code.default_fault())
    }

    /// The wire body `{"error": {...}}`.
    pub fn into_body(mut self) -> ErrorBody {
        self.fault = Some(self.fault());
        ErrorBody { error: self }
    }
}

impl fmt::Display for ApiError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({})", self.message, self.code)
    }
}

impl std::error::Error for ApiError {}

/// The JSON body of every error response.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ErrorBody {
    /// The error.
    pub error: ApiError,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_serialise_as_their_wire_names() {
        for code in [
            ErrorCode::InvalidArgument,
            ErrorCode::SandboxNotFound,
            ErrorCode::Capacity,
            ErrorCode::PayloadTooLarge,
        ] {
            assert_eq!(
                serde_json::to_string(&code).unwrap(),
                format!("\"{}\"", code.as_str())
            );
            assert!(code.http_status() >= 400 && code.http_status() < 500);
        }
    }

    #[test]
    fn body_shape_is_stable() {
        let body = ApiError::capacity("node full", 2).into_body();
        let v: serde_json::Value = serde_json::to_value(&body).unwrap();
        assert_eq!(v["error"]["code"], "capacity");
        assert_eq!(v["error"]["retry_after_secs"], 2);
        assert_eq!(v["error"]["fault"], "infrastructure");
        let v = serde_json::to_value(ApiError::invalid("bad").into_body()).unwrap();
        assert_eq!(v["error"]["fault"], "request");
    }
}
