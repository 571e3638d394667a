//! The `manifest` fuzz target's corpus and regressions, replayed on stable (see `fuzz/README.md`).

#[path = "fuzz/manifest.rs"]
mod manifest;
#[path = "../../../fuzz/replay.rs"]
mod replay;

#[test]
fn manifest_corpus_opens_or_errors() {
    let model = manifest::model(&replay::repo_root());
    replay::replay("manifest", |data| manifest::run(&model, data));
}
