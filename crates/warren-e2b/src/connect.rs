//! The Connect protocol as the E2B SDK speaks it to envd: JSON codec only, no compression.
//!
//! - Unary: `POST /<package>.<Service>/<Method>`, `Content-Type: application/json`, one JSON
//!   message each way; an error is a non-200 status with `{"code": "<name>", "message": ...}`.
//! - Server stream: `Content-Type: application/connect+json` both ways; every message is an
//!   envelope (one flag byte, a 4-byte big-endian length, the payload). The request is one
//!   envelope; the response is 200 with message envelopes as they come and one last envelope
//!   flagged end-of-stream (`0x02`) carrying `{}` or `{"error": {...}}` — an error after the
//!   stream began goes there, the status stays 200.
//!
//! Everything a client sends is bounded: an envelope larger than [`MAX_MESSAGE`] is refused
//! before its payload is read, and so is a compressed one (nothing here decompresses).

use axum::http::StatusCode;
use bytes::{BufMut, Bytes, BytesMut};
use serde::Serialize;

/// Largest request message (a command line and its environment are far smaller; a file's
/// content never travels in a Connect message).
pub const MAX_MESSAGE: usize = 4 << 20;

/// Envelope flag: the payload is compressed.
pub const FLAG_COMPRESSED: u8 = 0x01;
/// Envelope flag: the end of the stream (the payload is the end message).
pub const FLAG_END_STREAM: u8 = 0x02;

/// `Content-Type` of unary calls.
pub const UNARY_JSON: &str = "application/json";
/// `Content-Type` of streaming calls.
pub const STREAM_JSON: &str = "application/connect+json";

/// Connect's error codes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Code {
    Canceled,
    Unknown,
    InvalidArgument,
    DeadlineExceeded,
    NotFound,
    AlreadyExists,
    PermissionDenied,
    ResourceExhausted,
    FailedPrecondition,
    Aborted,
    OutOfRange,
    Unimplemented,
    Internal,
    Unavailable,
    DataLoss,
    Unauthenticated,
}

impl Code {
    /// The code's name on the wire.
    pub fn as_str(self) -> &'static str {
        match self {
            Code::Canceled => "canceled",
            Code::Unknown => "unknown",
            Code::InvalidArgument => "invalid_argument",
            Code::DeadlineExceeded => "deadline_exceeded",
            Code::NotFound => "not_found",
            Code::AlreadyExists => "already_exists",
            Code::PermissionDenied => "permission_denied",
            Code::ResourceExhausted => "resource_exhausted",
            Code::FailedPrecondition => "failed_precondition",
            Code::Aborted => "aborted",
            Code::OutOfRange => "out_of_range",
            Code::Unimplemented => "unimplemented",
            Code::Internal => "internal",
            Code::Unavailable => "unavailable",
            Code::DataLoss => "data_loss",
            Code::Unauthenticated => "unauthenticated",
        }
    }

    /// The HTTP status of a unary error with this code.
    pub fn http_status(self) -> StatusCode {
        match self {
            Code::Canceled => StatusCode::from_u16(499).unwrap_or(StatusCode::BAD_REQUEST),
            Code::Unknown | Code::Internal | Code::DataLoss => StatusCode::INTERNAL_SERVER_ERROR,
            Code::InvalidArgument | Code::FailedPrecondition | Code::OutOfRange => {
                StatusCode::BAD_REQUEST
            }
            Code::DeadlineExceeded => StatusCode::GATEWAY_TIMEOUT,
            Code::NotFound => StatusCode::NOT_FOUND,
            Code::AlreadyExists | Code::Aborted => StatusCode::CONFLICT,
            Code::PermissionDenied => StatusCode::FORBIDDEN,
            Code::ResourceExhausted => StatusCode::TOO_MANY_REQUESTS,
            Code::Unimplemented => StatusCode::NOT_IMPLEMENTED,
            Code::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
            Code::Unauthenticated => StatusCode::UNAUTHORIZED,
        }
    }
}

/// A Connect error: a code and a message for people.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Error {
    pub code: Code,
    pub message: String,
}

