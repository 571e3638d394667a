#![no_main]

#[path = "../../crates/cluster/tests/fuzz/shard.rs"]
mod body;

libfuzzer_sys::fuzz_target!(|data: &[u8]| body::run(data));
