//! TITAN against the oracles: llama.cpp on every committed GGUF file and Hugging Face transformers (f32)
//! on the same tiny random-weight models (tests/fixtures, made by tools/make_fixtures.py).
//!
//! Each test prints the measured figure for every file before asserting, so a failure shows the whole
//! table, and the tolerances below can be checked against what was measured. Checks are written
//! `!(d <= tol)` so that a NaN difference fails them.
#![allow(clippy::neg_cmp_op_on_partial_ord)]

mod common;

use common::*;
use titan_engine::{GenerateOptions, Model, Outputs, SamplerOptions};

/// Allowed max |Δ| between TITAN's and llama.cpp's logits on the same file (logit std ≈ 1).
/// Measured (see the README's oracle table); the bound leaves roughly 2× headroom. Both engines quantise
/// activations the same way, but llama.cpp keeps its KV cache in f16 and f16 weights' activations in f16,
/// and TITAN keeps both in f32: float files differ from llama.cpp mostly by llama.cpp's own rounding.
fn llama_tolerance(file_type: &str) -> f32 {
    match file_type {
        // Same arithmetic up to summation order.
        "f32" => 2e-5,
        // llama.cpp rounds the activations of f16/bf16 weights to f16/bf16; TITAN keeps them in f32.
        "f16" => 1e-2,
        "bf16" => 5e-2,
        // Identical activation quantisation (Q8_0, Q8_K): only the f32 summation order differs. Measured
        // 4.8e-7 on every such file except mixtral's q8_0, where llama.cpp is 2–4e-2 away from TITAN at
        // some prompt positions from position 19 on (cause not identified; TITAN's rms error against
        // transformers on it is within 0.2% of llama.cpp's).
        "q4_0" | "q5_0" => 1e-5,
        "q8_0" => 5e-2,
        // Q8_1 activations (measured ≤ 4.7e-2; cause not traced, TITAN follows llama.cpp's reference quantiser).
        "q4_1" | "q5_1" => 1e-1,
        // K-quant mixes (Q8_K activations): measured 1.2e-6 .. 1.7e-6 on q3_k_m, q4_k_m, q6_k; 4.1e-3 on q5_k_m
        // and 4.8e-2 on q2_k (causes not traced).
        "q3_k_m" | "q4_k_m" | "q6_k" => 1e-5,
        "q5_k_m" => 1e-2,
        _ => 1e-1,
    }
}

struct Case {
    model: String,
    file_type: String,
    path: String,
    entry: serde_json::Value,
    hf: serde_json::Value,
    prompt: Vec<u32>,
}

fn cases() -> Vec<Case> {
    let m = manifest();
    let mut out = Vec::new();
    for model in m["models"].as_array().unwrap() {
        for (ty, entry) in model["files"].as_object().unwrap() {
            out.push(Case {
                model: model["name"].as_str().unwrap().to_string(),
                file_type: ty.clone(),
                path: fixtures().join(entry["path"].as_str().unwrap()).display().to_string(),
                entry: entry.clone(),
                hf: model["hf"].clone(),
                prompt: ids(&model["prompt_ids"]),
            });
        }
    }
    assert!(out.len() >= 20, "expected the full fixture set, found {} files", out.len());
    out
}

fn titan_logits(model: &Model, tokens: &[u32]) -> Vec<f32> {
    let mut seq = model.new_sequence(tokens.len());
    model.forward(tokens, 0, &mut seq, Outputs::All).unwrap().to_vec()
}

#[test]
fn logits_match_llama_cpp_on_every_file() {
    let mut failures = Vec::new();
    for c in cases() {
        let model = Model::load(&c.path).unwrap();
        let tokens = ids(&c.entry["llama"]["tokens"]);
        let (shape, reference) = read_npy(c.entry["llama"]["logits"].as_str().unwrap());
        assert_eq!(shape, vec![tokens.len(), model.config.n_vocab]);
        let ours = titan_logits(&model, &tokens);
        let d = max_abs_diff(&ours, &reference);
        let tol = llama_tolerance(&c.file_type);
        println!("{:<12} {:<7} max|Δ| vs llama.cpp {d:.3e} (rms {:.3e}, tolerance {tol:.0e})", c.model, c.file_type, rms_diff(&ours, &reference));
        if !(d <= tol) {
            failures.push(format!("{} {}: {d} > {tol}", c.model, c.file_type));
        }
    }
    assert!(failures.is_empty(), "{failures:#?}");
}