#[derive(Serialize)]
struct WireError<'a> {
    code: &'static str,
    message: &'a str,
}

impl Error {
    pub fn new(code: Code, message: impl Into<String>) -> Error {
        Error {
            code,
            message: message.into(),
        }
    }

    /// The body of a unary error response.
    pub fn unary_body(&self) -> Vec<u8> {
        serde_json::to_vec(&WireError {
            code: self.code.as_str(),
            message: &self.message,
        })
        .unwrap_or_default()
    }
}

impl std::fmt::Display for Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.code.as_str(), self.message)
    }
}

/// One envelope around `payload`.
pub fn envelope(flags: u8, payload: &[u8]) -> Bytes {
    let mut b = BytesMut::with_capacity(5 + payload.len());
    b.put_u8(flags);
    b.put_u32(payload.len() as u32);
    b.put_slice(payload);
    b.freeze()
}

/// A message envelope holding `msg` as JSON.
pub fn message<T: Serialize>(msg: &T) -> Bytes {
    envelope(0, &serde_json::to_vec(msg).unwrap_or_default())
}

/// The end-of-stream envelope: `{}`, or the error.
pub fn end_stream(error: Option<&Error>) -> Bytes {
    #[derive(Serialize)]
    struct End<'a> {
        #[serde(skip_serializing_if = "Option::is_none")]
        error: Option<WireError<'a>>,
    }
    let end = End {
        error: error.map(|e| WireError {
            code: e.code.as_str(),
            message: &e.message,
        }),
    };
    envelope(
        FLAG_END_STREAM,
        &serde_json::to_vec(&end).unwrap_or_default(),
    )
}

/// Splits the first envelope off `body`: its flags, its payload and what follows. Refuses a
/// truncated envelope, a compressed one and one larger than `max`.
pub fn split_envelope(body: &[u8], max: usize) -> Result<(u8, &[u8], &[u8]), Error> {
    let Some(header) = body.first_chunk::<5>() else {
        return Err(Error::new(
            Code::InvalidArgument,
            format!(
                "a Connect envelope needs a 5-byte header (flags, big-endian length); got {} bytes",
                body.len()
            ),
        ));
    };
    let (flags, len) = envelope_header(header, max)?;
    let rest = &body[5..];
    if rest.len() < len {
        return Err(Error::new(
            Code::InvalidArgument,
            format!(
                "the envelope announces {len} bytes but the body holds {}",
                rest.len()
            ),
        ));
    }
    Ok((flags, &rest[..len], &rest[len..]))
}

/// An envelope header's flags and payload length; refuses a compressed envelope and one
/// larger than `max`.
fn envelope_header(h: &[u8; 5], max: usize) -> Result<(u8, usize), Error> {
    let flags = h[0];
    let len = u32::from_be_bytes([h[1], h[2], h[3], h[4]]) as usize;
    if flags & FLAG_COMPRESSED != 0 {
        return Err(Error::new(
            Code::Unimplemented,
            "compressed messages are not accepted: send Connect-Content-Encoding identity",
        ));
    }
    if len > max {
        return Err(Error::new(
            Code::ResourceExhausted,
            format!("a message of {len} bytes is over the limit of {max}"),
        ));
    }
    Ok((flags, len))
}

/// The one request message of a server-streaming call: exactly one envelope, not flagged
/// end-of-stream, holding JSON of type `T`.
pub fn stream_request<T: serde::de::DeserializeOwned>(body: &[u8]) -> Result<T, Error> {
    let (flags, payload, rest) = split_envelope(body, MAX_MESSAGE)?;
    if flags & FLAG_END_STREAM != 0 {
        return Err(Error::new(
            Code::InvalidArgument,
            "the request's envelope is flagged end-of-stream: send the message in a plain envelope",
        ));
    }
    if !rest.is_empty() {
        return Err(Error::new(
            Code::InvalidArgument,
            "a server-streaming call takes exactly one request message",
        ));
    }
    json(payload)
}

