//! The `gguf` fuzz target's corpus and regressions, replayed on stable (see `fuzz/README.md`).

#[path = "fuzz/gguf.rs"]
mod gguf;
#[path = "../../../fuzz/replay.rs"]
mod replay;

#[test]
fn gguf_corpus_opens_or_errors() {
    replay::replay("gguf", gguf::run);
}
