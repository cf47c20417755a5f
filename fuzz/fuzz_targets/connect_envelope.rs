//! The E2B gateway's Connect framing (warren-e2b `connect.rs`): a request body split into
//! envelopes at once (`split_envelope`, `stream_request`) and read as a client stream arriving
//! in chunks (`EnvelopeReader`); both must agree. The first byte is the chunk size (0: one
//! chunk), the second the `max` given to `split_envelope`'s first call (in KiB; 0: the limit).
#![no_main]

use futures_util::FutureExt;
use warren_e2b::connect::{self, EnvelopeReader, FLAG_END_STREAM, MAX_MESSAGE};

/// Envelopes as `split_envelope` finds them: payloads up to an end-of-stream one, or an error.
fn split_all(mut body: &[u8]) -> Result<Vec<Vec<u8>>, ()> {
    let mut out = Vec::new();
    while !body.is_empty() {
        let (flags, payload, rest) = connect::split_envelope(body, MAX_MESSAGE).map_err(|_| ())?;
        body = rest;
        if flags & FLAG_END_STREAM != 0 {
            return if rest.is_empty() { Ok(out) } else { Err(()) };
        }
        out.push(payload.to_vec());
    }
    Ok(out)
}

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let [step, max, body @ ..] = data else { return };
    let max = if *max == 0 {
        MAX_MESSAGE
    } else {
        usize::from(*max) << 10
    };
    if let Ok((_, payload, rest)) = connect::split_envelope(body, max) {
        assert!(payload.len() <= max && payload.len() + rest.len() + 5 == body.len());
    }
    let _ = connect::stream_request::<serde_json::Value>(body);
    let _ = connect::json::<serde_json::Value>(body);
    let _ = connect::timeout_ms(std::str::from_utf8(body).ok());

    let step = if *step == 0 {
        body.len().max(1)
    } else {
        usize::from(*step)
    };
    let chunks: Vec<Result<bytes::Bytes, String>> = body
        .chunks(step)
        .map(|c| Ok(bytes::Bytes::copy_from_slice(c)))
        .collect();
    let mut reader = EnvelopeReader::new(futures_util::stream::iter(chunks));
    let mut streamed = Vec::new();
    let streamed = loop {
        // The stream never waits: every poll finishes at once.
        match reader.next().now_or_never().expect("a ready stream") {
            Ok(Some(p)) => streamed.push(p),
            Ok(None) => break Ok(streamed),
            Err(_) => break Err(()),
        }
    };
    assert_eq!(
        split_all(body),
        streamed,
        "the two readers of envelopes disagree"
    );
});
