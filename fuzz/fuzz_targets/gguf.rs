#![no_main]

#[path = "../../crates/gguf/tests/fuzz/gguf.rs"]
mod body;

libfuzzer_sys::fuzz_target!(|data: &[u8]| body::run(data));
