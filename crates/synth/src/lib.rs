//! `titan synth`: GGUF files with a real MoE model's exact dimensions, metadata and tensor layout, and
//! random weights calibrated so routing behaves like a trained model's — realistic benchmarks with
//! nothing to download.
//!
//! - [`preset`]: the models imitated (dimensions and metadata as llama.cpp's converter writes them).
//! - `layout`: tensor names, shapes and types (llama-quantize's mix for Q4_K_M and friends).
//! - `calibration`: the scales, and why routing stays realistic with them.
//! - `blocks`: weights drawn directly in their quantised encoding (fast: no f32 model, no quantiser).
//! - `vocab`: a stand-in vocabulary of the real size and special tokens.
//! - [`routing`]: [`routing_report`], TITAN's own measurement of how a file routes.
//!
//! [`synth`] streams the file (header, then one tensor after another, chunks drawn in parallel) to a
//! temporary file beside the target and renames it into place when complete. The bytes are a pure
//! function of (preset, type, layers, calibration, seed): chunks are seeded by position, never by thread.

mod blocks;
pub mod calibration;
mod layout;
pub mod preset;
pub mod routing;
mod vocab;

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use rayon::prelude::*;
use titan_gguf::{GgufWriter, Value, ValueType};

pub use calibration::Calibration;
pub use preset::{preset, presets, Arch, FileType, Glm, Hybrid, Latent, Llama4, Preset, VocabKind, Yarn, V4};
pub use routing::{routing_report, LayerRouting, RoutingReport};

use blocks::Rng;
use layout::{Role, TensorPlan};

#[derive(Debug, thiserror::Error)]
pub enum SynthError {
    #[error("cannot write {path}: {error}")]
    Io { path: String, error: std::io::Error },
    #[error("{0}")]
    Invalid(String),
    #[error(transparent)]
    Engine(#[from] titan_engine::EngineError),
}

#[derive(Clone, Debug)]
pub struct SynthOptions {
    pub preset: Preset,
    pub ty: FileType,
    pub seed: u64,
    /// Fewer layers than the preset (quick tests); `None` keeps the real count.
    pub layers: Option<usize>,
    pub calibration: Calibration,
}

impl SynthOptions {
    pub fn new(preset: Preset, ty: FileType) -> Self {
        SynthOptions {
            preset,
            ty,
            seed: 0,
            layers: None,
            calibration: Calibration::default(),
        }
    }

