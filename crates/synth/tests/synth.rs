//! Small synthetic models written to a temporary directory: they open with TITAN's GGUF reader and
//! engine, carry the expected metadata and shapes, are reproducible byte for byte, and route like a
//! trained model.

use std::path::{Path, PathBuf};

use titan_engine::{Model, Outputs};
use titan_gguf::GgufFile;
use titan_kernels::GgmlType;
use titan_synth::{preset, routing_report, synth, FileType, Preset, SynthOptions};

/// A preset of the real architecture with small dimensions (tests only).
fn tiny(name: &str) -> Preset {
    let mut p = preset(name).unwrap().clone();
    p.n_embd = 256;
    p.n_head_kv = if p.n_head_kv == p.n_head { 4 } else { 2 };
    p.n_head = 4;
    p.head_dim = 64;
    p.n_ff = 128;
    p.expert_ff = 128;
    p.shared_ff = if p.shared_ff > 0 { 256 } else { 0 };
    p.n_expert = p.n_expert.min(16);
    p.n_expert_used = p.n_expert_used.min(4);
    p.n_vocab = 2048;
    p.n_layer = 2;
    p
}

fn write(p: &Preset, ty: FileType, seed: u64, dir: &Path, file: &str) -> PathBuf {
    let path = dir.join(file);
    let mut opts = SynthOptions::new(p.clone(), ty);
    opts.seed = seed;
    let mut last = (0, 0);
    let info = synth(&opts, &path, &mut |done, total| last = (done, total)).unwrap();
    assert_eq!(last.0, last.1, "progress ends at the total");
    assert_eq!(last.1, info.bytes, "progress counts the file's bytes");
    path
}

#[test]
fn every_architecture_loads_and_runs_in_titan() {
    let dir = tempfile::tempdir().unwrap();
    for name in ["olmoe-1b-7b", "qwen3-30b-a3b", "qwen1.5-moe-a2.7b", "mixtral-8x7b"] {
        for ty in [FileType::Q4_0, FileType::Q4_K_M, FileType::Q8_0] {
            let p = tiny(name);
            let path = write(&p, ty, 1, dir.path(), &format!("{name}-{ty}.gguf"));
            let model = Model::load(&path).unwrap_or_else(|e| panic!("{name} {ty}: {e}"));
            assert_eq!(model.config.n_layer, 2);
            assert_eq!(model.config.n_expert, p.n_expert);
            assert_eq!(model.config.n_vocab, p.n_vocab);
            let mut seq = model.new_sequence(8);
            let logits = model.forward(&[1, 300, 301, 1000], 0, &mut seq, Outputs::All).unwrap();
            assert_eq!(logits.len(), 4 * p.n_vocab);
            assert!(logits.iter().all(|l| l.is_finite()), "{name} {ty}: non-finite logits");
            let ids = model.tokenizer.encode("hello there", false, false);
            assert!(!ids.is_empty(), "{name}: the tokenizer encodes text");
        }
    }
}

