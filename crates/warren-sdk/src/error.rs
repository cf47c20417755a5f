//! The SDK's one error type, and how a failed HTTP reply becomes one.

use serde::Deserialize;
use warren_types::error::{ErrorCode, Fault};

/// Everything that can go wrong talking to Warren.
///
/// Each variant's message is written for the person reading it: what went wrong and, where
/// there is one, what to do.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// Warren answered with an error (`{"error": {...}}`); `message` is the server's.
    #[error("{message}")]
    Api {
        /// HTTP status of the reply.
        status: u16,
        /// Stable code, for programs.
        code: ErrorCode,
        /// What was wrong and what to do, for people.
        message: String,
        /// For [`ErrorCode::Capacity`]: seconds after which a retry may succeed.
        retry_after_secs: Option<u32>,
        /// Whose fault it is (the server's `fault`, else what `code` implies).
        fault: Fault,
    },
    /// Nothing answered at the configured address.
    #[error(
        "could not connect to Warren at {url}: {cause}. Start the platform with `warren up`, \
         or set WARREN_URL to the address it listens on",
        cause = root_cause(source)
    )]
    Connect {
        /// The address tried.
        url: String,
        /// What the HTTP client reported.
        #[source]
        source: reqwest::Error,
    },
    /// The request or its reply failed after connecting (connection cut, timeout, ...).
    #[error("the request to Warren failed: {}", root_cause(.0))]
    Transport(#[source] reqwest::Error),
    /// Warren's reply could not be understood (a version mismatch, not Warren at all), or a
    /// stream of events ended before its last event.
    #[error("{0}")]
    Decode(String),
    /// The caller passed something the SDK can tell is wrong without asking the server.
    #[error("{0}")]
    Invalid(String),
    /// A local file (an upload's source, a download's target) could not be used.
    #[error("cannot {op} {}: {source}", path.display())]
    Local {
        /// What was being done: `open`, `read`, `create`, `write`.
        op: &'static str,
        /// The local path.
        path: std::path::PathBuf,
        /// What the operating system said.
        #[source]
        source: std::io::Error,
    },
    /// A run step of an image build did not succeed; nothing was saved.
    #[error("step {step} (`{cmd}`) failed with {why}; nothing was saved")]
    BuildStep {
        /// Which step, from 1.
        step: usize,
        /// Its command line.
        cmd: String,
        /// `exit code 3`, `signal 9`, a timeout.
        why: String,
        /// What it printed on standard output.
        stdout: Vec<u8>,
        /// What it printed on standard error.
        stderr: Vec<u8>,
    },
}

/// The SDK's result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// The stable error code when Warren answered with one.
    pub fn code(&self) -> Option<ErrorCode> {
        match self {
            Error::Api { code, .. } => Some(*code),
            _ => None,
        }
    }

    /// Whether retrying the same request later may succeed: no room on the nodes right now
    /// (`capacity`), a node that did not answer (`unavailable`), or a connection that failed.
    pub fn is_retryable(&self) -> bool {
        match self {
            Error::Api { code, .. } => matches!(code, ErrorCode::Capacity | ErrorCode::Unavailable),
            Error::Connect { .. } | Error::Transport(_) => true,
            Error::Decode(_)
            | Error::Invalid(_)
            | Error::Local { .. }
            | Error::BuildStep { .. } => false,
        }
    }

    /// Whose fault the error is: `Infrastructure` (retry; an RL trainer masks the episode out
    /// of the loss), `Agent` (the sandbox's own doing: score it) or `Request` (the call was
    /// wrong). A connection that failed or an answer that could not be read is the
    /// infrastructure's.
    pub fn fault(&self) -> Fault {
        match self {
            Error::Api { fault, .. } => *fault,
            Error::Connect { .. } | Error::Transport(_) | Error::Decode(_) => Fault::Infrastructure,
            Error::Invalid(_) | Error::Local { .. } => Fault::Request,
            Error::BuildStep { .. } => Fault::Request,
        }
    }

    /// Whether Warren said the thing asked about does not exist (sandbox, process, file, ...).
    pub fn is_not_found(&self) -> bool {
        self.code().is_some_and(|c| c.http_status() == 404)
    }
}