    /// The preset with the layer override applied.
    pub fn effective_preset(&self) -> Preset {
        let mut p = self.preset.clone();
        if let Some(l) = self.layers {
            p.n_layer = l;
        }
        p
    }
}

/// What [`synth`] wrote.
#[derive(Clone, Debug)]
pub struct SynthInfo {
    pub path: PathBuf,
    pub preset: Preset,
    pub ty: FileType,
    pub seed: u64,
    pub bytes: u64,
    pub tensors: usize,
    pub elapsed: Duration,
}

/// Chunks of about this size are the unit of parallel work and of seeding.
const CHUNK_BYTES: usize = 2 << 20;

/// Write the model described by `opts` to `out`. `progress(done, total)` is called with bytes of
/// tensor data written so far.
pub fn synth(opts: &SynthOptions, out: &Path, progress: &mut dyn FnMut(u64, u64)) -> Result<SynthInfo, SynthError> {
    let t0 = Instant::now();
    let p = opts.effective_preset();
    validate(&p)?;
    let plan = layout::plan(&p, opts.ty);
    // (the token table is integers, written by its own rule)
    if let Some(t) = plan
        .iter()
        .find(|t| t.role != Role::TokenTable && !blocks::supported(t.ty))
    {
        return Err(SynthError::Invalid(format!(
            "tensor {} would need type {}, which synth cannot write",
            t.name, t.ty
        )));
    }

    let mut w = GgufWriter::new();
    for (k, v) in metadata(&p, opts) {
        w.set(&k, v);
    }
    let bad_shape = |e: std::io::Error| SynthError::Invalid(e.to_string());
    for t in &plan {
        w.add_tensor(&t.name, &t.dims, t.ty).map_err(bad_shape)?;
    }
    let align = titan_gguf::DEFAULT_ALIGNMENT;
    let data_bytes: u64 = w.tensor_sizes().map(|(_, s)| s.next_multiple_of(align)).sum();

    let tmp = temp_path(out);
    let io = |error| SynthError::Io {
        path: tmp.display().to_string(),
        error,
    };
    let mut header = Vec::new();
    w.write_header(&mut header).map_err(io)?;
    // Progress counts bytes of the file: header, tensor data and padding.
    let total = header.len() as u64 + data_bytes;
    let file = File::create(&tmp).map_err(io)?;
    // Chunks are drawn (in parallel) while a writer thread streams the previous ones to disk.
    let (send, recv) = std::sync::mpsc::sync_channel::<Vec<u8>>(16);
    let result = std::thread::scope(|scope| {
        let writer = scope.spawn(move || -> std::io::Result<()> {
            let mut f = BufWriter::with_capacity(8 << 20, file);
            for buf in recv {
                f.write_all(&buf)?;
            }
            f.into_inner().map_err(|e| e.into_error())?.sync_all()
        });
        let topics = Topics::new(&p, &opts.calibration, opts.seed);
        let mut done = header.len() as u64;
        progress(done, total);
        let mut sent = send.send(header).is_ok();
        for (index, t) in plan.iter().enumerate() {
            if !sent {
                break;
            }
            let data = TensorData {
                t,
                p: &p,
                cal: &opts.calibration,
                topics: &topics,
                seed: tensor_seed(opts.seed, index),
            };
            write_tensor(&data, &mut |buf| {
                done += buf.len() as u64;
                sent = sent && send.send(buf).is_ok();
                progress(done, total);
            });
        }
        drop(send);
        writer
            .join()
            .unwrap_or_else(|_| Err(std::io::Error::other("the writer thread panicked")))
    });
    if let Err(e) = result {
        let _ = std::fs::remove_file(&tmp);
        return Err(io(e));
    }
    std::fs::rename(&tmp, out).map_err(|error| SynthError::Io {
        path: out.display().to_string(),
        error,
    })?;
    let bytes = std::fs::metadata(out)
        .map_err(|error| SynthError::Io {
            path: out.display().to_string(),
            error,
        })?
        .len();
    Ok(SynthInfo {
        path: out.to_path_buf(),
        preset: p,
        ty: opts.ty,
        seed: opts.seed,
        bytes,
        tensors: plan.len(),
        elapsed: t0.elapsed(),
    })
}

fn validate(p: &Preset) -> Result<(), SynthError> {
    let bad = |what: String| Err(SynthError::Invalid(format!("preset {}: {what}", p.name)));
    if p.n_layer == 0 || p.n_embd == 0 || p.n_head == 0 || p.n_head_kv == 0 || p.n_expert == 0 || p.n_vocab < 512 {
        return bad("every dimension must be positive and the vocabulary at least 512 tokens".into());
    }
    if !p.n_head.is_multiple_of(p.n_head_kv) || p.n_expert_used > p.n_expert || !p.head_dim.is_multiple_of(2) {
        return bad("heads, experts or head size are inconsistent".into());
    }
    // The hidden size need only be whole blocks of 32 (gpt-oss's is 2880): where a K-quant's 256 do not
    // divide a row, the planner falls back as llama-quantize does.
    if !p.n_embd.is_multiple_of(32)
        || !p.q_dim().is_multiple_of(256)
        || !p.expert_ff.is_multiple_of(32)
        || !p.shared_ff.is_multiple_of(32)
        || !p.n_ff.is_multiple_of(32)
    {
        return bad("the hidden and feed-forward sizes must be multiples of 32 and the attention's of 256".into());
    }
    if p.dense_lead >= p.n_layer || p.dense_lead > 0 && p.n_ff == 0 {
        return bad("the dense leading layers need a feed-forward size and must leave a layer with experts".into());
    }
    if let Some(m) = &p.latent {
        let whole = [m.kv_lora, m.nope, m.rope, m.v_dim]
            .iter()
            .all(|d| d.is_multiple_of(32));
        if !whole || p.head_dim != m.nope + m.rope || p.n_head_kv != 1 {
            return bad(
                "latent attention needs sizes of whole 32-blocks, query heads of nope + rope and one KV head".into(),
            );
        }
    }
    if p.arch == Arch::DeepSeek2 && (p.shared_ff == 0 || !p.shared_ff.is_multiple_of(p.expert_ff) || p.latent.is_none())
    {
        return bad(
            "deepseek2 needs latent attention and a whole number of shared experts of the routed experts' size".into(),
        );
    }
    if let Some(r) = p.rope_dims {
        if r == 0 || r > p.head_dim || !r.is_multiple_of(2) {
            return bad("the rotated dimensions must be a positive even number that fits a head".into());
        }
    }
    if p.arch == Arch::MiniMaxM2 && (p.rope_dims.is_none() || p.shared_ff > 0 || p.dense_lead > 0) {
        return bad("minimax-m2 needs its partial RoPE and has no shared expert or dense layer".into());
    }
    if p.arch == Arch::Glm4Moe && (p.glm.is_none() || p.rope_dims.is_none() || !p.shared_ff.is_multiple_of(p.expert_ff))
    {
        return bad(
            "glm4moe needs its partial RoPE and a whole number of shared experts of the routed experts' size".into(),
        );
    }
    if p.arch == Arch::Llama4 && !p.llama4.is_some_and(|l| l.moe_every > 0 && p.shared_ff == p.expert_ff) {
        return bad("llama4 needs its interleaving step and a shared expert of the routed experts' size".into());
    }
    if p.arch == Arch::DeepSeek4 {
        let Some(v) = &p.v4 else {
            return bad("deepseek4 needs its streams, compressed attention and routing (`v4`)".into());
        };
        let group = p.q_dim() / v.out_groups.max(1);
        let whole = [v.q_lora, v.out_rank, v.idx_dim, group]
            .iter()
            .all(|d| d.is_multiple_of(32));
        let rope = p.rope_dims.is_some_and(|r| r <= v.idx_dim);
        if v.ratios.len() < p.n_layer || v.ratios.iter().any(|r| ![0, 4, 128].contains(r)) {
            return bad("deepseek4 needs a compression ratio of 0, 4 or 128 for every layer".into());
        }
        if v.hc != 4 || p.n_head_kv != 1 || !whole || !rope || p.sliding_window == 0 || v.idx_heads == 0 {
            return bad("deepseek4 needs 4 streams, one KV head, sizes of whole 32-blocks, RoPE that fits the indexer's heads and a sliding window".into());
        }
        if p.shared_ff == 0 || !p.shared_ff.is_multiple_of(p.expert_ff) || v.hash_layers > p.n_layer {
            return bad("deepseek4 needs a whole number of shared experts and no more hash layers than layers".into());
        }
    }
    if let Some(h) = &p.hybrid {
        if h.full_attention_interval == 0
            || h.conv_kernel == 0
            || h.n_k_heads == 0
            || !h.n_v_heads.is_multiple_of(h.n_k_heads)
        {
            return bad("the linear attention needs a full-attention interval, convolution taps, and value heads a multiple of the key heads".into());
        }
        if !h.value_dim().is_multiple_of(256) || h.rope_dims > p.head_dim || !h.rope_dims.is_multiple_of(2) {
            return bad(
                "the linear attention's value size must be a multiple of 256 and the rotated dimensions fit a head"
                    .into(),
            );
        }
        if p.shared_ff == 0 {
            return bad(format!("{} needs a shared expert", p.arch.gguf_name()));
        }
    }
    Ok(())
}

fn temp_path(out: &Path) -> PathBuf {
    let mut name = out.file_name().map(|n| n.to_os_string()).unwrap_or_default();
    name.push(format!(".tmp{}", std::process::id()));
    out.with_file_name(name)
}

fn tensor_seed(seed: u64, index: usize) -> u64 {
    blocks::splitmix(blocks::splitmix(seed) ^ (index as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15))
}

/// The GGUF metadata: architecture keys as llama.cpp's converter writes them, the vocabulary, and
/// `titan.synth.*` provenance (ignored by other readers).
fn metadata(p: &Preset, opts: &SynthOptions) -> Vec<(String, Value)> {
    let a = p.arch.gguf_name();
    let mut kv: Vec<(String, Value)> = Vec::new();
    let mut set = |k: String, v: Value| kv.push((k, v));
    let u = |x: usize| Value::U32(x as u32);
    set("general.architecture".into(), Value::String(a.into()));
    set("general.type".into(), Value::String("model".into()));
    set(
        "general.name".into(),
        Value::String(format!("TITAN synth {} (random weights)", p.name)),
    );
    set("general.file_type".into(), Value::U32(opts.ty.llama_ftype()));
    if opts.ty != FileType::F16 {
        set("general.quantization_version".into(), Value::U32(2));
    }
    // GLM counts its MTP layers in block_count.
    let nextn = p.glm.map_or(0, |g| g.nextn_layers);
    set(format!("{a}.block_count"), u(p.n_layer + nextn));
    set(format!("{a}.context_length"), u(p.n_ctx));
    set(format!("{a}.embedding_length"), u(p.n_embd));
    if p.n_ff > 0 {
        set(format!("{a}.feed_forward_length"), u(p.n_ff));
    }
    set(format!("{a}.attention.head_count"), u(p.n_head));
    if let Some(y) = &p.yarn {
        set(format!("{a}.rope.scaling.type"), Value::String("yarn".into()));
        set(format!("{a}.rope.scaling.factor"), Value::F32(y.factor));
        set(format!("{a}.rope.scaling.original_context_length"), u(y.orig_ctx));
        set(format!("{a}.rope.scaling.yarn_beta_fast"), Value::F32(32.0));
        set(format!("{a}.rope.scaling.yarn_beta_slow"), Value::F32(1.0));
        if let Some(m) = y.mscale_all_dim {
            set(format!("{a}.rope.scaling.yarn_log_multiplier"), Value::F32(0.1 * m));
        }
    }
    set(format!("{a}.attention.head_count_kv"), u(p.n_head_kv));
    set(format!("{a}.rope.freq_base"), Value::F32(p.rope_base));
    set(format!("{a}.attention.layer_norm_rms_epsilon"), Value::F32(p.rms_eps));
    set(format!("{a}.expert_count"), u(p.n_expert));
    set(format!("{a}.expert_used_count"), u(p.n_expert_used));
    if p.write_head_dim {
        set(format!("{a}.attention.key_length"), u(p.head_dim));
        set(format!("{a}.attention.value_length"), u(p.head_dim));
    }
    if p.write_expert_ff {
        set(format!("{a}.expert_feed_forward_length"), u(p.expert_ff));
    }
    if p.sliding_window > 0 {
        set(format!("{a}.attention.sliding_window"), u(p.sliding_window));
    }
    if let Some(m) = &p.latent {
        // As the converter writes MLA: one "KV head" of the latent vector and the key's RoPE part.
        set(format!("{a}.attention.key_length"), u(m.kv_lora + m.rope));
        set(format!("{a}.attention.value_length"), u(m.kv_lora));
        set(format!("{a}.attention.kv_lora_rank"), u(m.kv_lora));
        set(format!("{a}.attention.key_length_mla"), u(m.nope + m.rope));
        set(format!("{a}.attention.value_length_mla"), u(m.v_dim));
        set(format!("{a}.rope.dimension_count"), u(m.rope));
        // The converter writes no q_lora_rank for a model without q-LoRA, and llama.cpp then takes a
        // deepseek2 file for such a "lite" model only at 26 or 27 layers; a file of other depth says
        // 0, which llama.cpp and TITAN read the same way.
        if !matches!(p.n_layer, 26 | 27) {
            set(format!("{a}.attention.q_lora_rank"), u(0));
        }
    }
    if p.arch == Arch::DeepSeek2 {
        set(format!("{a}.leading_dense_block_count"), u(p.dense_lead));
        set(format!("{a}.vocab_size"), u(p.n_vocab));
        // DeepSeek counts shared experts of the routed experts' size; scores by softmax (gating 1), in
        // one group (V2-Lite's n_group and topk_group are 1).
        set(format!("{a}.expert_shared_count"), u(p.shared_ff / p.expert_ff));
        set(format!("{a}.expert_group_count"), u(1));
        set(format!("{a}.expert_group_used_count"), u(1));
        set(format!("{a}.expert_gating_func"), u(1));
    } else if let Some(g) = &p.glm {
        // As the converter writes GLM: shared experts counted like DeepSeek's, sigmoid scores (gating
        // 2) in one group, renormalised.
        set(format!("{a}.leading_dense_block_count"), u(p.dense_lead));
        set(format!("{a}.expert_shared_count"), u(p.shared_ff / p.expert_ff));
        set(format!("{a}.expert_group_count"), u(1));
        set(format!("{a}.expert_group_used_count"), u(1));
        set(format!("{a}.expert_gating_func"), u(2));
        set(format!("{a}.expert_weights_norm"), Value::Bool(true));
        set(format!("{a}.nextn_predict_layers"), u(g.nextn_layers));
    } else if let Some(v) = &p.v4 {
        v4_metadata(p, v, &mut set);
    } else if p.arch == Arch::MiniMaxM2 {
        // Its scoring_func, sigmoid (gating 2); no key says renormalise, which llama.cpp always does.
        set(format!("{a}.expert_gating_func"), u(2));
    } else if p.shared_ff > 0 && p.arch != Arch::Llama4 {
        // (Llama 4's shared expert is a routed expert's size, with no key for it.)
        set(format!("{a}.expert_shared_feed_forward_length"), u(p.shared_ff));
    }
    if let Some(r) = p.rope_dims {
        set(format!("{a}.rope.dimension_count"), u(r));
    }
    if let Some(s) = p.expert_weights_scale {
        set(format!("{a}.expert_weights_scale"), Value::F32(s));
    }
    if p.arch == Arch::Llama {
        set(format!("{a}.vocab_size"), u(p.n_vocab));
        set(format!("{a}.rope.dimension_count"), u(p.head_dim));
    }
    if let Some(l) = &p.llama4 {
        // As the converter writes Llama 4 (its llama3 RoPE scaling is the rope_freqs tensor, no key).
        set(format!("{a}.vocab_size"), u(p.n_vocab));
        set(format!("{a}.rope.dimension_count"), u(p.head_dim));
        set(format!("{a}.interleave_moe_layer_step"), u(l.moe_every));
    }
    if let Some(h) = &p.hybrid {
        set(
            format!("{a}.rope.dimension_sections"),
            Value::Array(
                ValueType::I32,
                h.rope_sections.iter().map(|&s| Value::I32(s as i32)).collect(),
            ),
        );
        set(format!("{a}.rope.dimension_count"), u(h.rope_dims));
        set(format!("{a}.ssm.conv_kernel"), u(h.conv_kernel));
        set(format!("{a}.ssm.state_size"), u(h.head_dim));
        set(format!("{a}.ssm.group_count"), u(h.n_k_heads));
        set(format!("{a}.ssm.time_step_rank"), u(h.n_v_heads));
        set(format!("{a}.ssm.inner_size"), u(h.value_dim()));
        let recurrent = (0..p.n_layer).map(|i| Value::Bool(h.is_recurrent(i))).collect();
        set(
            format!("{a}.attention.recurrent_layers"),
            Value::Array(ValueType::Bool, recurrent),
        );
        set(format!("{a}.full_attention_interval"), u(h.full_attention_interval));
    }
    for (k, v) in vocab::metadata(p) {
        set(k, v);
    }
    set("titan.synth.preset".into(), Value::String(p.name.into()));
    set("titan.synth.seed".into(), Value::U64(opts.seed));
    set(
        "titan.synth.calibration".into(),
        Value::String(format!("{:?}", opts.calibration)),
    );
    kv
}

/// DeepSeek-V4's keys, as the converter writes them (docs/deepseek4.md).
fn v4_metadata(p: &Preset, v: &preset::V4, set: &mut dyn FnMut(String, Value)) {
    let a = p.arch.gguf_name();
    let u = |x: usize| Value::U32(x as u32);
    let per_layer = |x: Value| Value::Array(x.value_type(), vec![x; p.n_layer]);
    set(format!("{a}.expert_shared_count"), u(p.shared_ff / p.expert_ff));
    set(format!("{a}.expert_gating_func"), u(4));
    set(format!("{a}.expert_weights_norm"), Value::Bool(true));
    set(format!("{a}.swiglu_clamp_exp"), per_layer(Value::F32(v.clamp)));
    set(format!("{a}.swiglu_clamp_shexp"), per_layer(Value::F32(v.clamp)));
    set(format!("{a}.attention.q_lora_rank"), u(v.q_lora));
    set(format!("{a}.attention.indexer.head_count"), u(v.idx_heads));
    set(format!("{a}.attention.indexer.key_length"), u(v.idx_dim));
    set(format!("{a}.attention.indexer.top_k"), u(v.idx_top_k));
    set(format!("{a}.attention.output_group_count"), u(v.out_groups));
    set(format!("{a}.attention.output_lora_rank"), u(v.out_rank));
    let ratios = (0..p.n_layer).map(|i| Value::I32(v.ratio(i) as i32)).collect();
    set(
        format!("{a}.attention.compress_ratios"),
        Value::Array(ValueType::I32, ratios),
    );
    set(
        format!("{a}.attention.compress_rope_freq_base"),
        Value::F32(v.compress_base),
    );
    set(format!("{a}.hyper_connection.count"), u(v.hc));
    set(format!("{a}.hyper_connection.sinkhorn_iterations"), u(v.sinkhorn_iters));
    set(format!("{a}.hyper_connection.epsilon"), Value::F32(1e-6));
    set(format!("{a}.hash_layer_count"), u(v.hash_layers));
    set(format!("{a}.embedding_length_out"), u(v.hc * p.n_embd));
}

/// Topic centres shared by token_embd and output (see `calibration`).
struct Topics {
    dim: usize,
    size: usize,
    centres: Vec<f32>,
}

impl Topics {
    fn new(p: &Preset, cal: &Calibration, seed: u64) -> Topics {
        let size = cal.topic_size.max(1);
        let n = p.n_vocab.div_ceil(size);
        let mut rng = Rng::new(seed ^ 0x7091_c5ee_d0f1_0a1c);
        let centres = (0..n * p.n_embd).map(|_| rng.normal()).collect();
        Topics {
            dim: p.n_embd,
            size,
            centres,
        }
    }

