//! The guest protocol's framing (warren-types `guest.rs` headers, warren-guest `wire.rs`
//! `read_frame`, compiled here from its own source: the guest is a binary, not a library) and
//! the JSON messages both ends read: frames read off the bytes until they end or fail, every
//! message frame decoded as each message type.
#![no_main]

use futures_util::FutureExt;
use warren_types::guest::{self, FrameKind};

#[allow(dead_code)]
#[path = "../../crates/warren-guest/src/wire.rs"]
mod wire;

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    if let Some(h) = data.first_chunk::<{ guest::HEADER_LEN }>()
        && let Ok((kind, len)) = guest::decode_header(*h)
    {
        assert_eq!(guest::encode_header(kind, len), *h);
    }
    let mut r = data;
    // A slice never makes a read wait: every poll finishes at once.
    while let Ok(Some((kind, payload))) = wire::read_frame(&mut r)
        .now_or_never()
        .expect("a ready reader")
    {
        if kind != FrameKind::Message {
            continue;
        }
        let _ = serde_json::from_slice::<guest::Hello>(&payload);
        let _ = serde_json::from_slice::<guest::Request>(&payload);
        let _ = serde_json::from_slice::<guest::Reply>(&payload);
        let _ = serde_json::from_slice::<guest::InitConfig>(&payload);
        let _ = serde_json::from_slice::<guest::Activate>(&payload);
        let _ = serde_json::from_slice::<guest::CallSpec>(&payload);
    }
});
