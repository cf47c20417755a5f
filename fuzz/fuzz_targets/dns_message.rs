//! The DNS proxy's message handling (warren-net `dns/message.rs`): the bytes as a sandbox's
//! query (and the answers made to it), then as an upstream's answer (checked, filtered).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    warren_net::dns::fuzz::message(data);
});