/// A request message parsed from JSON.
pub fn json<T: serde::de::DeserializeOwned>(payload: &[u8]) -> Result<T, Error> {
    if payload.len() > MAX_MESSAGE {
        return Err(Error::new(
            Code::ResourceExhausted,
            format!(
                "a message of {} bytes is over the limit of {MAX_MESSAGE}",
                payload.len()
            ),
        ));
    }
    serde_json::from_slice(payload)
        .map_err(|e| Error::new(Code::InvalidArgument, format!("the request message: {e}")))
}

/// Reads a client stream's envelopes as its body arrives, never holding more than one
/// envelope (at most [`MAX_MESSAGE`]) and what came with it.
pub struct EnvelopeReader<S> {
    body: S,
    buf: Vec<u8>,
    /// Where the unread part of `buf` starts (consumed bytes are dropped only when more are
    /// needed, so many small messages in one chunk cost no copying each).
    pos: usize,
    ended: bool,
}

impl<S, E> EnvelopeReader<S>
where
    S: futures_util::Stream<Item = Result<bytes::Bytes, E>> + Unpin,
    E: std::fmt::Display,
{
    pub fn new(body: S) -> Self {
        EnvelopeReader {
            body,
            buf: Vec::new(),
            pos: 0,
            ended: false,
        }
    }

    /// The next message's payload; `None` at the end of the stream (the body's end, or an
    /// end-of-stream envelope, which must be the last thing in it: after one, the body is read
    /// to its end, and any byte there is an error).
    pub async fn next(&mut self) -> Result<Option<Vec<u8>>, Error> {
        use futures_util::StreamExt;
        loop {
            let unread = &self.buf[self.pos..];
            if let Some(header) = unread.first_chunk::<5>() {
                let (flags, len) = envelope_header(header, MAX_MESSAGE)?;
                if unread.len() >= 5 + len {
                    let payload = unread[5..5 + len].to_vec();
                    self.pos += 5 + len;
                    if flags & FLAG_END_STREAM != 0 {
                        self.ended = true;
                        let after = || {
                            Error::new(
                                Code::InvalidArgument,
                                "data after the end-of-stream envelope",
                            )
                        };
                        if self.pos < self.buf.len() {
                            return Err(after());
                        }
                        // Nothing may follow it, however the body is cut into chunks: the
                        // rest of the body is read to its end (empty chunks pass).
                        while let Some(chunk) = self.body.next().await {
                            match chunk {
                                Ok(c) if c.is_empty() => {}
                                Ok(_) => return Err(after()),
                                Err(e) => {
                                    return Err(Error::new(
                                        Code::Canceled,
                                        format!("the request stream broke off: {e}"),
                                    ));
                                }
                            }
                        }
                        return Ok(None);
                    }
                    return Ok(Some(payload));
                }
            }
            if self.ended {
                return Ok(None);
            }
            // More is needed: what was read goes first (the buffer never holds more than one
            // envelope and a chunk).
            self.buf.drain(..self.pos);
            self.pos = 0;
            match self.body.next().await {
                Some(Ok(chunk)) => self.buf.extend_from_slice(&chunk),
                Some(Err(e)) => {
                    return Err(Error::new(
                        Code::Canceled,
                        format!("the request stream broke off: {e}"),
                    ));
                }
                None if self.buf.is_empty() => {
                    self.ended = true;
                    return Ok(None);
                }
                None => {
                    return Err(Error::new(
                        Code::InvalidArgument,
                        format!(
                            "the request stream ended inside an envelope ({} bytes of it)",
                            self.buf.len()
                        ),
                    ));
                }
            }
        }
    }
}

