//! TITAN against llama.cpp on the trained demo model (models/demo/demo-q8_0.gguf, made by tools/train_demo.py):
//! logits and greedy continuations for the prompts in models/demo/reference.json, the tokenisation of the prompts
//! and of models/demo/heldout.txt, and perplexity on heldout.txt computed as llama-perplexity computes it.
//!
//! As in oracle.rs, each test prints its figures before asserting, and checks are written `!(d <= tol)` so that a
//! NaN fails them.
#![allow(clippy::neg_cmp_op_on_partial_ord)]

mod common;

use std::path::PathBuf;

use common::*;
use serde_json::Value;
use titan_engine::{GenerateOptions, Model, Outputs, SamplerOptions, StopReason};

/// Allowed max |Δ| between TITAN's and llama.cpp's logits: the Q8_0 tolerance of oracle.rs.
const LOGIT_TOL: f32 = 5e-2;
/// Allowed relative difference between TITAN's and llama.cpp's perplexity (overall and per chunk).
const PPL_REL_TOL: f64 = 1e-3;

fn demo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../models/demo")
}

fn reference() -> Value {
    let p = demo().join("reference.json");
    let text = std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e} (run tools/train_demo.sh)", p.display()));
    serde_json::from_str(&text).expect("reference.json parses")
}

fn model() -> Model {
    let r = reference();
    Model::load(demo().join(r["model"]["path"].as_str().unwrap())).unwrap()
}

/// A .npy file of models/demo (common::read_npy takes paths relative to tests/fixtures).
fn read_demo_npy(name: &str) -> (Vec<usize>, Vec<f32>) {
    read_npy(&format!("../../models/demo/{name}"))
}

#[test]
fn demo_file_is_the_reference_file() {
    let r = reference();
    let path = demo().join(r["model"]["path"].as_str().unwrap());
    let bytes = std::fs::metadata(&path).unwrap().len();
    assert_eq!(bytes, r["model"]["bytes"].as_u64().unwrap(), "{} is not the file reference.json was made from", path.display());
}

#[test]
fn demo_logits_match_llama_cpp() {
    let r = reference();
    let model = model();
    let mut failures = Vec::new();
    for p in r["prompts"].as_array().unwrap() {
        let tokens = ids(&p["tokens"]);
        let (shape, reference) = read_demo_npy(p["logits"].as_str().unwrap());
        assert_eq!(shape, vec![tokens.len(), model.config.n_vocab]);
        let mut seq = model.new_sequence(tokens.len());
        let ours = model.forward(&tokens, 0, &mut seq, Outputs::All).unwrap().to_vec();
        let d = max_abs_diff(&ours, &reference);
        println!("{:<45?} {} positions: max|Δ| vs llama.cpp {d:.3e} (rms {:.3e}, tolerance {LOGIT_TOL:.0e})", p["text"].as_str().unwrap(), tokens.len(), rms_diff(&ours, &reference));
        if !(d <= LOGIT_TOL) {
            failures.push(format!("{:?}: {d} > {LOGIT_TOL}", p["text"].as_str().unwrap()));
        }
    }
    assert!(failures.is_empty(), "{failures:#?}");
}

/// TITAN's greedy continuation of every prompt equals llama.cpp's, token for token, up to the first step whose
/// top-2 margin in llama.cpp's own logits is inside twice the logit tolerance (none, when the references were
/// made; the test prints how many steps were required).
#[test]
fn demo_greedy_matches_llama_cpp() {
    let r = reference();
    let model = model();
    let v = model.config.n_vocab;
    let mut failures = Vec::new();
    for p in r["prompts"].as_array().unwrap() {
        let prompt = ids(&p["prompt_ids"]);
        let mut expected = ids(&p["greedy"]);
        let stopped_at_eos = p["stopped_at_eos"].as_bool().unwrap();
        if stopped_at_eos {
            expected.pop(); // TITAN stops without emitting the end-of-generation token
        }
        let n = expected.len() + stopped_at_eos as usize;
        let (_, ll) = read_demo_npy(p["logits"].as_str().unwrap());
        let must_match = (0..n).take_while(|&i| margin(&ll[(prompt.len() - 1 + i) * v..][..v]) > 2.0 * LOGIT_TOL).count();
        let opts = GenerateOptions { max_tokens: n, sampler: SamplerOptions::greedy(), n_ctx: prompt.len() + n + 1 };
        let g = model.generate(&prompt, &opts, |_| {}).unwrap();
        let mut agree = g.tokens.iter().zip(&expected).take_while(|(a, b)| a == b).count();
        if agree == expected.len() && g.tokens.len() == expected.len() && stopped_at_eos == (g.stop == StopReason::EndOfGeneration) {
            agree += stopped_at_eos as usize;
        }
        let text = model.tokenizer.decode(&g.tokens).unwrap();
        println!("{:<45?} greedy: {agree}/{n} tokens agree, {must_match} required: {text:?}", p["text"].as_str().unwrap());
        if agree < must_match {
            failures.push(format!("{:?}: {:?} vs {expected:?}", p["text"].as_str().unwrap(), g.tokens));
        }
    }
    assert!(failures.is_empty(), "{failures:#?}");
}

