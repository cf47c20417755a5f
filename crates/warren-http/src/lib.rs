//! HTTP plumbing shared by the control plane and the node daemon.
//!
//! - [`Error`]: the one place where an [`ApiError`] becomes a status code and a JSON body.
//! - [`Json`]: like axum's extractor, but a malformed body is a Warren `invalid_argument` error
//!   that says what was wrong, not a plain-text 422.
//! - [`Path`], [`Query`]: the same for path and query parameters.
//! - [`drain`]: reading the rest of a body a handler refused unread, so its client gets the
//!   answer.
//! - [`ndjson`]: streaming bodies of newline-delimited JSON.
//! - [`serve`]: serving with header-read and idle timeouts.
//! - [`tunnel`]: TCP streams over an HTTP upgrade, to sandboxes' exposed ports.
//! - [`token_matches`]: constant-time comparison of presented secrets.

pub mod drain;
pub mod serve;
pub mod tunnel;

/// Whether a presented secret equals the expected one, in time that does not depend on where
/// they differ (only on their lengths).
pub fn token_matches(presented: &str, expected: &str) -> bool {
    use subtle::ConstantTimeEq;
    presented.as_bytes().ct_eq(expected.as_bytes()).into()
}

use axum::extract::rejection::{JsonRejection, PathRejection, QueryRejection};
use axum::extract::{FromRequest, FromRequestParts, Request};
use axum::http::request::Parts;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::Serialize;
use serde::de::DeserializeOwned;
use warren_types::error::{ApiError, ErrorCode};

/// Content type of streaming exec output.
pub const NDJSON: &str = "application/x-ndjson";

/// An API error as an axum response.
#[derive(Debug)]
pub struct Error(pub ApiError);

impl From<ApiError> for Error {
    fn from(e: ApiError) -> Self {
        Error(e)
    }
}

impl IntoResponse for Error {
    fn into_response(self) -> Response {
        let status = StatusCode::from_u16(self.0.code.http_status())
            .unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        if status.is_server_error() {
            tracing::error!(code = %self.0.code, "{}", self.0.message);
        }
        let retry = self.0.retry_after_secs;
        let mut resp = (status, axum::Json(self.0.into_body())).into_response();
        if let Some(secs) = retry
            && let Ok(v) = HeaderValue::from_str(&secs.to_string())
        {
            resp.headers_mut().insert(header::RETRY_AFTER, v);
        }
        resp
    }
}

/// Result type for handlers.
pub type Result<T> = std::result::Result<T, Error>;

/// A JSON body whose rejection is a Warren error.
pub struct Json<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned> FromRequest<S> for Json<T> {
    type Rejection = Error;

    async fn from_request(req: Request, state: &S) -> std::result::Result<Self, Error> {
        if !is_json(req.headers()) {
            return Err(Error(ApiError::invalid(NOT_JSON)));
        }
        let bytes = match axum::body::Bytes::from_request(req, state).await {
            Ok(b) => b,
            Err(rej) => return Err(Error(json_rejection(JsonRejection::BytesRejection(rej)))),
        };
        // Every body Warren takes is an object; serde would otherwise read an array as a
        // struct's fields in order (`[null, null]` for a body of two optional fields).
        if bytes
            .iter()
            .find(|b| !b.is_ascii_whitespace())
            .is_some_and(|b| *b != b'{')
        {
            return Err(Error(ApiError::invalid(
                "the body must be a JSON object ({...}), not an array or a single value",
            )));
        }
        match axum::Json::<T>::from_bytes(&bytes) {
            Ok(axum::Json(v)) => Ok(Json(v)),
            // JSON has one number type: 3.0 is the integer 3 to JSON Schema (and to Python,
            // which sends it so), so an integer field takes it.
            Err(rej @ JsonRejection::JsonDataError(_)) => {
                let retried = serde_json::from_slice::<serde_json::Value>(&bytes)
                    .ok()
                    .and_then(|mut v| integral_floats_to_integers(&mut v).then_some(v))
                    .and_then(|v| serde_json::from_value(v).ok());
                retried.map(Json).ok_or_else(|| Error(json_rejection(rej)))
            }
            Err(rej) => Err(Error(json_rejection(rej))),
        }
    }
}

