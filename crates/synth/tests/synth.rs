//! Small synthetic models written to a temporary directory: they open with TITAN's GGUF reader and
//! engine, carry the expected metadata and shapes, are reproducible byte for byte, and route like a
//! trained model.

use std::path::{Path, PathBuf};

use titan_engine::config::Mixer;
use titan_engine::{Model, Outputs};
use titan_gguf::GgufFile;
use titan_kernels::GgmlType;
use titan_synth::{preset, routing_report, synth, FileType, Hybrid, Latent, Preset, SynthOptions, V4};

/// A preset of the real architecture with small dimensions (tests only). A hybrid keeps its layer
/// pattern: 4 layers, the last full attention. Latent attention keeps one KV head and its proportions
/// (query heads of nope + rope); the shared experts stay two routed experts' size.
fn tiny(name: &str) -> Preset {
    let mut p = preset(name).unwrap().clone();
    p.n_embd = 256;
    p.n_head_kv = if p.n_head_kv == p.n_head { 4 } else { 2 };
    p.n_head = 4;
    p.head_dim = 64;
    p.n_ff = if p.n_ff > 0 { 128 } else { 0 };
    p.expert_ff = 128;
    p.shared_ff = if p.shared_ff > 0 { 256 } else { 0 };
    p.n_expert = p.n_expert.min(16);
    p.n_expert_used = p.n_expert_used.min(4);
    p.n_vocab = 2048;
    p.n_layer = 2;
    if let Some(m) = &mut p.latent {
        *m = Latent {
            kv_lora: 128,
            nope: 32,
            rope: 32,
            v_dim: 32,
        };
        p.n_head_kv = 1;
    }
    if let Some(h) = &mut p.hybrid {
        // rope sections cover the rotated half-dimension, as [11, 11, 10] covers 32 of 64
        *h = Hybrid {
            n_k_heads: 2,
            n_v_heads: 4,
            head_dim: 64,
            rope_dims: 16,
            rope_sections: [3, 3, 2, 0],
            ..*h
        };
        p.n_layer = h.full_attention_interval;
    }
    if let Some(r) = &mut p.rope_dims {
        // GLM's partial_rotary_factor 0.5, MiniMax-M2's rotary_dim 64 of 128
        *r = p.head_dim / 2;
    }
    if p.llama4.is_some() {
        // Llama 4's shared expert is a routed expert's size
        p.shared_ff = p.expert_ff;
    }
    if let Some(v) = &mut p.v4 {
        // one KV head; every ratio in the first 4 layers (the routing test takes 6)
        *v = V4 {
            ratios: &[128, 0, 4, 128, 4, 0],
            q_lora: 64,
            out_groups: 2,
            out_rank: 64,
            idx_heads: 4,
            idx_dim: 64,
            idx_top_k: 4,
            hash_layers: 1,
            ..*v
        };
        p.n_head_kv = 1;
        p.n_layer = 4;
        p.sliding_window = 8;
    }
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
    let names = [
        "olmoe-1b-7b",
        "qwen3-30b-a3b",
        "qwen1.5-moe-a2.7b",
        "mixtral-8x7b",
        "qwen3.6-35b-a3b",
        "qwen3.5-122b-a10b",
        "gpt-oss-20b",
        "deepseek-v2-lite",
        "glm-4.5-air",
        "minimax-m2",
        "llama-4-scout",
        "deepseek-v4-flash",
    ];
    for name in names {
        for ty in [
            FileType::Q4_0,
            FileType::Q4_K_M,
            FileType::Q8_0,
            FileType::F16,
            FileType::Mxfp4,
            FileType::Mxfp4_Moe,
        ] {
            let p = tiny(name);
            let path = write(&p, ty, 1, dir.path(), &format!("{name}-{ty}.gguf"));
            let model = Model::load(&path).unwrap_or_else(|e| panic!("{name} {ty}: {e}"));
            assert_eq!(model.config.n_layer, p.n_layer);
            if let Some(h) = &p.hybrid {
                let linear: Vec<bool> = model.config.mixers.iter().map(|&m| m == Mixer::DeltaNet).collect();
                assert_eq!(
                    linear,
                    (0..p.n_layer).map(|i| h.is_recurrent(i)).collect::<Vec<_>>(),
                    "{name}: the layer pattern"
                );
                assert_eq!(model.config.rope_dims, h.rope_dims);
            }
            assert_eq!(model.config.n_expert, p.n_expert);
            assert_eq!(model.config.n_vocab, p.n_vocab);
            assert_eq!(model.config.dense_lead, p.dense_lead);
            assert_eq!(
                model.config.mla.map(|m| (m.q_lora, m.kv_lora, m.nope, m.rope, m.v_dim)),
                p.latent.map(|m| (0, m.kv_lora, m.nope, m.rope, m.v_dim)),
                "{name}"
            );
            // (DeepSeek-V4's YaRN is its compressed layers' alone)
            let yarn = model.config.v4.as_ref().map_or(model.config.yarn, |v| v.compress_yarn);
            assert_eq!(
                yarn.map(|y| (y.factor, y.orig_ctx)),
                p.yarn.map(|y| (y.factor, y.orig_ctx)),
                "{name}"
            );
            if let Some(v) = &p.v4 {
                let c = model.config.v4.as_ref().expect("DeepSeek-V4's shape");
                let ratios: Vec<usize> = (0..p.n_layer).map(|i| v.ratio(i)).collect();
                assert_eq!(
                    (&c.ratios, c.hash_layers, c.hc),
                    (&ratios, v.hash_layers, v.hc),
                    "{name}"
                );
                assert!(ratios.contains(&4) && ratios.contains(&128), "{name}: {ratios:?}");
                assert_eq!(
                    model.config.scores,
                    titan_engine::config::Scores::SqrtSoftplus,
                    "{name}"
                );
            }
            assert_eq!(model.config.sliding_window, p.sliding_window, "{name}");
            if let Some(r) = p.rope_dims {
                assert_eq!(model.config.rope_dims, r, "{name}");
            }
            if let Some(g) = &p.glm {
                // the MTP layers are in the file and counted, and not run
                assert_eq!(model.config.n_nextn, g.nextn_layers);
            }
            if p.glm.is_some() || p.arch == titan_synth::Arch::MiniMaxM2 {
                assert!(
                    model.config.scores == titan_engine::config::Scores::Sigmoid && model.config.norm_topk,
                    "{name}"
                );
            }
            if let Some(l) = &p.llama4 {
                // every fourth layer without RoPE, the others chunked; the file's rope_freqs loaded
                assert_eq!(model.config.moe_every, l.moe_every, "{name}");
                assert_eq!(model.config.nope, [false, false, false, true][..p.n_layer], "{name}");
                let freqs = model.weights.rope_freqs.as_deref().expect("rope_freqs");
                assert_eq!(freqs, &l.rope_freqs(p.head_dim, p.rope_base)[..], "{name}");
                assert!(freqs.contains(&1.0) && freqs.contains(&16.0), "{name}: {freqs:?}");
            }
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
    assert_eq!(
        f.get_u64("qwen2moe.expert_shared_feed_forward_length").unwrap(),
        Some(256)
    );
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
    let hash =
        |file: &str, seed| blake3::hash(&std::fs::read(write(&p, FileType::Q4_K_M, seed, dir.path(), file)).unwrap());
    let a = hash("a.gguf", 11);
    assert_eq!(a, hash("b.gguf", 11));
    assert_ne!(a, hash("c.gguf", 12));
    // No temporary file is left behind.
    let names: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
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

/// The hybrid's file as llama.cpp's `qwen35moe` loader reads it (`src/models/qwen35moe.cpp`) and its
/// converter and quantiser write it (the `qwen35moe` fixtures made by them have the same keys, names,
/// shapes and per-role types).
#[test]
fn hybrid_metadata_and_shapes_are_llama_cpps() {
    let dir = tempfile::tempdir().unwrap();
    let p = tiny("qwen3.6-35b-a3b");
    let f = GgufFile::open(write(&p, FileType::Q4_0, 3, dir.path(), "h.gguf")).unwrap();
    let u = |k: &str| {
        f.get_u64(&format!("qwen35moe.{k}"))
            .unwrap()
            .unwrap_or_else(|| panic!("missing {k}"))
    };
    assert_eq!(f.get_str("general.architecture").unwrap(), Some("qwen35moe"));
    assert_eq!(f.get_str("tokenizer.ggml.pre").unwrap(), Some("qwen35"));
    assert_eq!(u("block_count"), 4);
    assert_eq!(u("context_length"), 262144);
    assert_eq!(
        f.get_u64("qwen35moe.feed_forward_length").unwrap(),
        None,
        "the config has no intermediate_size"
    );
    assert_eq!(
        (
            u("attention.head_count"),
            u("attention.head_count_kv"),
            u("attention.key_length"),
            u("attention.value_length")
        ),
        (4, 2, 64, 64)
    );
    assert_eq!(
        (u("expert_feed_forward_length"), u("expert_shared_feed_forward_length")),
        (128, 256)
    );
    assert_eq!(
        (
            u("ssm.conv_kernel"),
            u("ssm.state_size"),
            u("ssm.group_count"),
            u("ssm.time_step_rank"),
            u("ssm.inner_size")
        ),
        (4, 64, 2, 4, 256)
    );
    assert_eq!((u("full_attention_interval"), u("rope.dimension_count")), (4, 16));
    assert_eq!(f.get_f64("qwen35moe.rope.freq_base").unwrap(), Some(1e7));
    let sections: Vec<i64> = f
        .get_array("qwen35moe.rope.dimension_sections")
        .unwrap()
        .unwrap()
        .iter()
        .map(|v| v.as_i64().unwrap())
        .collect();
    assert_eq!(sections, [3, 3, 2, 0]);
    let recurrent: Vec<bool> = f
        .get_array("qwen35moe.attention.recurrent_layers")
        .unwrap()
        .unwrap()
        .iter()
        .map(|v| v.as_bool().unwrap())
        .collect();
    assert_eq!(recurrent, [true, true, true, false]);

    let t = |n: &str| f.tensor(n).unwrap_or_else(|| panic!("missing {n}"));
    let shape = |n: &str| (t(n).dims.clone(), t(n).ty);
    // a linear-attention layer: conv channels = 2 · 2 key heads · 64 + 4 value heads · 64 = 512
    assert_eq!(shape("blk.0.attn_qkv.weight"), (vec![256, 512], GgmlType::Q4_0));
    assert_eq!(shape("blk.0.attn_gate.weight"), (vec![256, 256], GgmlType::Q4_0));
    assert_eq!(shape("blk.0.ssm_conv1d.weight"), (vec![4, 512], GgmlType::F32));
    assert_eq!(shape("blk.0.ssm_dt.bias"), (vec![4], GgmlType::F32));
    assert_eq!(shape("blk.0.ssm_a"), (vec![4], GgmlType::F32));
    assert_eq!(shape("blk.0.ssm_beta.weight"), (vec![256, 4], GgmlType::Q4_0));
    assert_eq!(shape("blk.0.ssm_alpha.weight"), (vec![256, 4], GgmlType::Q4_0));
    assert_eq!(shape("blk.0.ssm_norm.weight"), (vec![64], GgmlType::F32));
    assert_eq!(shape("blk.0.ssm_out.weight"), (vec![256, 256], GgmlType::Q4_0));
    assert!(f.tensor("blk.0.attn_q.weight").is_none() && f.tensor("blk.3.attn_qkv.weight").is_none());
    // the full-attention layer: queries and their gates, q/k norms per head
    assert_eq!(shape("blk.3.attn_q.weight"), (vec![256, 512], GgmlType::Q4_0));
    assert_eq!(shape("blk.3.attn_k.weight"), (vec![256, 128], GgmlType::Q4_0));
    assert_eq!(shape("blk.3.attn_output.weight"), (vec![256, 256], GgmlType::Q4_0));
    assert_eq!(shape("blk.3.attn_q_norm.weight"), (vec![64], GgmlType::F32));
    for l in 0..4 {
        let n = |s: &str| format!("blk.{l}.{s}");
        assert_eq!(shape(&n("post_attention_norm.weight")), (vec![256], GgmlType::F32));
        assert_eq!(shape(&n("ffn_gate_inp.weight")), (vec![256, 16], GgmlType::F32));
        assert_eq!(shape(&n("ffn_gate_inp_shexp.weight")), (vec![256], GgmlType::F32));
        assert_eq!(shape(&n("ffn_down_shexp.weight")), (vec![256, 256], GgmlType::Q4_0));
        assert_eq!(shape(&n("ffn_up_exps.weight")), (vec![256, 128, 16], GgmlType::Q4_0));
        assert!(f.tensor(&n("ffn_norm.weight")).is_none());
    }

    // the converter's f16 file: the shared expert's gate a one-row F32 matrix, the convolution F32
    let f = GgufFile::open(write(&p, FileType::F16, 3, dir.path(), "h16.gguf")).unwrap();
    let gate = f.tensor("blk.0.ffn_gate_inp_shexp.weight").unwrap();
    assert_eq!((gate.dims.clone(), gate.ty), (vec![256, 1], GgmlType::F32));
    assert_eq!(f.tensor("blk.0.ssm_conv1d.weight").unwrap().ty, GgmlType::F32);
    assert_eq!(f.tensor("blk.0.ssm_alpha.weight").unwrap().ty, GgmlType::F16);
}

/// The linear-attention state neither forgets everything at once nor keeps everything: the first
/// layer's per-token decay exp(softplus(alpha + dt_bias) · a), computed from the file on the tokens'
/// embeddings (that layer's input), spreads over (0, 1).
#[test]
fn hybrid_decay_spreads_over_zero_to_one() {
    let dir = tempfile::tempdir().unwrap();
    let mut p = tiny("qwen3.6-35b-a3b");
    p.n_embd = 1024;
    let h = p.hybrid.as_mut().unwrap();
    h.n_k_heads = 4;
    h.n_v_heads = 32;
    let f = GgufFile::open(write(&p, FileType::Q8_0, 7, dir.path(), "d.gguf")).unwrap();
    let read = |name: &str| {
        let t = f.tensor(name).unwrap_or_else(|| panic!("missing {name}"));
        let mut x = vec![0f32; t.dims.iter().product::<u64>() as usize];
        titan_kernels::dequantize_row(t.ty, f.tensor_data(t), &mut x).unwrap();
        x
    };
    let (e, nv) = (p.n_embd, 32);
    let (embd, norm) = (read("token_embd.weight"), read("blk.0.attn_norm.weight"));
    let (alpha, dt, a) = (
        read("blk.0.ssm_alpha.weight"),
        read("blk.0.ssm_dt.bias"),
        read("blk.0.ssm_a"),
    );
    assert!(a.iter().all(|&x| x < 0.0), "ssm_a holds -exp(A_log): {a:?}");
    let mut decay = Vec::new();
    for token in (0..p.n_vocab).step_by(37) {
        let x = &embd[token * e..(token + 1) * e];
        let rms = (x.iter().map(|v| v * v).sum::<f32>() / e as f32 + p.rms_eps).sqrt();
        let xn: Vec<f32> = x.iter().zip(&norm).map(|(v, w)| v / rms * w).collect();
        for hd in 0..nv {
            let al: f32 = alpha[hd * e..(hd + 1) * e].iter().zip(&xn).map(|(w, v)| w * v).sum();
            let softplus = (1.0 + (al + dt[hd]).exp()).ln();
            decay.push((softplus * a[hd]).exp());
        }
    }
    decay.sort_by(f32::total_cmp);
    let q = |f: f64| decay[((decay.len() - 1) as f64 * f) as usize];
    println!("decay: 10% {:.3}, median {:.3}, 90% {:.3}", q(0.1), q(0.5), q(0.9));
    assert!(decay.iter().all(|&d| d > 0.0 && d < 1.0));
    assert!((0.5..0.95).contains(&q(0.5)), "median {}", q(0.5));
    assert!(q(0.1) < 0.6 && q(0.9) > 0.95, "10% {} 90% {}", q(0.1), q(0.9));
}

/// Routing through the hybrid (three Gated DeltaNet layers per full-attention layer) is as realistic as
/// through attention alone: most experts used, consecutive tokens sharing some.
#[test]
fn hybrid_routing_is_realistic() {
    let dir = tempfile::tempdir().unwrap();
    let mut p = tiny("qwen3.6-35b-a3b");
    p.n_embd = 512;
    p.n_expert = 32;
    p.n_expert_used = 4;
    p.n_layer = 8;
    p.n_vocab = 16384;
    let path = write(&p, FileType::Q4_0, 5, dir.path(), "r.gguf");
    let r = routing_report(&path, 96, 1).unwrap();
    println!("{r}");
    assert_eq!(r.layers.len(), 8);
    assert!(r.min_experts_used() >= 28, "{r}");
    assert!((0.15..=0.5).contains(&r.mean_overlap()), "{r}");
    assert!(r.max_overlap() <= 0.6, "{r}");
}

/// gpt-oss (biases, sinks, a softmax over the chosen experts, the clamped SwiGLU, YaRN), DeepSeek-V2
/// (latent attention, a dense first layer, ungated shared experts, unnormalised weights), GLM-4.5
/// (sigmoid scores with a choosing bias, a dense first layer), MiniMax-M2 (sigmoid scores with a
/// choosing bias, q/k norms over all heads, no shared expert) and Llama 4 (top-1 by the logits, the sigmoid
/// weight on the expert's input) route as realistically as the others.
#[test]
fn the_newer_families_route_realistically() {
    let dir = tempfile::tempdir().unwrap();
    for name in [
        "gpt-oss-20b",
        "deepseek-v2-lite",
        "glm-4.5-air",
        "minimax-m2",
        "llama-4-scout",
        "deepseek-v4-flash",
    ] {
        let mut p = tiny(name);
        p.n_embd = 512;
        p.n_expert = 32;
        // Llama 4 routes each token to one expert
        p.n_expert_used = if p.llama4.is_some() { 1 } else { 4 };
        p.n_layer = 6;
        p.n_vocab = 16384;
        let path = write(&p, FileType::Q4_0, 5, dir.path(), &format!("{name}.gguf"));
        let r = routing_report(&path, 96, 1).unwrap();
        println!("{name}: {r}");
        assert_eq!(
            r.layers.len(),
            6 - p.dense_lead,
            "{name}: the dense layer routes nothing"
        );
        // Top-1 over 96 tokens reaches 30.5 of 32 experts when uniformly random (top-4: 32), and two
        // random consecutive tokens share their expert 1 time in 32 (top-4: 0.12 of their experts).
        let (min_used, overlap) = if p.n_expert_used == 1 {
            (23, 0.1..=0.5)
        } else {
            (28, 0.15..=0.5)
        };
        assert!(r.min_experts_used() >= min_used, "{name}: {r}");
        assert!(overlap.contains(&r.mean_overlap()), "{name}: {r}");
        assert!(r.max_overlap() <= 0.6, "{name}: {r}");
    }
}

/// The keys and tensors llama.cpp's converter and quantiser write for gpt-oss, DeepSeek-V2-Lite, GLM-4.5
/// (its MTP layer included) and MiniMax-M2, read
/// from the small real files in `tests/fixtures` (made by them from Hugging Face models): a synthetic file
/// of the same depth has the same architecture keys, the same tensor names, and the same type for every
/// tensor but the output (the fixtures' 64 columns are not whole Q6_K blocks; ours are).
#[test]
fn gpt_oss_deepseek_glm_and_minimax_match_the_converters_files() {
    let dir = tempfile::tempdir().unwrap();
    let fixtures = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures");
    for (name, fixture, ty, layers) in [
        ("gpt-oss-20b", "gpt-oss/mxfp4_moe.gguf", FileType::Mxfp4_Moe, 4),
        ("deepseek-v2-lite", "deepseek2-lite/q4_0.gguf", FileType::Q4_0, 26),
        ("glm-4.5-air", "glm4moe/q4_0.gguf", FileType::Q4_0, 3),
        ("minimax-m2", "minimax-m2/q4_0.gguf", FileType::Q4_0, 2),
        ("llama-4-scout", "llama4/q4_0.gguf", FileType::Q4_0, 4),
    ] {
        let real = GgufFile::open(fixtures.join(fixture)).unwrap();
        let mut p = tiny(name);
        p.n_layer = layers;
        if let Some(g) = &mut p.glm {
            // the fixture has GLM-4.5's q/k norms, which Air has not
            g.qk_norm = true;
        }
        if p.glm.is_some() || p.arch == titan_synth::Arch::MiniMaxM2 {
            // the fixtures have 8 experts (llama-quantize keeps attn_k and attn_v in Q8_0 for 8-expert models)
            p.n_expert = 8;
        }
        if let Some(l) = &mut p.llama4 {
            // the fixture has Maverick's alternation (dense layers 0 and 2) and 8 experts
            l.moe_every = 2;
            p.n_expert = 8;
        }
        let ours = GgufFile::open(write(&p, ty, 2, dir.path(), &format!("{name}.gguf"))).unwrap();
        let arch = p.arch.gguf_name();
        let keys = |f: &GgufFile| {
            let mut k: Vec<String> = f
                .metadata
                .iter()
                .map(|(k, _)| k.clone())
                .filter(|k| k.starts_with(&format!("{arch}.")))
                .collect();
            k.sort();
            k
        };
        assert_eq!(keys(&ours), keys(&real), "{name}: architecture keys");
        assert_eq!(
            ours.get_u64("general.file_type").unwrap(),
            real.get_u64("general.file_type").unwrap(),
            "{name}"
        );
        let tensors = |f: &GgufFile| {
            let mut t: Vec<(String, usize, GgmlType)> = f
                .tensors
                .iter()
                .map(|t| (t.name.clone(), t.dims.len(), t.ty))
                .filter(|t| t.0 != "output.weight")
                .collect();
            t.sort_by(|a, b| a.0.cmp(&b.0));
            t
        };
        assert_eq!(tensors(&ours), tensors(&real), "{name}: tensor names, ranks and types");
    }
}

/// The keys and tensors llama.cpp's converter writes for DeepSeek-V4, read from the `deepseek4` fixture (3 layers
/// of ratios 0, 4 and 128, the first hash-routed, 8 experts top-2): a synthetic file of that shape has the same
/// architecture keys and the same tensor names and ranks. (The types differ: the fixture's source is f32, so
/// its converter kept every tensor but the experts in F32, where a real checkpoint's are written F16 or
/// quantised.)
#[test]
fn deepseek4_matches_the_converters_file() {
    let dir = tempfile::tempdir().unwrap();
    let fixture = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/deepseek4/mxfp4_moe.gguf");
    let real = GgufFile::open(fixture).unwrap();
    let mut p = tiny("deepseek-v4-flash");
    p.n_layer = 3;
    p.n_expert = 8;
    p.n_expert_used = 2;
    if let Some(v) = &mut p.v4 {
        v.ratios = &[0, 4, 128];
    }
    let ours = GgufFile::open(write(&p, FileType::Mxfp4_Moe, 2, dir.path(), "deepseek4.gguf")).unwrap();
    let keys = |f: &GgufFile| {
        let mut k: Vec<String> = f
            .metadata
            .iter()
            .map(|(k, _)| k.clone())
            .filter(|k| k.starts_with("deepseek4."))
            .collect();
        k.sort();
        k
    };
    assert_eq!(keys(&ours), keys(&real), "architecture keys");
    let tensors = |f: &GgufFile| {
        let mut t: Vec<(String, usize)> = f.tensors.iter().map(|t| (t.name.clone(), t.dims.len())).collect();
        t.sort();
        t
    };
    assert_eq!(tensors(&ours), tensors(&real), "tensor names and ranks");
    let ty = |f: &GgufFile, name: &str| f.tensor(name).map(|t| t.ty);
    for name in ["blk.0.ffn_gate_tid2eid.weight", "blk.2.ffn_down_exps.weight"] {
        assert_eq!(ty(&ours, name), ty(&real, name), "{name}");
    }
}