#[test]
fn float_files_match_transformers() {
    let mut failures = Vec::new();
    for c in cases().into_iter().filter(|c| ["f32", "f16", "bf16"].contains(&c.file_type.as_str())) {
        let model = Model::load(&c.path).unwrap();
        let tokens = ids(&c.hf["tokens"]);
        let (_, reference) = read_npy(c.hf["logits"].as_str().unwrap());
        let ours = titan_logits(&model, &tokens);
        let d = max_abs_diff(&ours, &reference);
        // f32 is the same arithmetic up to summation order; f16/bf16 weights are rounded copies of the f32
        // ones (bf16 keeps 8 bits of mantissa: llama.cpp is 0.3–0.4 away on these files too).
        let tol = match c.file_type.as_str() {
            "f32" => 1e-4,
            "f16" => 1e-2,
            _ => 5e-1,
        };
        println!("{:<12} {:<5} max|Δ| vs transformers {d:.3e} (tolerance {tol:.0e})", c.model, c.file_type);
        if !(d <= tol) {
            failures.push(format!("{} {}: {d} > {tol}", c.model, c.file_type));
        }
    }
    assert!(failures.is_empty(), "{failures:#?}");
}

/// On the positions where llama.cpp's sequence and transformers' agree (the prompt at least), TITAN's
/// logits on each file are at least as close to transformers' f32 logits as llama.cpp's are on that file.
#[test]
fn at_least_as_accurate_as_llama_cpp() {
    let mut failures = Vec::new();
    for c in cases() {
        let model = Model::load(&c.path).unwrap();
        let hf_tokens = ids(&c.hf["tokens"]);
        let ll_tokens = ids(&c.entry["llama"]["tokens"]);
        let common = hf_tokens.iter().zip(&ll_tokens).take_while(|(a, b)| a == b).count();
        let v = model.config.n_vocab;
        let (_, hf) = read_npy(c.hf["logits"].as_str().unwrap());
        let (_, ll) = read_npy(c.entry["llama"]["logits"].as_str().unwrap());
        let ours = titan_logits(&model, &hf_tokens[..common]);
        let (e_titan, e_llama) = (rms_diff(&ours, &hf[..common * v]), rms_diff(&ll[..common * v], &hf[..common * v]));
        println!("{:<12} {:<7} rms vs transformers over {common} positions: titan {e_titan:.3e}, llama.cpp {e_llama:.3e}", c.model, c.file_type);
        // 5% slack: on float files both errors are at rounding level, where the ranking is noise.
        if !(e_titan <= e_llama * 1.05 + 1e-6) {
            failures.push(format!("{} {}: titan {e_titan} > llama.cpp {e_llama}", c.model, c.file_type));
        }
    }
    assert!(failures.is_empty(), "{failures:#?}");
}

/// TITAN's greedy continuation equals llama.cpp's: entirely on float files; on quantised files up to the
/// first step where llama.cpp's own top-2 margin is inside the logit tolerance (there either engine's
/// rounding may pick the other token, and the continuations legitimately part).
#[test]
fn greedy_continuation_matches_llama_cpp() {
    let mut failures = Vec::new();
    for c in cases() {
        let model = Model::load(&c.path).unwrap();
        let prompt = &c.prompt;
        let mut expected = ids(&c.entry["llama"]["greedy"]);
        // llama.cpp's list ends with the end-of-generation token it stopped at; TITAN stops without emitting it.
        let stopped_at_eos = c.entry["llama"]["stopped_at_eos"].as_bool().unwrap();
        if stopped_at_eos {
            expected.pop();
        }
        let (_, ll) = read_npy(c.entry["llama"]["logits"].as_str().unwrap());
        let v = model.config.n_vocab;
        let float = ["f32", "f16", "bf16"].contains(&c.file_type.as_str());
        let tol = llama_tolerance(&c.file_type);
        let n = expected.len() + stopped_at_eos as usize;
        // Steps whose decision is well separated in llama.cpp's own logits.
        let must_match = if float {
            n
        } else {
            (0..n).take_while(|&i| margin(&ll[(prompt.len() - 1 + i) * v..][..v]) > 2.0 * tol).count()
        };
        let opts = GenerateOptions { max_tokens: n, sampler: SamplerOptions::greedy(), n_ctx: prompt.len() + n + 1 };
        let g = model.generate(prompt, &opts, |_| {}).unwrap();
        let got = g.tokens;
        let mut agree = got.iter().zip(&expected).take_while(|(a, b)| a == b).count();
        if agree == expected.len() && got.len() == expected.len() && stopped_at_eos == (g.stop == titan_engine::StopReason::EndOfGeneration) {
            agree += stopped_at_eos as usize; // the stop itself agrees
        }
        println!("{:<12} {:<7} greedy: {agree}/{n} tokens agree, {must_match} required", c.model, c.file_type);
        if agree < must_match {
            failures.push(format!("{} {}: {got:?} vs {expected:?}", c.model, c.file_type));
        }
    }
    assert!(failures.is_empty(), "{failures:#?}");
}