#[test]
fn metadata_and_shapes_are_llama_cpps() {
    let dir = tempfile::tempdir().unwrap();
    let p = tiny("qwen3-30b-a3b");
    let f = GgufFile::open(write(&p, FileType::Q4_K_M, 3, dir.path(), "q.gguf")).unwrap();
    assert_eq!(f.get_str("general.architecture").unwrap(), Some("qwen3moe"));
    assert_eq!(f.get_u64("general.file_type").unwrap(), Some(15));
    assert_eq!(f.get_u64("qwen3moe.expert_count").unwrap(), Some(16));
    assert_eq!(f.get_u64("qwen3moe.expert_used_count").unwrap(), Some(4));
    assert_eq!(f.get_u64("qwen3moe.expert_feed_forward_length").unwrap(), Some(128));
    assert_eq!(f.get_u64("qwen3moe.attention.key_length").unwrap(), Some(64));
    assert_eq!(f.get_u64("qwen3moe.context_length").unwrap(), Some(40960));
    assert_eq!(f.get_str("tokenizer.ggml.model").unwrap(), Some("gpt2"));
    assert_eq!(f.get_str("tokenizer.ggml.pre").unwrap(), Some("qwen2"));
    let t = |n: &str| f.tensor(n).unwrap_or_else(|| panic!("missing {n}"));
    assert_eq!(t("blk.1.ffn_gate_exps.weight").dims, vec![256, 128, 16]);
    assert_eq!(t("blk.1.ffn_down_exps.weight").dims, vec![128, 256, 16]);
    assert_eq!(t("blk.1.attn_q.weight").dims, vec![256, 256]);
    assert_eq!(t("blk.1.attn_k.weight").dims, vec![256, 128]);
    assert_eq!(t("blk.1.attn_q_norm.weight").dims, vec![64]);
    assert_eq!(t("blk.0.ffn_gate_inp.weight").ty, GgmlType::F32);
    assert_eq!(t("blk.0.attn_norm.weight").ty, GgmlType::F32);
    assert_eq!(t("output.weight").ty, GgmlType::Q6_K);
    assert_eq!(t("token_embd.weight").ty, GgmlType::Q4_K);
    // 128 columns are not whole K-quant blocks, so llama.cpp falls back: Q6_K (the last layer of two
    // gets more bits) to Q8_0, Q4_K to Q5_0.
    assert_eq!(t("blk.1.ffn_down_exps.weight").ty, GgmlType::Q8_0);
    assert_eq!(t("blk.0.ffn_down_exps.weight").ty, GgmlType::Q5_0);
    assert_eq!(t("blk.0.ffn_up_exps.weight").ty, GgmlType::Q4_K);

    let p = tiny("qwen1.5-moe-a2.7b");
    let f = GgufFile::open(write(&p, FileType::Q4_0, 3, dir.path(), "q2.gguf")).unwrap();
    assert_eq!(f.get_u64("qwen2moe.expert_shared_feed_forward_length").unwrap(), Some(256));
    assert_eq!(f.tensor("blk.0.attn_k.bias").unwrap().dims, vec![256]);
    assert_eq!(f.tensor("blk.0.ffn_gate_inp_shexp.weight").unwrap().dims, vec![256]);
    assert_eq!(f.tensor("blk.0.ffn_down_shexp.weight").unwrap().dims, vec![256, 256]);

    let p = tiny("mixtral-8x7b");
    let f = GgufFile::open(write(&p, FileType::Q4_0, 3, dir.path(), "m.gguf")).unwrap();
    assert_eq!(f.get_str("general.architecture").unwrap(), Some("llama"));
    assert_eq!(f.get_str("tokenizer.ggml.model").unwrap(), Some("llama"));
    assert_eq!(f.get_u64("llama.rope.dimension_count").unwrap(), Some(64));
    assert_eq!(f.tensor("blk.0.attn_v.weight").unwrap().ty, GgmlType::Q8_0);
}

#[test]
fn same_seed_same_bytes_other_seed_other_bytes() {
    let dir = tempfile::tempdir().unwrap();
    let p = tiny("olmoe-1b-7b");
    let hash = |file: &str, seed| blake3::hash(&std::fs::read(write(&p, FileType::Q4_K_M, seed, dir.path(), file)).unwrap());
    let a = hash("a.gguf", 11);
    assert_eq!(a, hash("b.gguf", 11));
    assert_ne!(a, hash("c.gguf", 12));
    // No temporary file is left behind.
    let names: Vec<_> = std::fs::read_dir(dir.path()).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert_eq!(names.len(), 3, "{names:?}");
}

/// The point of the calibration: most experts used, consecutive tokens sharing about a third.
#[test]
fn routing_is_realistic() {
    let dir = tempfile::tempdir().unwrap();
    let mut p = tiny("qwen3-30b-a3b");
    p.n_embd = 512;
    p.n_expert = 32;
    p.n_expert_used = 4;
    p.n_layer = 6;
    p.n_vocab = 16384;
    let path = write(&p, FileType::Q4_0, 5, dir.path(), "r.gguf");
    let r = routing_report(&path, 96, 1).unwrap();
    println!("{r}");
    assert_eq!(r.layers.len(), 6);
    assert!(r.min_experts_used() >= 28, "{r}");
    assert!((0.15..=0.5).contains(&r.mean_overlap()), "{r}");
    assert!(r.max_overlap() <= 0.6, "{r}");
}
