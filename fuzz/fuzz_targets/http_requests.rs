//! The transparent proxy's HTTP/1 framing (warren-net `proxy/http.rs`): the first head, then
//! every later request and body. The first byte is the size of the reads (0: one read); the
//! rest is what the client sends.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    if let Some((&step, stream)) = data.split_first() {
        warren_net::proxy::fuzz::http_requests(usize::from(step), stream);
    }
});
