//! The transparent proxy's ClientHello reader (warren-net `proxy/hello.rs`). The first byte
//! is the size of the reads the bytes arrive in (0: one read); the rest is the connection.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    if let Some((&step, stream)) = data.split_first() {
        warren_net::proxy::fuzz::client_hello(usize::from(step), stream);
    }
});
