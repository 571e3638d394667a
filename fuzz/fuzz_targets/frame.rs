#![no_main]

#[path = "../../crates/net/tests/fuzz/frame.rs"]
mod body;

libfuzzer_sys::fuzz_target!(|data: &[u8]| body::run(data));
