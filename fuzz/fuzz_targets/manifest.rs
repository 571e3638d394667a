#![no_main]

use std::path::Path;
use std::sync::OnceLock;

use titan_gguf::GgufFile;

#[path = "../../crates/store/tests/fuzz/manifest.rs"]
mod body;

static MODEL: OnceLock<GgufFile> = OnceLock::new();

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let model =
        MODEL.get_or_init(|| body::model(&Path::new(env!("CARGO_MANIFEST_DIR")).join("..")));
    body::run(model, data)
});