#[test]
fn demo_tokenizer_matches_llama_cpp() {
    let r = reference();
    let model = model();
    for p in r["prompts"].as_array().unwrap() {
        let text = p["text"].as_str().unwrap();
        assert_eq!(model.tokenizer.encode(text, true, false), ids(&p["prompt_ids"]), "{text:?}");
        let greedy: Vec<u32> = ids(&p["greedy"]).into_iter().filter(|&t| t != r["model"]["eos_id"].as_u64().unwrap() as u32).collect();
        assert_eq!(model.tokenizer.decode(&greedy).unwrap(), p["greedy_text"].as_str().unwrap(), "detokenise the continuation of {text:?}");
    }
    let heldout = std::fs::read_to_string(demo().join("heldout.txt")).unwrap();
    let ours = model.tokenizer.encode(&heldout, true, false);
    let theirs = ids(&r["perplexity"]["tokens"]);
    let first_diff = ours.iter().zip(&theirs).position(|(a, b)| a != b);
    assert!(ours == theirs, "heldout.txt: {} tokens vs llama.cpp's {}, first difference at {first_diff:?}", ours.len(), theirs.len());
    println!("heldout.txt: {} tokens, identical to llama.cpp's", ours.len());
}

/// Perplexity over heldout.txt as llama.cpp's llama-perplexity computes it (tools/perplexity/perplexity.cpp):
/// floor(n / n_ctx) chunks of n_ctx tokens, each evaluated from an empty cache with its first token replaced by
/// BOS when the vocabulary adds BOS; the second half of each chunk scored (logits at positions n_ctx/2 .. n_ctx-2
/// against the next tokens), log-softmax in f64; the perplexity after each chunk is exp(total NLL / count).
#[test]
fn demo_perplexity_matches_llama_cpp() {
    let r = reference();
    let ppl = &r["perplexity"];
    let model = model();
    let v = model.config.n_vocab;
    let n_ctx = ppl["n_ctx"].as_u64().unwrap() as usize;
    let tokens = ids(&ppl["tokens"]);
    let add_bos = ppl["add_bos"].as_bool().unwrap();
    let bos = r["model"]["bos_id"].as_u64().unwrap() as u32;
    let n_chunk = tokens.len() / n_ctx;
    assert_eq!(n_chunk, ppl["n_chunks"].as_u64().unwrap() as usize);
    let first = n_ctx / 2;
    let (mut nll_total, mut count) = (0f64, 0usize);
    let mut failures = Vec::new();
    for (i, want) in ppl["chunks"].as_array().unwrap().iter().enumerate() {
        let mut chunk = tokens[i * n_ctx..(i + 1) * n_ctx].to_vec();
        if add_bos {
            chunk[0] = bos;
        }
        let mut seq = model.new_sequence(n_ctx);
        let logits = model.forward(&chunk, 0, &mut seq, Outputs::All).unwrap();
        let mut nll = 0f64;
        for pos in first..n_ctx - 1 {
            let row = &logits[pos * v..][..v];
            let max = row.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b)) as f64;
            let sum: f64 = row.iter().map(|&x| (x as f64 - max).exp()).sum();
            let target = tokens[i * n_ctx + pos + 1] as usize;
            nll += max + sum.ln() - row[target] as f64;
        }
        let n = n_ctx - 1 - first;
        nll_total += nll;
        count += n;
        let (ours, theirs) = ((nll / n as f64).exp(), want["ppl"].as_f64().unwrap());
        let rel = (ours - theirs).abs() / theirs;
        println!("chunk {i:>2}: ppl {ours:.4} (llama.cpp {theirs:.4}, rel {rel:.2e}), running {:.4}", (nll_total / count as f64).exp());
        if !(rel <= PPL_REL_TOL) {
            failures.push(format!("chunk {i}: {ours} vs {theirs}"));
        }
    }
    let (ours, theirs) = ((nll_total / count as f64).exp(), ppl["ppl"].as_f64().unwrap());
    let rel = (ours - theirs).abs() / theirs;
    println!("heldout.txt perplexity (ctx {n_ctx}, {n_chunk} chunks): TITAN {ours:.4}, llama.cpp {theirs:.4} (rel {rel:.2e}, tolerance {PPL_REL_TOL:.0e})");
    if !(rel <= PPL_REL_TOL) {
        failures.push(format!("overall: {ours} vs {theirs}"));
    }
    assert!(failures.is_empty(), "{failures:#?}");
}