/// The `Connect-Timeout-Ms` header's value, where it is a valid one (1 to 10 digits).
pub fn timeout_ms(value: Option<&str>) -> Result<Option<u64>, Error> {
    match value {
        None => Ok(None),
        Some(v) if !v.is_empty() && v.len() <= 10 && v.bytes().all(|b| b.is_ascii_digit()) => {
            Ok(v.parse().ok())
        }
        Some(v) => Err(Error::new(
            Code::InvalidArgument,
            format!("Connect-Timeout-Ms must be 1 to 10 digits, got {v:?}"),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, serde::Deserialize, PartialEq)]
    struct Msg {
        a: u32,
    }

    #[test]
    fn envelopes_round_trip() {
        let e = envelope(0, b"{\"a\":7}");
        assert_eq!(&e[..5], &[0, 0, 0, 0, 7]);
        assert_eq!(stream_request::<Msg>(&e).unwrap(), Msg { a: 7 });
        let end = end_stream(None);
        assert_eq!(&end[..], b"\x02\x00\x00\x00\x02{}");
        let err = end_stream(Some(&Error::new(Code::NotFound, "no such process")));
        let (flags, payload, rest) = split_envelope(&err, MAX_MESSAGE).unwrap();
        assert_eq!((flags, rest.len()), (FLAG_END_STREAM, 0));
        assert_eq!(
            serde_json::from_slice::<serde_json::Value>(payload).unwrap(),
            serde_json::json!({"error": {"code": "not_found", "message": "no such process"}})
        );
    }

    #[test]
    fn malformed_envelopes_get_clear_errors() {
        // Short header, short payload, compressed, oversized, trailing data, end flag, bad JSON.
        let e = stream_request::<Msg>(b"\x00\x00").unwrap_err();
        assert_eq!(e.code, Code::InvalidArgument);
        assert!(e.message.contains("5-byte header"), "{e}");
        let e = stream_request::<Msg>(b"\x00\x00\x00\x00\x09{}").unwrap_err();
        assert!(e.message.contains("announces 9 bytes"), "{e}");
        let e = stream_request::<Msg>(b"\x01\x00\x00\x00\x02{}").unwrap_err();
        assert_eq!(e.code, Code::Unimplemented);
        let big = [0u8, 0xff, 0xff, 0xff, 0xff];
        let e = stream_request::<Msg>(&big).unwrap_err();
        assert_eq!(e.code, Code::ResourceExhausted);
        let mut two = envelope(0, b"{\"a\":1}").to_vec();
        two.extend_from_slice(&envelope(0, b"{\"a\":2}"));
        let e = stream_request::<Msg>(&two).unwrap_err();
        assert!(e.message.contains("exactly one"), "{e}");
        let e = stream_request::<Msg>(&end_stream(None)).unwrap_err();
        assert!(e.message.contains("end-of-stream"), "{e}");
        let e = stream_request::<Msg>(&envelope(0, b"{\"a\":")).unwrap_err();
        assert_eq!(e.code, Code::InvalidArgument);
        assert!(e.message.starts_with("the request message"), "{e}");
    }

    /// The reader over `body` cut into chunks of `n` bytes.
    fn reader_over(
        body: &[u8],
        n: usize,
    ) -> EnvelopeReader<
        futures_util::stream::Iter<std::vec::IntoIter<Result<bytes::Bytes, std::io::Error>>>,
    > {
        let chunks: Vec<Result<bytes::Bytes, std::io::Error>> = body
            .chunks(n.max(1))
            .map(|c| Ok(bytes::Bytes::copy_from_slice(c)))
            .collect();
        EnvelopeReader::new(futures_util::stream::iter(chunks))
    }

    async fn all(
        mut r: EnvelopeReader<
            impl futures_util::Stream<Item = Result<bytes::Bytes, std::io::Error>> + Unpin,
        >,
    ) -> Result<Vec<Vec<u8>>, Error> {
        let mut out = Vec::new();
        while let Some(m) = r.next().await? {
            out.push(m);
        }
        Ok(out)
    }

    #[tokio::test]
    async fn client_streams_are_read_as_they_arrive() {
        let mut body = envelope(0, b"1").to_vec();
        body.extend_from_slice(&envelope(0, b"22"));
        body.extend_from_slice(&envelope(0, b""));
        // However the body is cut, the same messages come out.
        for n in [1, 2, 3, 5, 7, 100] {
            assert_eq!(
                all(reader_over(&body, n)).await.unwrap(),
                vec![b"1".to_vec(), b"22".to_vec(), Vec::new()],
                "chunks of {n}"
            );
        }
        // An end-of-stream envelope ends it; anything after it is refused.
        body.extend_from_slice(&end_stream(None));
        assert_eq!(all(reader_over(&body, 4)).await.unwrap().len(), 3);
        body.push(0);
        let e = all(reader_over(&body, 4)).await.unwrap_err();
        assert!(e.message.contains("after the end-of-stream"), "{e}");
        assert!(all(reader_over(b"", 1)).await.unwrap().is_empty());
        // A body that stops inside an envelope, an oversized or compressed one.
        let e = all(reader_over(b"\x00\x00\x00\x00\x05abc", 2))
            .await
            .unwrap_err();
        assert!(e.message.contains("inside an envelope"), "{e}");
        let e = all(reader_over(b"\x00\xff\xff\xff\xff", 5))
            .await
            .unwrap_err();
        assert_eq!(e.code, Code::ResourceExhausted);
        let e = all(reader_over(b"\x01\x00\x00\x00\x01x", 5))
            .await
            .unwrap_err();
        assert_eq!(e.code, Code::Unimplemented);
        // A client that disconnects mid-stream.
        let broken: Vec<Result<bytes::Bytes, std::io::Error>> = vec![
            Ok(bytes::Bytes::from_static(b"\x00\x00\x00")),
            Err(std::io::Error::other("connection reset")),
        ];
        let e = all(EnvelopeReader::new(futures_util::stream::iter(broken)))
            .await
            .unwrap_err();
        assert_eq!(e.code, Code::Canceled);
    }

    /// Found by the fuzz target `connect_envelope`: with the end-of-stream envelope alone in
    /// a chunk, what came after it in a later chunk was never looked at, and the stream passed
    /// as well formed. However the body is cut, data after the end is refused.
    #[tokio::test]
    async fn data_after_the_end_of_stream_is_refused_however_the_body_is_cut() {
        let mut body = end_stream(None).to_vec();
        body.extend_from_slice(&envelope(0, b"x"));
        for n in [1, 2, 5, 7, 8, 100] {
            let e = all(reader_over(&body, n)).await.unwrap_err();
            assert!(
                e.message.contains("after the end-of-stream"),
                "chunks of {n}: {e}"
            );
        }
        // The fuzzer's input: an empty end-of-stream envelope, then a header, a byte at a time.
        let e = all(reader_over(b"\x02\0\0\0\0\0\0\0\0\x08\xff\xff\xff\xff", 1))
            .await
            .unwrap_err();
        assert!(e.message.contains("after the end-of-stream"), "{e}");
        // Empty chunks after it are no data.
        let chunks: Vec<Result<bytes::Bytes, std::io::Error>> =
            vec![Ok(end_stream(None)), Ok(bytes::Bytes::new())];
        let r = EnvelopeReader::new(futures_util::stream::iter(chunks));
        assert!(all(r).await.unwrap().is_empty());
    }

    #[test]
    fn codes_map_to_the_protocols_statuses() {
        assert_eq!(Code::NotFound.http_status(), StatusCode::NOT_FOUND);
        assert_eq!(Code::AlreadyExists.http_status(), StatusCode::CONFLICT);
        assert_eq!(
            Code::Unauthenticated.http_status(),
            StatusCode::UNAUTHORIZED
        );
        assert_eq!(
            Code::DeadlineExceeded.http_status(),
            StatusCode::GATEWAY_TIMEOUT
        );
        assert_eq!(Code::Canceled.http_status().as_u16(), 499);
        let body = Error::new(Code::AlreadyExists, "exists").unary_body();
        assert_eq!(body, br#"{"code":"already_exists","message":"exists"}"#);
    }

    #[test]
    fn timeouts_parse_or_are_refused() {
        assert_eq!(timeout_ms(None).unwrap(), None);
        assert_eq!(timeout_ms(Some("60000")).unwrap(), Some(60000));
        for bad in ["", "-1", "1e3", "12345678901", "6 0"] {
            assert!(timeout_ms(Some(bad)).is_err(), "{bad:?}");
        }
    }
}
