//! The `manifest` fuzz target's body, shared by `fuzz/fuzz_targets/manifest.rs` and
//! `tests/fuzz_corpus.rs`: arbitrary bytes as a store's `manifest.json`, beside an `experts.bin`
//! whose length the first bytes choose (through `arbitrary`), opened as `titan verify` opens a
//! store (no model) and as the loader opens one (against a fixture model), then every record read.

use std::path::Path;

use arbitrary::Unstructured;
use titan_gguf::GgufFile;
use titan_store::{Manifest, Store, StoreOptions, EXPERTS_FILE, MANIFEST_FILE};

/// The model a store is checked against: a fixture small enough to convert in the seed corpus.
pub const MODEL: &str = "tests/fixtures/qwen3moe/q8_0.gguf";

pub fn run(model: &GgufFile, data: &[u8]) {
    let mut u = Unstructured::new(data);
    // Enough for the fixture's records at the default alignment, small enough to read every one.
    let Ok(bin_len) = u.int_in_range(0..=1u64 << 20) else {
        return;
    };
    let manifest = u.take_rest();

    let dir = tempfile::tempdir().expect("creating a temp dir");
    std::fs::write(dir.path().join(MANIFEST_FILE), manifest).expect("writing the manifest");
    let bin = std::fs::File::create(dir.path().join(EXPERTS_FILE)).expect("creating experts.bin");
    bin.set_len(bin_len).expect("sizing experts.bin");

    let Ok(m) = Manifest::load(&dir.path().join(MANIFEST_FILE)) else {
        return;
    };
    if let Ok(store) = Store::open_unchecked(dir.path(), &StoreOptions::default()) {
        read_every_record(&store, &m, bin_len);
    }
    if let Ok(store) = Store::open(dir.path(), model) {
        read_every_record(&store, &m, bin_len);
    }
}

/// A store that opened lies inside its file: every record its manifest `m` lists can be read (the
/// digests of these zeroed records fail, which is an error, not a panic).
fn read_every_record(store: &Store, m: &Manifest, bin_len: u64) {
    assert!(store.max_record_bytes() <= bin_len);
    assert_eq!(store.records().len(), m.records.len());
    for r in &m.records {
        assert!(store.is_moe_layer(r.layer));
        let bytes = store
            .record_bytes(r.layer, r.expert)
            .expect("a listed record has a size");
        assert!(
            r.offset + bytes <= bin_len,
            "record of layer {} expert {} past the end",
            r.layer,
            r.expert
        );
        let _ = store.read(r.layer, r.expert);
    }
}

/// Opens the fixture model the stores are checked against.
pub fn model(repo: &Path) -> GgufFile {
    GgufFile::open(repo.join(MODEL)).expect("opening the fixture model")
}