/// Whether the request says its body is JSON (`application/json` or `application/*+json`).
fn is_json(headers: &axum::http::HeaderMap) -> bool {
    let Some(ct) = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
    else {
        return false;
    };
    let essence = ct.split(';').next().unwrap_or("").trim();
    let Some((kind, sub)) = essence.split_once('/') else {
        return false;
    };
    kind.eq_ignore_ascii_case("application")
        && (sub.eq_ignore_ascii_case("json") || sub.to_ascii_lowercase().ends_with("+json"))
}

/// Turns every float in `v` without a fraction (and in range) into an integer; whether it
/// changed any.
fn integral_floats_to_integers(v: &mut serde_json::Value) -> bool {
    use serde_json::Value;
    match v {
        Value::Number(n) if n.is_f64() => {
            let f = n.as_f64().unwrap_or(f64::NAN);
            let int = if f.fract() != 0.0 {
                None
            } else if (0.0..=u64::MAX as f64).contains(&f) && f < u64::MAX as f64 {
                Some(Value::from(f as u64))
            } else if (i64::MIN as f64..0.0).contains(&f) {
                Some(Value::from(f as i64))
            } else {
                None
            };
            match int {
                Some(i) => {
                    *v = i;
                    true
                }
                None => false,
            }
        }
        Value::Array(items) => {
            let mut changed = false;
            for item in items {
                changed |= integral_floats_to_integers(item);
            }
            changed
        }
        Value::Object(map) => {
            let mut changed = false;
            for item in map.values_mut() {
                changed |= integral_floats_to_integers(item);
            }
            changed
        }
        _ => false,
    }
}

impl<T: Serialize> IntoResponse for Json<T> {
    fn into_response(self) -> Response {
        axum::Json(self.0).into_response()
    }
}

const NOT_JSON: &str = "the body must be JSON: send the header Content-Type: application/json";

fn json_rejection(rej: JsonRejection) -> ApiError {
    match rej {
        JsonRejection::MissingJsonContentType(_) => ApiError::invalid(NOT_JSON),
        JsonRejection::JsonSyntaxError(e) => {
            ApiError::invalid(format!("the body is not valid JSON: {}", source_text(&e)))
        }
        JsonRejection::JsonDataError(e) => ApiError::invalid(format!(
            "the JSON body does not fit this request: {}",
            source_text(&e)
        )),
        JsonRejection::BytesRejection(e) => {
            if e.status() == StatusCode::PAYLOAD_TOO_LARGE {
                ApiError::new(ErrorCode::PayloadTooLarge, "the request body is too large")
            } else {
                ApiError::invalid(format!("could not read the body: {e}"))
            }
        }
        other => ApiError::invalid(other.body_text()),
    }
}

