//! Bit-identity claims, checked with traces: the same run gives the same bytes whatever the thread
//! count, and a token's logits do not depend on whether it was computed in a prompt batch or alone.

mod common;

use common::*;
use titan_engine::trace::{diff, Trace};
use titan_engine::{GenerateOptions, Model, Outputs, SamplerOptions};

/// One model per architecture, and the K-quant model (every file of a model shares its code paths but
/// not its kernels, so take a few types too).
const FILES: &[&str] = &["qwen3moe/q4_0.gguf", "olmoe/q8_0.gguf", "qwen2moe/f16.gguf", "mixtral/q5_1.gguf", "qwen3moe-k/q4_k_m.gguf"];

fn traced_run(model: &Model, threads: usize) -> Trace {
    let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build().unwrap();
    let prompt = model.tokenizer.encode("The quick brown fox jumps over the lazy dog", true, false);
    let opts = GenerateOptions {
        max_tokens: 6,
        n_ctx: 64,
        sampler: SamplerOptions { temperature: 0.7, seed: 42, ..Default::default() },
    };
    let mut t = Trace::default();
    pool.install(|| model.generate_traced(&prompt, &opts, Some(&mut t), |_| {})).unwrap();
    t
}

#[test]
fn one_thread_and_two_threads_are_identical() {
    for f in FILES {
        let model = Model::load(fixtures().join(f)).unwrap();
        let (a, b) = (traced_run(&model, 1), traced_run(&model, 2));
        let rep = diff(&a, &b, None);
        println!("{f}: {} tensors, {} elements, {} decisions", rep.tensors, rep.elements, rep.decisions);
        assert!(rep.identical(), "{f}: {rep:?}");
        assert!(rep.decisions > 6 && rep.elements > 1000);
    }
}

#[test]
fn a_row_alone_equals_the_same_row_in_a_batch() {
    for f in FILES {
        let model = Model::load(fixtures().join(f)).unwrap();
        let tokens = model.tokenizer.encode("Héllo wörld, 日本語 🙂 fn main() {}", true, false);
        let v = model.config.n_vocab;
        let mut batch_seq = model.new_sequence(tokens.len());
        let batch = model.forward(&tokens, 0, &mut batch_seq, Outputs::All).unwrap();
        let mut seq = model.new_sequence(tokens.len());
        for (i, &t) in tokens.iter().enumerate() {
            let alone = model.forward(&[t], i, &mut seq, Outputs::Last).unwrap();
            let same = alone.iter().zip(&batch[i * v..(i + 1) * v]).all(|(a, b)| a.to_bits() == b.to_bits());
            assert!(same, "{f}: position {i} differs between batch and single-row computation");
        }
    }
}

/// The public API refuses what it cannot run, without panicking: no tokens, a position past the context,
/// a sampler value out of range, a context beyond the model's or beyond memory.
#[test]
fn requests_that_cannot_run_are_errors() {
    let model = Model::load(fixtures().join(FILES[0])).unwrap();
    let mut seq = model.new_sequence(8);
    let err = model.forward(&[], 0, &mut seq, Outputs::All).unwrap_err().to_string();
    assert_eq!(err, "forward was given no tokens");
    let err = model.forward(&[1], usize::MAX, &mut seq, Outputs::All).unwrap_err().to_string();
    assert!(err.starts_with("context of 8 tokens exceeded"), "{err}");
    let opts = GenerateOptions { max_tokens: usize::MAX, n_ctx: 8, sampler: SamplerOptions { top_p: 2.0, ..Default::default() } };
    let err = model.generate(&[1, 2], &opts, |_| {}).unwrap_err().to_string();
    assert_eq!(err, "top_p is 2; it must be in (0, 1]");
    let trained = model.config.n_ctx_train;
    let err = model.check_context(trained + 1, u64::MAX, false).unwrap_err().to_string();
    assert!(err.contains(&format!("outside 1..={trained}")), "{err}");
    let err = model.check_context(trained + 1, 1 << 10, true).unwrap_err().to_string();
    assert!(err.contains("of KV cache, more than the 0.0 GiB of memory available"), "{err}");
    model.check_context(trained, u64::MAX, false).unwrap();
    model.check_context(trained * 2, u64::MAX, true).unwrap();
}