/// The innermost message of an error chain: for a refused connection, "Connection refused"
/// rather than reqwest's "error sending request".
fn root_cause(e: &(dyn std::error::Error + 'static)) -> String {
    let mut cur = e;
    while let Some(next) = cur.source() {
        cur = next;
    }
    cur.to_string()
}

/// The error for a reply with a failure status and this body.
///
/// Warren's servers always send `{"error": {...}}` ([`warren_types::error::ErrorBody`]); a code
/// this SDK does not know yet (a newer server) falls back to the one its HTTP status implies.
/// Anything else (a proxy's page, another program on the port) becomes an error that shows the
/// status and the start of the body.
pub(crate) fn from_reply(status: u16, retry_after: Option<u32>, body: &[u8]) -> Error {
    /// [`warren_types::error::ErrorBody`], with the code as a string.
    #[derive(Deserialize)]
    struct Body {
        error: Inner,
    }
    #[derive(Deserialize)]
    struct Inner {
        code: String,
        message: String,
        #[serde(default)]
        retry_after_secs: Option<u32>,
        #[serde(default)]
        fault: Option<Fault>,
    }
    if let Ok(Body { error }) = serde_json::from_slice::<Body>(body) {
        let code: ErrorCode = serde_json::from_value(serde_json::Value::String(error.code))
            .unwrap_or_else(|_| code_for_status(status));
        return Error::Api {
            status,
            code,
            message: error.message,
            retry_after_secs: error.retry_after_secs.or(retry_after),
            fault: error.fault.unwrap_or(code.default_fault()),
        };
    }
    let text = String::from_utf8_lossy(body);
    let text = text.trim();
    let shown: String = text.chars().take(200).collect();
    let more = if shown.len() < text.len() { "…" } else { "" };
    let message = if shown.is_empty() {
        format!(
            "the server answered HTTP {status} with no error body; is WARREN_URL a Warren server?"
        )
    } else {
        format!("the server answered HTTP {status}: {shown}{more}")
    };
    let code = code_for_status(status);
    Error::Api {
        status,
        code,
        message,
        retry_after_secs: retry_after,
        fault: code.default_fault(),
    }
}

/// The error code that best matches a bare HTTP status.
fn code_for_status(status: u16) -> ErrorCode {
    match status {
        400 | 422 => ErrorCode::InvalidArgument,
        401 => ErrorCode::Unauthenticated,
        403 => ErrorCode::PermissionDenied,
        404 => ErrorCode::NotFound,
        409 => ErrorCode::Conflict,
        410 => ErrorCode::SandboxGone,
        413 => ErrorCode::PayloadTooLarge,
        429 => ErrorCode::Capacity,
        502 | 503 => ErrorCode::Unavailable,
        504 => ErrorCode::Timeout,
        _ => ErrorCode::Internal,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_warren_error_body_keeps_the_servers_code_and_message() {
        let body = br#"{"error": {"code": "sandbox_not_found", "message": "sandbox \"x\" not found: list sandboxes with GET /v1/sandboxes"}}"#;
        let err = from_reply(404, None, body);
        assert_eq!(err.code(), Some(ErrorCode::SandboxNotFound));
        assert!(err.is_not_found());
        assert_eq!(
            err.to_string(),
            "sandbox \"x\" not found: list sandboxes with GET /v1/sandboxes"
        );
    }

    #[test]
    fn capacity_errors_carry_the_retry_delay_from_body_or_header() {
        let body =
            br#"{"error": {"code": "capacity", "message": "node full", "retry_after_secs": 3}}"#;
        match from_reply(429, Some(9), body) {
            Error::Api {
                status,
                retry_after_secs,
                ..
            } => {
                assert_eq!(status, 429);
                assert_eq!(retry_after_secs, Some(3));
            }
            other => panic!("{other:?}"),
        }
        let body = br#"{"error": {"code": "capacity", "message": "node full"}}"#;
        let err = from_reply(429, Some(9), body);
        assert!(err.is_retryable());
        assert_eq!(err.fault(), Fault::Infrastructure);
        let body = br#"{"error": {"code": "sandbox_gone", "message": "oom", "fault": "agent"}}"#;
        assert_eq!(from_reply(410, None, body).fault(), Fault::Agent);
        let body = br#"{"error": {"code": "invalid_argument", "message": "bad"}}"#;
        assert_eq!(from_reply(400, None, body).fault(), Fault::Request);
        assert!(matches!(
            err,
            Error::Api {
                retry_after_secs: Some(9),
                ..
            }
        ));
    }

    #[test]
    fn a_foreign_body_becomes_an_error_that_shows_the_status() {
        let err = from_reply(502, None, b"<html>Bad Gateway</html>");
        assert_eq!(err.code(), Some(ErrorCode::Unavailable));
        assert_eq!(
            err.to_string(),
            "the server answered HTTP 502: <html>Bad Gateway</html>"
        );
        let err = from_reply(404, None, b"");
        assert_eq!(err.code(), Some(ErrorCode::NotFound));
        assert!(err.to_string().contains("WARREN_URL"), "{err}");
        let long = "x".repeat(1000);
        let err = from_reply(500, None, long.as_bytes());
        assert!(err.to_string().len() < 300 && err.to_string().ends_with('…'));
    }

    #[test]
    fn an_unknown_code_in_a_json_body_is_still_reported() {
        // A newer server may add codes; the message must still reach the user.
        let body = br#"{"error": {"code": "brand_new", "message": "something new"}}"#;
        let err = from_reply(400, None, body);
        assert_eq!(err.code(), Some(ErrorCode::InvalidArgument));
        assert_eq!(err.to_string(), "something new");
    }
}
