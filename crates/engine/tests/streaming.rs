//! Experts streamed from an expert store through a bounded cache give the same bytes as the fully
//! resident model, for every budget down to one expert per layer, with buffered and direct I/O.

mod common;

use common::*;
use titan_engine::trace::{diff, Trace};
use titan_engine::{GenerateOptions, LoadOptions, Model, Outputs, SamplerOptions, StreamOptions};
use titan_gguf::GgufFile;
use titan_store::{convert, ConvertOptions, ExpertCache, Policy, Store};

const FILES: &[&str] = &["qwen3moe/q4_0.gguf", "qwen2moe/q8_0.gguf", "olmoe/f16.gguf", "mixtral/q4_1.gguf", "qwen3moe-k/q4_k_m.gguf"];

fn streamed(path: &std::path::Path, store: &std::path::Path, budget_bytes: u64, direct_io: bool, prefetch: bool) -> Model {
    let opts = LoadOptions {
        stream: Some(StreamOptions { store: store.to_path_buf(), budget_bytes, policy: Policy::Lru, direct_io, verify_digests: true, pinned: vec![], prefetch }),
    };
    Model::load_with(path, &opts).unwrap()
}

fn trace_of(model: &Model, prompt: &[u32]) -> Trace {
    let opts = GenerateOptions { max_tokens: 8, n_ctx: 64, sampler: SamplerOptions { temperature: 0.9, seed: 3, ..Default::default() } };
    let mut t = Trace::default();
    model.generate_traced(prompt, &opts, Some(&mut t), |_| {}).unwrap();
    t
}

#[test]
fn every_budget_and_io_mode_is_bit_identical_to_resident() {
    // Stores live beside the test binary, on the build disk (O_DIRECT needs a real filesystem).
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    for f in FILES {
        let path = fixtures().join(f);
        let store = dir.path().join(f.replace('/', "_")).with_extension("titan");
        convert(&GgufFile::open(&path).unwrap(), &store, &ConvertOptions::default(), &mut |_, _| {}).unwrap();
        let resident = Model::load(&path).unwrap();
        let tokens = resident.tokenizer.encode("Streaming experts from SSD: café 日本語 🙂", true, false);
        let mut seq = resident.new_sequence(tokens.len());
        let want = resident.forward(&tokens, 0, &mut seq, Outputs::All).unwrap();
        let want_trace = trace_of(&resident, &tokens);

        let s = Store::open(&store, &resident.weights.file).unwrap();
        let (min, all) = (ExpertCache::min_budget(&s), s.manifest().records.len() as u64 * s.max_record_bytes());
        for budget in [1, min, all / 3, all] {
            for direct in [false, true] {
                let m = streamed(&path, &store, budget, direct, budget == all / 3);
                let mut seq = m.new_sequence(tokens.len());
                let got = m.forward(&tokens, 0, &mut seq, Outputs::All).unwrap();
                assert!(got.iter().zip(want).all(|(a, b)| a.to_bits() == b.to_bits()), "{f}: budget {budget}, direct {direct}: logits differ");
                let rep = diff(&want_trace, &trace_of(&m, &tokens), None);
                assert!(rep.identical(), "{f}: budget {budget}, direct {direct}: {rep:?}");
                let stats = m.experts.cache().unwrap().stats();
                assert!(stats.resident_bytes <= stats.budget_bytes, "{f}: over budget");
                assert!(stats.total.misses > 0);
                println!("{f}: budget {budget} direct {direct}: hit rate {:.2}", stats.total.hit_rate());
            }
        }
    }
}
