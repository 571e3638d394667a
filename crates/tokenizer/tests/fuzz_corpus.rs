//! The `tokenizer` fuzz target's corpus and regressions, replayed on stable (see `fuzz/README.md`).

#[path = "../../../fuzz/replay.rs"]
mod replay;
#[path = "fuzz/tokenizer.rs"]
mod tokenizer;

#[test]
fn tokenizer_corpus_encodes_and_decodes() {
    let tokenizers = tokenizer::Tokenizers::load(&replay::repo_root());
    replay::replay("tokenizer", |data| tokenizer::run(&tokenizers, data));
}
