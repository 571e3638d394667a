//! The `proto`, `http_body` and `shard` fuzz targets' corpora and regressions, replayed on stable
//! (see `fuzz/README.md`).

#[path = "fuzz/http_body.rs"]
mod http_body;
#[path = "fuzz/proto.rs"]
mod proto;
#[path = "../../../fuzz/replay.rs"]
mod replay;
#[path = "fuzz/shard.rs"]
mod shard;

#[test]
fn proto_corpus_decodes_or_errors() {
    replay::replay("proto", proto::run);
}

#[test]
fn http_body_corpus_parses_or_errors() {
    replay::replay("http_body", http_body::run);
}

#[test]
fn shard_corpus_opens_or_errors() {
    replay::replay("shard", shard::run);
}
