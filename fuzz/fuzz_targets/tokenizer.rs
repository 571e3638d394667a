#![no_main]

use std::path::Path;
use std::sync::OnceLock;

#[path = "../../crates/tokenizer/tests/fuzz/tokenizer.rs"]
mod body;

static TOKENIZERS: OnceLock<body::Tokenizers> = OnceLock::new();

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let tokenizers = TOKENIZERS
        .get_or_init(|| body::Tokenizers::load(&Path::new(env!("CARGO_MANIFEST_DIR")).join("..")));
    body::run(tokenizers, data)
});
