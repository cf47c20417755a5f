//! Entry points for the fuzz targets (`fuzz/` at the top of the repository, not an API): the
//! proxy's readers of a sandbox's first bytes, fed as `conn.rs` feeds them, with the checks
//! that whatever a client sends, the verdict does not depend on how its bytes were cut into
//! reads and nothing goes on to the server but a prefix of what the client sent.

use super::hello::{HelloReader, Progress};
use super::http::{self, Requests};
use super::name;

/// `Limits::max_head`'s default: the most bytes read before a verdict.
const MAX_HEAD: usize = 16 * 1024;

/// The cuts of `len` bytes into reads of `step` bytes (0: one read).
fn reads(len: usize, step: usize) -> impl Iterator<Item = usize> {
    let step = if step == 0 { len.max(1) } else { step };
    (1..=len.div_ceil(step)).map(move |i| (i * step).min(len))
}

/// A connection's first bytes read as a TLS ClientHello, in reads of `step` bytes and in one.
pub fn client_hello(step: usize, data: &[u8]) {
    let data = data.get(..MAX_HEAD).unwrap_or(data);
    if data.is_empty() {
        return;
    }
    let whole = HelloReader::new(MAX_HEAD).advance(data);
    let mut reader = HelloReader::new(MAX_HEAD);
    let mut cut = Progress::More;
    for n in reads(data.len(), step) {
        cut = reader.advance(data.get(..n).unwrap_or(data));
        if cut != Progress::More {
            break;
        }
    }
    assert_eq!(
        whole, cut,
        "the verdict on a ClientHello depends on its reads"
    );
    if let Progress::Done(h) = &whole {
        assert_eq!(name::normalize(h.name.as_bytes()).as_ref(), Ok(&h.name));
    }
}

/// A plain HTTP connection's bytes: the first head found as `conn.rs` looks for it (reads of
/// `step` bytes, at most [`MAX_HEAD`]), then every later request through [`Requests`], fed
/// in one piece and in reads of `step` bytes.
pub fn http_requests(step: usize, data: &[u8]) {
    let first = data.get(..MAX_HEAD).unwrap_or(data);
    let mut scanned = 0;
    let mut end = None;
    for n in reads(first.len(), step) {
        let read = first.get(..n).unwrap_or(first);
        end = http::head_end(read, scanned);
        if end.is_some() {
            break;
        }
        scanned = n;
    }
    assert_eq!(
        end,
        http::head_end(first, 0),
        "a head's end depends on the reads"
    );
    let Some(end) = end else { return };
    let (head, rest) = data.split_at(end);
    let Ok(h) = http::parse_head(head) else {
        return;
    };
    assert_eq!(name::normalize(h.name.as_bytes()).as_ref(), Ok(&h.name));

    let mut whole_out = head.to_vec();
    let whole = Requests::after(h.name.clone(), h.framing, MAX_HEAD).feed(rest, &mut whole_out);
    let mut cut_out = head.to_vec();
    let mut requests = Requests::after(h.name.clone(), h.framing, MAX_HEAD);
    let mut cut = Ok(());
    let mut from = 0;
    for n in reads(rest.len(), step) {
        cut = requests.feed(rest.get(from..n).unwrap_or_default(), &mut cut_out);
        from = n;
        if cut.is_err() {
            break;
        }
    }
    assert!(
        data.starts_with(&whole_out),
        "the proxy sent what the client did not"
    );
    assert!(
        data.starts_with(&cut_out),
        "the proxy sent what the client did not"
    );
    assert_eq!(whole, cut, "the verdict on a request depends on its reads");
    if whole.is_ok() {
        assert_eq!(whole_out, cut_out, "what passes depends on the reads");
    }
}
