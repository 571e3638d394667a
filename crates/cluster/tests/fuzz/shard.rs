//! The `shard` fuzz target's body, shared by `fuzz/fuzz_targets/shard.rs` and
//! `tests/fuzz_corpus.rs`: arbitrary bytes as a shard file a node downloaded from the backbone,
//! opened as the node opens its cache (`ShardExperts::open` with digests checked), then every
//! expert it claims to hold viewed as the expert code views it.

use std::io::Write;

use titan_cluster::slice::ShardExperts;

pub fn run(data: &[u8]) {
    let mut file = tempfile::NamedTempFile::new().expect("creating a temp file");
    file.write_all(data).expect("writing the temp file");
    let Ok(shard) = ShardExperts::open(file.path(), true) else {
        return;
    };
    let _ = shard.expert_bytes();
    for l in shard.spec.layers.clone() {
        for e in shard.spec.experts.clone() {
            let w = shard.weights(l, e).expect("an expert the shard holds has weights");
            assert_eq!(
                (w.gate.rows, w.up.rows, w.down.cols),
                (shard.config.expert_ff, shard.config.expert_ff, shard.config.expert_ff)
            );
        }
    }
    assert!(shard
        .weights(*shard.spec.layers.end() + 1, *shard.spec.experts.start())
        .is_none());
}
