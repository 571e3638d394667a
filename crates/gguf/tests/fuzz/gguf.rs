//! The `gguf` fuzz target's body, shared by `fuzz/fuzz_targets/gguf.rs` and `tests/fuzz_corpus.rs`:
//! arbitrary bytes as a model file, opened as the loader opens one, then every accessor the loader
//! and the cluster call on a file that opened, then the model loader itself (config, weights, tokenizer).
//! The reader promises an error, never a panic, and views that lie inside the file; the asserts check
//! the views.

use std::io::Write;

use titan_gguf::GgufFile;

pub fn run(data: &[u8]) {
    // The reader maps a path (as the loader does), so the bytes go through a file.
    let mut file = tempfile::NamedTempFile::new().expect("creating a temp file");
    file.write_all(data).expect("writing the temp file");
    let Ok(g) = GgufFile::open(file.path()) else {
        return;
    };

    assert_eq!(g.file_len(), data.len() as u64);
    // The cluster hashes the header as the model's identity (`model_identity`).
    assert!(
        g.bytes(0, g.data_offset as usize).is_some() || g.tensors.is_empty(),
        "header past the end with tensors present"
    );
    for (key, value) in &g.metadata {
        let _ = value.to_string();
        assert!(g.get(key).is_some(), "metadata key {key:?} listed but not found");
        let _ = (
            g.get_u64(key),
            g.get_f64(key),
            g.get_bool(key),
            g.get_str(key),
            g.get_array(key),
        );
        let _ = (g.strings(key), g.f32s(key), g.i64s(key), g.u64_of(key), g.require(key));
    }
    for t in &g.tensors {
        let found = g.tensor(&t.name).expect("a listed tensor is found by name");
        assert_eq!(found.offset, t.offset);
        assert_eq!(g.tensor_data(t).len() as u64, t.size, "tensor {:?}", t.name);
        let _ = t.n_rows();
    }
    // The loader checks every size against the tensors before it allocates: a file that opened either
    // loads or is refused with an error, and a model that loaded has the shapes its config says.
    drop(g);
    if let Ok(model) = titan_engine::Model::load(file.path()) {
        assert_eq!(model.weights.layers.len(), model.config.n_layer);
    }
}
