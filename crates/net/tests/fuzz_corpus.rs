//! The `frame` fuzz target's corpus and regressions, replayed on stable (see `fuzz/README.md`).

#[path = "fuzz/frame.rs"]
mod frame;
#[path = "../../../fuzz/replay.rs"]
mod replay;

#[test]
fn frame_corpus_decodes_or_errors() {
    replay::replay("frame", frame::run);
}