#[test]
fn tokenizer_matches_llama_cpp() {
    let m = manifest();
    let mut n = 0;
    for model in m["models"].as_array().unwrap() {
        let (_, first) = model["files"].as_object().unwrap().iter().next().unwrap();
        let tok = Model::load(fixtures().join(first["path"].as_str().unwrap())).unwrap().tokenizer;
        for case in model["tokenizer"].as_array().unwrap() {
            let text = case["text"].as_str().unwrap();
            let name = model["name"].as_str().unwrap();
            assert_eq!(tok.encode(text, false, false), ids(&case["ids"]), "{name}: {text:?}");
            assert_eq!(tok.encode(text, true, false), ids(&case["ids_add_special"]), "{name}: {text:?} with BOS/EOS");
            assert_eq!(tok.encode(text, false, true), ids(&case["ids_parse_special_no_add"]), "{name}: {text:?} parsing specials");
            assert_eq!(tok.encode(text, true, true), ids(&case["ids_parse_special"]), "{name}: {text:?} with BOS/EOS, parsing specials");
            assert_eq!(tok.decode(&ids(&case["ids"])).unwrap(), case["llama_detokenize"].as_str().unwrap(), "{name}: detokenise {text:?}");
            n += 1;
        }
    }
    assert!(n >= 40, "only {n} tokenizer cases");
}

/// Dequantisation of tensors taken from llama.cpp-written files equals gguf-py's, bit for bit, for every type.
#[test]
fn dequantisation_matches_gguf_py_on_every_type() {
    let m = manifest();
    let mut types = Vec::new();
    for d in m["dequant"].as_array().unwrap() {
        let ty = titan_kernels::GgmlType::from_id(d["ggml_type"].as_u64().unwrap() as u32).unwrap();
        let raw = std::fs::read(fixtures().join(d["bin"].as_str().unwrap())).unwrap();
        let (_, want) = read_npy(d["npy"].as_str().unwrap());
        let row = d["row"].as_u64().unwrap() as usize;
        let mut got = vec![0f32; want.len()];
        let row_bytes = ty.row_bytes(row).unwrap();
        for (src, dst) in raw.chunks_exact(row_bytes).zip(got.chunks_exact_mut(row)) {
            titan_kernels::dequantize_row(ty, src, dst).unwrap();
        }
        assert!(got.iter().zip(&want).all(|(a, b)| a.to_bits() == b.to_bits()), "{}: dequantisation differs from gguf-py", ty.name());
        types.push(ty.name());
    }
    println!("bit-identical to gguf-py: {types:?}");
    assert_eq!(types.len(), 13);
}

/// A Hugging Face tokenizer.json of the same tokenizer gives llama.cpp's ids too (BPE models).
#[test]
fn tokenizer_json_matches_llama_cpp() {
    let m = manifest();
    let mut n = 0;
    for model in m["models"].as_array().unwrap() {
        let name = model["name"].as_str().unwrap();
        let path = fixtures().join(name).join("tokenizer.json");
        if !path.exists() {
            continue; // the fixtures ship tokenizer.json for qwen3moe (qwen2 pre-tokenizer) and olmoe (olmo)
        }
        let tok = titan_tokenizer::Tokenizer::from_tokenizer_json(&path).unwrap();
        for case in model["tokenizer"].as_array().unwrap() {
            let text = case["text"].as_str().unwrap();
            assert_eq!(tok.encode(text, false, false), ids(&case["ids"]), "{name} tokenizer.json: {text:?}");
            n += 1;
        }
    }
    assert!(n >= 30, "only {n} cases");
}