/// The innermost message of an error chain (serde's, without axum's wrapping).
fn source_text(e: &(dyn std::error::Error + 'static)) -> String {
    let mut cur = e;
    while let Some(next) = cur.source() {
        cur = next;
    }
    cur.to_string()
}

/// Query parameters whose rejection is a Warren error.
pub struct Query<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned> FromRequestParts<S> for Query<T> {
    type Rejection = Error;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> std::result::Result<Self, Error> {
        match axum::extract::Query::<T>::from_request_parts(parts, state).await {
            Ok(axum::extract::Query(v)) => Ok(Query(v)),
            Err(QueryRejection::FailedToDeserializeQueryString(e)) => Err(Error(
                ApiError::invalid(format!("bad query parameters: {}", source_text(&e))),
            )),
            Err(other) => Err(Error(ApiError::invalid(other.body_text()))),
        }
    }
}

/// Path parameters whose rejection is a Warren error (a JSON 400 that names the parameter),
/// not axum's plain text.
pub struct Path<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned + Send> FromRequestParts<S> for Path<T> {
    type Rejection = Error;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> std::result::Result<Self, Error> {
        match axum::extract::Path::<T>::from_request_parts(parts, state).await {
            Ok(axum::extract::Path(v)) => Ok(Path(v)),
            Err(PathRejection::FailedToDeserializePathParams(e)) => {
                Err(Error(ApiError::invalid(format!(
                    "bad path parameter: {}; see /v1/openapi.json for what each path takes",
                    e.body_text()
                ))))
            }
            Err(other) => Err(Error(ApiError::internal(format!(
                "path parameters: {}",
                other.body_text()
            )))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, serde::Deserialize, PartialEq)]
    struct T {
        pids: u32,
        timeout: Option<f64>,
        offset: i64,
    }

    async fn parse(ct: &str, body: &str) -> std::result::Result<T, ApiError> {
        let req = Request::builder()
            .header(header::CONTENT_TYPE, ct)
            .body(axum::body::Body::from(body.to_string()))
            .unwrap();
        Json::<T>::from_request(req, &())
            .await
            .map(|j| j.0)
            .map_err(|e| e.0)
    }

    #[tokio::test]
    async fn integral_floats_are_integers_and_nothing_else_changes() {
        let t = parse(
            "application/json",
            r#"{"pids": 3273.0, "timeout": 2.0, "offset": -4.0}"#,
        )
        .await
        .unwrap();
        assert_eq!(
            t,
            T {
                pids: 3273,
                timeout: Some(2.0),
                offset: -4
            }
        );
        let e = parse("application/json", r#"{"pids": 3.5, "offset": 0}"#)
            .await
            .unwrap_err();
        assert_eq!(e.code, ErrorCode::InvalidArgument);
        assert!(e.message.contains("pids"), "{}", e.message);
        // An array is not read as the fields in order.
        let e = parse("application/json", r#" [3, null, 0]"#)
            .await
            .unwrap_err();
        assert!(e.message.contains("JSON object"), "{}", e.message);
        let e = parse("text/plain", r#"{"pids": 1, "offset": 0}"#)
            .await
            .unwrap_err();
        assert!(
            e.message.contains("Content-Type: application/json"),
            "{}",
            e.message
        );
        let t = parse(
            "application/json; charset=utf-8",
            r#"{"pids": 1, "offset": 0}"#,
        )
        .await;
        assert!(t.is_ok(), "{t:?}");
    }
}

/// Streaming newline-delimited JSON bodies.
pub mod ndjson {
    use bytes::Bytes;
    use futures_util::StreamExt;
    use serde::Serialize;
    use tokio::sync::mpsc;

    /// Sends values as NDJSON lines into a response body.
    #[derive(Clone)]
    pub struct Sender(mpsc::Sender<Bytes>);

    impl Sender {
        /// Sends one value as a line; `false` when the client has gone.
        pub async fn send<T: Serialize>(&self, v: &T) -> bool {
            let mut line = serde_json::to_vec(v).unwrap_or_default();
            line.push(b'\n');
            self.0.send(Bytes::from(line)).await.is_ok()
        }
    }

    /// A response body of the values `rx` yields, one line each, ending when it does.
    pub fn from_receiver<T: Serialize + Send + 'static>(
        rx: mpsc::Receiver<T>,
    ) -> axum::response::Response {
        let stream = futures_util::stream::unfold(rx, |mut rx| async move {
            let v = rx.recv().await?;
            let mut line = serde_json::to_vec(&v).unwrap_or_default();
            line.push(b'\n');
            Some((Ok::<_, std::io::Error>(Bytes::from(line)), rx))
        });
        axum::response::Response::builder()
            .header(axum::http::header::CONTENT_TYPE, super::NDJSON)
            .body(axum::body::Body::from_stream(stream))
            .unwrap_or_default()
    }

    /// A channel whose receiving end is a response body.
    pub fn channel() -> (Sender, axum::response::Response) {
        let (tx, rx) = mpsc::channel::<Bytes>(64);
        let stream =
            futures_util::stream::unfold(
                rx,
                |mut rx| async move { rx.recv().await.map(|b| (b, rx)) },
            )
            .map(Ok::<_, std::io::Error>);
        let body = axum::body::Body::from_stream(stream);
        let resp = axum::response::Response::builder()
            .header(axum::http::header::CONTENT_TYPE, super::NDJSON)
            .body(body)
            .unwrap_or_default();
        (Sender(tx), resp)
    }
}

/// The fallback for unknown routes: a JSON 404 that says where to look.
pub async fn not_found(uri: axum::http::Uri) -> Error {
    Error(ApiError::new(
        ErrorCode::NotFound,
        format!("no such route {uri}: see /v1/openapi.json for the API"),
    ))
}