    fn centre(&self, token: usize) -> &[f32] {
        let k = token / self.size;
        &self.centres[k * self.dim..(k + 1) * self.dim]
    }
}

struct TensorData<'a> {
    t: &'a TensorPlan,
    p: &'a Preset,
    cal: &'a Calibration,
    topics: &'a Topics,
    seed: u64,
}

impl TensorData<'_> {
    /// Fill rows `first..first + out.len() / row_bytes` of the tensor.
    fn chunk(&self, chunk: usize, first_row: usize, out: &mut [u8]) {
        let t = self.t;
        let s = self.cal.scale(self.p, t.role);
        let mut rng = Rng::new(self.seed ^ blocks::splitmix(chunk as u64));
        match t.role {
            Role::TokenEmbd | Role::Output => {
                // row = sigma · (sqrt(share) · topic centre + sqrt(1 - share) · own noise)
                let share = if t.role == Role::TokenEmbd {
                    self.cal.topic_share
                } else {
                    self.cal.head_topic
                };
                let (a, b) = (share.sqrt(), (1.0 - share).sqrt());
                let cols = t.cols();
                let row_bytes = t.ty.row_bytes(cols).expect("planned");
                let mut x = vec![0f32; cols];
                for (i, row) in out.chunks_exact_mut(row_bytes).enumerate() {
                    let c = self.topics.centre(first_row + i);
                    for (v, &cv) in x.iter_mut().zip(c) {
                        *v = s.sigma * (a * cv + b * rng.normal());
                    }
                    blocks::encode(t.ty, s.sigma, &x, row);
                }
            }
            // k distinct experts per token, each drawn uniformly
            Role::TokenTable => {
                let (k, n) = (t.cols(), self.p.n_expert);
                for row in out.chunks_exact_mut(4 * k) {
                    let mut ids: Vec<u32> = Vec::with_capacity(k);
                    while ids.len() < k {
                        let e = (rng.next_u64() % n as u64) as u32;
                        if !ids.contains(&e) {
                            ids.push(e);
                        }
                    }
                    for (b, e) in row.chunks_exact_mut(4).zip(ids) {
                        b.copy_from_slice(&(e as i32).to_le_bytes());
                    }
                }
            }
            _ if t.dims.len() == 1 => {
                let draw = |rng: &mut Rng| s.mean + s.sigma * rng.normal();
                let x: Vec<f32> = match t.role {
                    // ssm_a holds -exp(A_log), as the converter writes it.
                    Role::SsmA => (0..t.cols()).map(|_| -draw(&mut rng).exp()).collect(),
                    Role::RopeFreqs => self
                        .p
                        .llama4
                        .map(|l| l.rope_freqs(self.p.head_dim, self.p.rope_base))
                        .unwrap_or_default(),
                    _ => (0..t.cols()).map(|_| draw(&mut rng)).collect(),
                };
                blocks::encode(t.ty, s.sigma, &x, out);
            }
            _ => blocks::fill(t.ty, s.sigma, &mut rng, out),
        }
    }
}

