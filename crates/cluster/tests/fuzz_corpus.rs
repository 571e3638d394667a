//! The `proto` and `http_body` fuzz targets' corpora and regressions, replayed on stable (see
//! `fuzz/README.md`).

#[path = "../../../fuzz/replay.rs"]
mod replay;
#[path = "fuzz/http_body.rs"]
mod http_body;
#[path = "fuzz/proto.rs"]
mod proto;

#[test]
fn proto_corpus_decodes_or_errors() {
    replay::replay("proto", proto::run);
}

#[test]
fn http_body_corpus_parses_or_errors() {
    replay::replay("http_body", http_body::run);
}
