//! Reading what is left of a request body when a handler answered without it.
//!
//! A handler that refuses a request early (a bad path, an unknown sandbox, a body that fails a
//! cheap check) drops the body unread. hyper then closes the connection with the rest of the
//! body unread, and a client still sending it may get a broken pipe instead of the answer: the
//! control plane, forwarding an upload to a node, saw that as "node does not answer" (503) in a
//! third of such requests. This layer reads and drops the rest first, up to [`DRAIN_LIMIT`]
//! bytes and [`DRAIN_TIME`], so the answer arrives and the connection stays usable. Nothing
//! read is kept.

use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::{Body, Bytes, HttpBody};
use axum::extract::Request;
use axum::http::header;
use axum::middleware::Next;
use axum::response::Response;
use futures_util::StreamExt;

/// Most bytes of an unread body read (and dropped) before answering. Larger bodies are cut
/// off: their clients may see the connection close instead of the answer.
pub const DRAIN_LIMIT: u64 = 64 << 20;

/// Longest time spent reading an unread body before answering anyway.
pub const DRAIN_TIME: Duration = Duration::from_secs(10);

/// Middleware (`axum::middleware::from_fn(drain::unread_body)`): once the handler has
/// answered and dropped the request body, reads what is left of it.
pub async fn unread_body(req: Request, next: Next) -> Response {
    let (parts, body) = req.into_parts();
    if body.is_end_stream() {
        return next.run(Request::from_parts(parts, body)).await;
    }
    let declared = parts
        .headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    let slot = Arc::new(Mutex::new(Some(body)));
    let req = Request::from_parts(parts, Body::new(Shared(slot.clone())));
    let resp = next.run(req).await;
    // Only a body nobody holds any more: a handler still streaming it (a forward in flight)
    // reads it itself.
    if Arc::strong_count(&slot) > 1 || declared.is_some_and(|len| len > DRAIN_LIMIT) {
        return resp;
    }
    let rest = slot.lock().unwrap_or_else(|p| p.into_inner()).take();
    if let Some(rest) = rest.filter(|b| !b.is_end_stream()) {
        let mut stream = rest.into_data_stream();
        let _ = tokio::time::timeout(DRAIN_TIME, async {
            let mut read = 0u64;
            while let Some(Ok(chunk)) = stream.next().await {
                read += chunk.len() as u64;
                if read > DRAIN_LIMIT {
                    break;
                }
            }
        })
        .await;
    }
    resp
}

/// The request body as the handler sees it, shared with the layer that drains it.
struct Shared(Arc<Mutex<Option<Body>>>);

impl HttpBody for Shared {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, axum::Error>>> {
        let mut slot = self.0.lock().unwrap_or_else(|p| p.into_inner());
        match slot.as_mut() {
            Some(body) => Pin::new(body).poll_frame(cx),
            None => Poll::Ready(None),
        }
    }

    fn is_end_stream(&self) -> bool {
        let slot = self.0.lock().unwrap_or_else(|p| p.into_inner());
        slot.as_ref().is_none_or(|b| b.is_end_stream())
    }

    fn size_hint(&self) -> http_body::SizeHint {
        let slot = self.0.lock().unwrap_or_else(|p| p.into_inner());
        slot.as_ref().map(|b| b.size_hint()).unwrap_or_default()
    }
}