/// Draw one tensor in chunks (in parallel, a batch at a time) and hand them, in order and followed by
/// the alignment padding, to `emit`.
fn write_tensor(d: &TensorData, emit: &mut dyn FnMut(Vec<u8>)) {
    let t = d.t;
    let row_bytes = t.ty.row_bytes(t.cols()).expect("planned");
    let rows = t.rows();
    let rows_per_chunk = (CHUNK_BYTES / row_bytes).max(1);
    let n_chunks = rows.div_ceil(rows_per_chunk);
    let batch = 2 * rayon::current_num_threads().max(1);
    for first in (0..n_chunks).step_by(batch) {
        let chunks: Vec<Vec<u8>> = (first..(first + batch).min(n_chunks))
            .into_par_iter()
            .map(|c| {
                let r0 = c * rows_per_chunk;
                let mut buf = vec![0u8; rows_per_chunk.min(rows - r0) * row_bytes];
                d.chunk(c, r0, &mut buf);
                buf
            })
            .collect();
        chunks.into_iter().for_each(&mut *emit);
    }
    let size = rows * row_bytes;
    let pad = size.next_multiple_of(titan_gguf::DEFAULT_ALIGNMENT as usize) - size;
    if pad > 0 {
        emit(vec![0u8; pad]);
    }
}
