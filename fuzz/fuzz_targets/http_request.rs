#![no_main]

#[path = "../../crates/server/tests/fuzz/http_request.rs"]
mod body;

use std::sync::OnceLock;

static TEMPLATE: OnceLock<titan_server::template::ChatTemplate> = OnceLock::new();

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    body::run(TEMPLATE.get_or_init(|| body::template(&root)), data)
});
