//! Model hyper-parameters from GGUF metadata (keys as llama.cpp's converter writes them).

use titan_gguf::GgufFile;

use crate::{EngineError, Result};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Arch {
    Qwen3Moe,
    Qwen2Moe,
    Olmoe,
    /// GGUF arch `llama` with experts: Mixtral.
    Mixtral,
    /// Qwen3-Next: Gated DeltaNet layers between gated full-attention layers, routed plus shared experts.
    Qwen3Next,
    /// Qwen3.5 / 3.6 MoE: Qwen3-Next's layers, with the linear-attention heads in the converter's order.
    Qwen35Moe,
    /// The dense Qwen3.5: the same layers with one feed-forward each instead of experts.
    Qwen35,
    /// DeepSeek-V2 / V3 (and models built on them): multi-head latent attention, dense first layers,
    /// shared experts, softmax or sigmoid scores with group-limited choice.
    DeepSeek2,
    /// gpt-oss: attention sinks, a sliding window on every other layer, biases everywhere, a softmax over
    /// the chosen experts' logits, and a clamped SwiGLU.
    GptOss,
    /// GLM-4.5 / 4.6 / 4.7: partial RoPE, q/k/v biases, optional per-head q/k norms, dense first layers,
    /// sigmoid scores with the choosing bias, an ungated shared expert, and MTP (`nextn`) layers after the
    /// main ones that the forward pass skips.
    Glm4Moe,
    /// MiniMax-M2: partial RoPE, q/k RMS norms over all heads together, sigmoid scores with the choosing
    /// bias, top-k renormalisation, no shared expert.
    MiniMaxM2,
    /// Llama 4 (Scout, Maverick): MoE layers every `interleave_moe_layer_step`-th, top-k by the router's
    /// logits whose sigmoid scales each chosen expert's input, a shared expert, chunked attention on three
    /// layers of four and no RoPE on the fourth (with the attention temperature tuning instead), weightless
    /// q/k RMS norms after RoPE, and RoPE frequencies divided by the file's `rope_freqs`.
    Llama4,
    /// DeepSeek-V4: hyper-connection streams as the residual, q-LoRA attention with one head that is key and
    /// value, a sliding window plus compressed entries (with the lightning indexer at ratio 4), sinks, a
    /// grouped output projection, sqrt-softplus routing (by a token table in the first layers) and a clamped
    /// SwiGLU (docs/deepseek4.md).
    DeepSeek4,
}

/// llama.cpp's constants for Llama 4 (`llama_model_llama4::load_arch_hparams`; the files carry no key for
/// them): the attention chunk, the layer pattern (three chunked layers, then one full one without RoPE),
/// and the NoPE layers' attention temperature `1 + scale · ln(1 + ⌊(pos + offset) / floor⌋)`.
pub const LLAMA4_CHUNK: usize = 8192;
const LLAMA4_PATTERN: usize = 4;
const LLAMA4_TEMP_FLOOR: f64 = 8192.0;
const LLAMA4_TEMP_SCALE: f32 = 0.1;
const LLAMA4_TEMP_OFFSET: f32 = 1.0;

/// Llama 4's attention temperature at position `pos` of a layer without RoPE: the query is multiplied by
/// it (exactly 1 before position 8191). Rounded as llama.cpp's `llm_graph_input_attn_temp` rounds it: the
/// position and its offset in f32, the logarithm in f64.
pub fn llama4_attn_temp(pos: usize) -> f32 {
    let floor = libm::floor(((pos as f32 + LLAMA4_TEMP_OFFSET) / LLAMA4_TEMP_FLOOR as f32) as f64);
    (libm::log(floor + 1.0) * LLAMA4_TEMP_SCALE as f64 + 1.0) as f32
}

/// The experts' activation between their gate/up and down projections.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Activation {
    /// silu(gate) · up.
    Silu,
    /// gpt-oss: g · sigmoid(alpha · g) · (u + 1), with g = min(gate, limit) and u = up clamped to ±limit.
    ClampedSwiglu { alpha: f32, limit: f32 },
    /// DeepSeek-V4: silu(min(gate, limit)) · up clamped to ±limit.
    ClampedSilu { limit: f32 },
}

/// How router logits become expert scores.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scores {
    /// A softmax over all experts.
    Softmax,
    /// A sigmoid of each (DeepSeek-V3).
    Sigmoid,
    /// sqrt(softplus(logit)) of each (DeepSeek-V4).
    SqrtSoftplus,
}

/// DeepSeek-V4's own dimensions (docs/deepseek4.md), from the file's keys.
#[derive(Clone, Debug, PartialEq)]
pub struct V4Shape {
    /// `attention.q_lora_rank`.
    pub q_lora: usize,
    /// Hyper-connection streams (`hyper_connection.count`), Sinkhorn iterations and epsilon.
    pub hc: usize,
    pub sinkhorn_iters: usize,
    pub hc_eps: f32,
    /// Raw positions every layer's query sees (`attention.sliding_window`).
    pub window: usize,
    /// Per layer: 0 (the window alone), 4 (compressed entries chosen by the indexer) or 128.
    pub ratios: Vec<usize>,
    /// The compressed layers' RoPE: their own base, with YaRN (magnitude scale 1) where the file has it.
    pub compress_base: f32,
    pub compress_yarn: Option<Yarn>,
    /// The output projection's groups and rank (`attention.output_group_count`, `output_lora_rank`).
    pub out_groups: usize,
    pub out_rank: usize,
    /// The lightning indexer's heads, head size and how many entries it keeps.
    pub idx_heads: usize,
    pub idx_dim: usize,
    pub idx_top_k: usize,
    /// The first layers choose their experts by the token (`hash_layer_count`).
    pub hash_layers: usize,
}

/// The compression ratios llama.cpp knows: the window alone, the indexed one (CSA) and the heavy one (HCA).
pub const V4_RATIOS: [usize; 3] = [0, 4, 128];

/// Multi-head latent attention's dimensions (DeepSeek-V2/V3): keys and values are decompressed per head
/// from one shared latent vector per position, which is all the cache holds (with the RoPE part of the
/// key).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MlaShape {
    /// Rank of the query's compression (`attention.q_lora_rank`), 0 when the query is projected directly.
    pub q_lora: usize,
    /// Size of the latent vector (`attention.kv_lora_rank`).
    pub kv_lora: usize,
    /// Per head: the query/key part without RoPE, the part with RoPE (shared by all heads on the key side),
    /// and the value size.
    pub nope: usize,
    pub rope: usize,
    pub v_dim: usize,
}

/// What mixes a layer's tokens: softmax attention over a KV cache, or a Gated DeltaNet (linear
/// attention) over a recurrent state.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mixer {
    Attention,
    DeltaNet,
}

/// The Gated DeltaNet dimensions (GGUF `ssm.*` keys, as llama.cpp's converter writes them).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DeltaNetShape {
    /// Taps of the causal convolution.
    pub conv_kernel: usize,
    /// Key heads (`ssm.group_count`) and value heads (`ssm.time_step_rank`).
    pub n_k_heads: usize,
    pub n_v_heads: usize,
    /// Size of each key and each value head (`ssm.state_size`; llama.cpp requires them equal).
    pub head_dim: usize,
    /// Which key head value head `h` reads: `h % n_k_heads` (the converter reorders Qwen3.5's value heads
    /// so that they tile), or `h / (n_v_heads / n_k_heads)` (Qwen3-Next's grouped order).
    pub tiled: bool,
}

impl DeltaNetShape {
    pub fn key_dim(&self) -> usize {
        self.n_k_heads * self.head_dim
    }
    pub fn value_dim(&self) -> usize {
        self.n_v_heads * self.head_dim
    }
    /// Channels of the convolution: q, k and v together.
    pub fn conv_dim(&self) -> usize {
        2 * self.key_dim() + self.value_dim()
    }
    /// The key head value head `h` reads.
    pub fn key_head(&self, h: usize) -> usize {
        if self.tiled {
            h % self.n_k_heads
        } else {
            h / (self.n_v_heads / self.n_k_heads)
        }
    }
}

/// How RoPE pairs the dimensions of a head.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RopeStyle {
    /// Adjacent pairs (2i, 2i+1): llama.cpp's "norm" type (the converter permutes Llama's q/k for it).
    Adjacent,
    /// Halves (i, i + d/2): llama.cpp's "neox" type, Hugging Face's rotate_half.
    Halves,
}

/// Where the q/k RMS norms of an architecture apply.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum QkNorm {
    None,
    /// One weight of head_dim, applied to each head (Qwen3).
    PerHead,
    /// One weight over all heads together (OLMoE, MiniMax-M2).
    Whole,
    /// No weight, per head, after RoPE and only on the layers with RoPE (Llama 4's L2 norm, which
    /// llama.cpp computes as an RMS norm).
    Unweighted,
}

#[derive(Clone, Debug)]
pub struct Config {
    pub arch: Arch,
    pub arch_name: String,
    pub n_vocab: usize,
    pub n_embd: usize,
    /// Blocks of the main pass (the file's `block_count` less its MTP blocks).
    pub n_layer: usize,
    /// Multi-token-prediction (`nextn`) blocks counted after the main ones in `block_count` (the file may hold
    /// them or not): the main pass never runs them (`weights::MtpHead` loads the first where TITAN runs it).
    pub n_nextn: usize,
    pub n_head: usize,
    pub n_head_kv: usize,
    pub head_dim: usize,
    pub n_ctx_train: usize,
    pub rms_eps: f32,
    pub rope_base: f32,
    pub rope_dims: usize,
    pub rope_style: RopeStyle,
    pub qk_norm: QkNorm,
    pub qkv_bias: bool,
    pub n_expert: usize,
    pub n_expert_used: usize,
    pub expert_ff: usize,
    /// Feed-forward length of the shared expert (Qwen2-MoE), 0 if none.
    pub shared_ff: usize,
    /// Renormalise the chosen experts' weights to sum to one.
    pub norm_topk: bool,
    /// Each layer's token mixer (all attention except in the hybrid architectures).
    pub mixers: Vec<Mixer>,
    /// The attention's query projection also yields a per-head output gate (Qwen3-Next, Qwen3.5).
    pub attn_gate: bool,
    /// The linear-attention layers' dimensions (hybrid architectures only).
    pub delta_net: Option<DeltaNetShape>,
    /// Multi-head latent attention (DeepSeek-V2/V3 only).
    pub mla: Option<MlaShape>,
    /// How many layers at the start have a dense feed-forward of `dense_ff` instead of experts.
    pub dense_lead: usize,
    pub dense_ff: usize,
    /// After those, every `moe_every`-th layer has experts and the others are dense (Llama 4's
    /// `interleave_moe_layer_step`; 1 elsewhere).
    pub moe_every: usize,
    /// How the router's logits score the experts.
    pub scores: Scores,
    /// Group-limited expert choice: experts in `expert_groups` groups, chosen from the best
    /// `expert_groups_used` (1 and 1: no groups).
    pub expert_groups: usize,
    pub expert_groups_used: usize,
    /// The chosen experts' weights are multiplied by this (DeepSeek's routed scaling factor; else 1).
    pub expert_weights_scale: f32,
    /// The shared expert's output is scaled by a sigmoid gate (Qwen2-MoE, the hybrids), or added as it is.
    pub shared_gated: bool,
    /// YaRN context extension of RoPE.
    pub yarn: Option<Yarn>,
    /// Layers whose attention only sees the last `sliding_window` positions (gpt-oss: every other one).
    pub sliding: Vec<bool>,
    pub sliding_window: usize,
    /// Layers whose attention only sees its own chunk of `chunk` positions (Llama 4: [`LLAMA4_CHUNK`]).
    pub chunked: Vec<bool>,
    pub chunk: usize,
    /// Layers without RoPE (Llama 4's every fourth), whose queries take the attention temperature
    /// ([`llama4_attn_temp`]) instead.
    pub nope: Vec<bool>,
    /// The router's weight of a chosen expert scales the expert's input instead of its output (Llama 4).
    pub weigh_input: bool,
    /// Experts are chosen by their raw logits and weighed by a softmax over the chosen ones (gpt-oss).
    pub softmax_chosen: bool,
    pub expert_act: Activation,
    /// The shared expert's activation (DeepSeek-V4 clamps it; silu elsewhere).
    pub shared_act: Activation,
    /// DeepSeek-V4's hyper-connections, compressed attention and token-routed layers.
    pub v4: Option<V4Shape>,
}

/// YaRN's RoPE scaling, as llama.cpp applies it (`rope_yarn` in ggml, its factors in `llama_context`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Yarn {
    pub factor: f32,
    pub orig_ctx: usize,
    pub beta_fast: f32,
    pub beta_slow: f32,
    /// `rope.scaling.yarn_log_multiplier` (DeepSeek's mscale_all_dim), 0 if absent.
    pub log_mul: f32,
    /// DeepSeek-V2's special case of the attention factor.
    pub deepseek: bool,
}

impl Yarn {
    /// YaRN's magnitude scaling for a scale and an mscale (transformers' `get_mscale`).
    fn mscale(scale: f32, m: f32) -> f32 {
        if scale <= 1.0 {
            1.0
        } else {
            0.1 * m * libm::logf(scale) + 1.0
        }
    }

    /// What cos and sin are multiplied by: llama.cpp's attention factor, which it divides by
    /// 1 + 0.1 ln(factor) and ggml's `rope_yarn` multiplies back.
    pub fn rope_mscale(&self) -> f32 {
        let f = self.factor;
        if self.log_mul != 0.0 {
            let m = if self.deepseek && self.log_mul != 1.0 {
                self.log_mul
            } else {
                1.0
            };
            Yarn::mscale(f, m) / Yarn::mscale(f, self.log_mul)
        } else {
            Yarn::mscale(f, 1.0)
        }
    }

    /// The first and last pair index (fractional, as ggml's `ggml_rope_yarn_corr_dims`) between which
    /// YaRN blends from extrapolation to interpolation, for `dims` rotated dimensions.
    pub fn corr_dims(&self, dims: usize, base: f32) -> (f32, f32) {
        let corr = |beta: f32| {
            dims as f32 * libm::logf(self.orig_ctx as f32 / (beta * 2.0 * std::f32::consts::PI))
                / (2.0 * libm::logf(base))
        };
        (
            libm::floorf(corr(self.beta_fast)).max(0.0),
            libm::ceilf(corr(self.beta_slow)).min(dims as f32 - 1.0),
        )
    }
}

/// How many transformer blocks the file has tensors for: one more than the highest `blk.N.` prefix.
fn blocks_in(f: &GgufFile) -> usize {
    f.tensors
        .iter()
        .filter_map(|t| titan_layout::names::split_block(&t.name))
        .map(|(n, _)| n + 1)
        .max()
        .unwrap_or(0)
}

impl Config {
    /// The hyper-parameters of a whole model: `block_count` must be the number of blocks the file holds,
    /// since every per-layer allocation is sized by it.
    pub fn from_gguf(f: &GgufFile) -> Result<Config> {
        Config::parse(f, true)
    }

    /// The hyper-parameters of a file that holds some of a model's blocks (a shard): its `block_count` is
    /// the whole model's, at least the blocks it holds, and nothing is sized by it.
    pub fn of_part(f: &GgufFile) -> Result<Config> {
        Config::parse(f, false)
    }

    fn parse(f: &GgufFile, whole: bool) -> Result<Config> {
        let path = f.path().display().to_string();
        let bad = |what: String| EngineError::Model {
            path: path.clone(),
            what,
        };
        let arch_name = f
            .get_str("general.architecture")?
            .ok_or_else(|| bad("metadata has no general.architecture".into()))?
            .to_string();
        let k = |s: &str| format!("{arch_name}.{s}");
        let n_expert = f.get_u64(&k("expert_count"))?.unwrap_or(0) as usize;
        let arch = match arch_name.as_str() {
            "qwen3moe" => Arch::Qwen3Moe,
            "qwen2moe" => Arch::Qwen2Moe,
            "olmoe" => Arch::Olmoe,
            "llama" if n_expert > 0 => Arch::Mixtral,
            "qwen3next" => Arch::Qwen3Next,
            "qwen35moe" => Arch::Qwen35Moe,
            "qwen35" => Arch::Qwen35,
            "deepseek2" => Arch::DeepSeek2,
            "gpt-oss" => Arch::GptOss,
            "glm4moe" => Arch::Glm4Moe,
            "minimax-m2" => Arch::MiniMaxM2,
            "llama4" => Arch::Llama4,
            "deepseek4" => Arch::DeepSeek4,
            "llama" => return Err(bad("architecture llama without experts (a dense model) is not supported: TITAN runs mixture-of-experts models".into())),
            other => {
                return Err(bad(format!(
                    "unsupported architecture {other:?} (supported: qwen3moe, qwen2moe, olmoe, llama with experts, qwen3next, qwen35moe, qwen35, deepseek2, deepseek4, gpt-oss, glm4moe, minimax-m2, llama4)"
                )))
            }
        };
        let need = |key: &str| -> Result<usize> { Ok(f.u64_of(&k(key))? as usize) };
        let n_embd = need("embedding_length")?;
        // The converter counts MTP blocks in block_count and writes them after the main ones (Qwen3-Next,
        // Qwen3.5/3.6, GLM, DeepSeek V3): running them as main layers would give other logits without a word.
        let block_count = need("block_count")?;
        let n_nextn = f.get_u64(&k("nextn_predict_layers"))?.unwrap_or(0) as usize;
        let n_layer = block_count.checked_sub(n_nextn).ok_or_else(|| {
            bad(format!(
                "{} {n_nextn} exceeds {} {block_count}",
                k("nextn_predict_layers"),
                k("block_count")
            ))
        })?;
        // A converter run with --no-mtp leaves the MTP blocks out of the tensors but may count them.
        let blocks = blocks_in(f);
        let holds = blocks == block_count || n_nextn > 0 && blocks == n_layer;
        if !holds && (whole || block_count < blocks) {
            return Err(bad(format!(
                "{} is {block_count}, but the file holds tensors for {blocks} blocks",
                k("block_count")
            )));
        }
        let n_head = need("attention.head_count")?;
        let n_head_kv = f
            .get_u64(&k("attention.head_count_kv"))?
            .map(|v| v as usize)
            .unwrap_or(n_head);
        let head_dim = match f.get_u64(&k("attention.key_length"))? {
            Some(v) => v as usize,
            None if n_head > 0 => n_embd / n_head,
            None => 0,
        };
        let mla = if arch == Arch::DeepSeek2 {
            Some(mla_shape(f, &k).map_err(bad)?)
        } else {
            None
        };
        // MLA's key_length is the latent vector's plus the RoPE part; a head's query/key is key_length_mla.
        let head_dim = mla.map_or(head_dim, |m| m.nope + m.rope);
        if let (Some(v), None) = (f.get_u64(&k("attention.value_length"))?, mla) {
            if v as usize != head_dim {
                return Err(bad(format!(
                    "attention.value_length {v} differs from key_length {head_dim}, which is not supported"
                )));
            }
        }
        // The dense Qwen3.5 has no experts: every layer is a dense one.
        let all_dense = arch == Arch::Qwen35;
        let n_expert_used = if all_dense { 0 } else { need("expert_used_count")? };
        let expert_ff = match f.get_u64(&k("expert_feed_forward_length"))? {
            Some(v) => v as usize,
            None if all_dense => 0,
            None => need("feed_forward_length")?,
        };
        // DeepSeek writes a count of shared experts of the routed experts' size instead of a length; Llama 4
        // has one of that size and no key for it.
        let shared_ff = match f.get_u64(&k("expert_shared_count"))? {
            _ if arch == Arch::Llama4 => expert_ff,
            Some(n) if matches!(arch, Arch::DeepSeek2 | Arch::DeepSeek4 | Arch::Glm4Moe) => n as usize * expert_ff,
            _ => f.get_u64(&k("expert_shared_feed_forward_length"))?.unwrap_or(0) as usize,
        };
        let moe_every = match f.get_u64(&k("interleave_moe_layer_step"))? {
            Some(0) => return Err(bad(format!("{} is 0", k("interleave_moe_layer_step")))),
            Some(n) if arch == Arch::Llama4 => n as usize,
            None if arch == Arch::Llama4 => return Err(bad(format!("missing {}", k("interleave_moe_layer_step")))),
            _ => 1,
        };
        let dense_lead = if all_dense {
            n_layer
        } else {
            f.get_u64(&k("leading_dense_block_count"))?.unwrap_or(0) as usize
        };
        let dense_ff = if dense_lead > 0 || moe_every > 1 {
            need("feed_forward_length")?
        } else {
            0
        };
        // llama.cpp's expert_gating_func: 1 softmax, 2 sigmoid, 4 sqrt-softplus (DeepSeek-V4, which knows no
        // other); absent means softmax, except for GLM and MiniMax-M2, whose routers know only sigmoid
        // (transformers' MiniMax-M2 router has no other; llama.cpp has no default for it and stops at the missing
        // key). Llama 4 is sigmoid whatever the file says.
        let scores = match f.get_u64(&k("expert_gating_func"))? {
            _ if arch == Arch::Llama4 => Scores::Sigmoid,
            Some(4) if arch == Arch::DeepSeek4 => Scores::SqrtSoftplus,
            g if arch == Arch::DeepSeek4 => {
                return Err(bad(format!(
                    "{} {} is not supported: DeepSeek-V4 routes by sqrt-softplus (4)",
                    k("expert_gating_func"),
                    g.map_or("absent".to_string(), |g| g.to_string())
                )))
            }
            None if matches!(arch, Arch::Glm4Moe | Arch::MiniMaxM2) => Scores::Sigmoid,
            None | Some(1) => Scores::Softmax,
            Some(2) => Scores::Sigmoid,
            Some(g) => {
                return Err(bad(format!(
                    "{} {g} is not supported (1 softmax, 2 sigmoid)",
                    k("expert_gating_func")
                )))
            }
        };
        let expert_groups = f.get_u64(&k("expert_group_count"))?.unwrap_or(1).max(1) as usize;
        let expert_groups_used = f
            .get_u64(&k("expert_group_used_count"))?
            .unwrap_or(expert_groups as u64) as usize;
        let expert_weights_scale = f.get_f64(&k("expert_weights_scale"))?.unwrap_or(1.0) as f32;
        let rms_eps =
            f.get_f64(&k("attention.layer_norm_rms_epsilon"))?
                .ok_or_else(|| bad(format!("missing {}", k("attention.layer_norm_rms_epsilon"))))? as f32;
        let rope_base = f.get_f64(&k("rope.freq_base"))?.unwrap_or(10000.0) as f32;
        let rope_dims = f
            .get_u64(&k("rope.dimension_count"))?
            .map(|v| v as usize)
            .unwrap_or(head_dim);
        // Qwen3.5's multi-section RoPE (`rope.dimension_sections`) gives text tokens the same position in
        // every section, which makes it the plain rotation over `rope.dimension_count` dimensions.
        let factor = f.get_f64(&k("rope.scaling.factor"))?.unwrap_or(1.0) as f32;
        let yarn = match f.get_str(&k("rope.scaling.type"))? {
            Some("yarn") => {
                let get =
                    |key: &str, default: f32| -> Result<f32> { Ok(f.get_f64(&k(key))?.map_or(default, |v| v as f32)) };
                // llama.cpp divides DeepSeek-V2's log multiplier by 0.1 again, undoing its converter's factor.
                let log_mul =
                    get("rope.scaling.yarn_log_multiplier", 0.0)? / if arch == Arch::DeepSeek2 { 0.1 } else { 1.0 };
                let orig_ctx = f.get_u64(&k("rope.scaling.original_context_length"))?.unwrap_or(0) as usize;
                let y = Yarn {
                    factor,
                    orig_ctx,
                    beta_fast: get("rope.scaling.yarn_beta_fast", 32.0)?,
                    beta_slow: get("rope.scaling.yarn_beta_slow", 1.0)?,
                    log_mul,
                    deepseek: arch == Arch::DeepSeek2,
                };
                if !(factor.is_finite() && factor >= 1.0)
                    || orig_ctx == 0
                    || !(y.beta_fast.is_finite() && y.beta_slow.is_finite() && log_mul.is_finite())
                {
                    return Err(bad(format!("YaRN scaling with factor {factor}, original context {orig_ctx}, betas {} and {} is not supported", y.beta_fast, y.beta_slow)));
                }
                Some(y)
            }
            Some("none" | "linear") | None if factor == 1.0 || factor == 0.0 => None,
            Some(t) => return Err(bad(format!("RoPE scaling {t:?} by {factor} is not supported yet"))),
            None => {
                return Err(bad(format!(
                    "RoPE scaling factor {factor} without a scaling type is not supported"
                )))
            }
        };
        let n_ctx_train = f.get_u64(&k("context_length"))?.unwrap_or(4096) as usize;
        let n_vocab = match f.get_array("tokenizer.ggml.tokens")? {
            Some(a) => a.len(),
            None => f
                .tensor("token_embd.weight")
                .map(|t| t.dims[1] as usize)
                .ok_or_else(|| bad("no vocabulary and no token_embd.weight".into()))?,
        };
        let (rope_style, qk_norm, qkv_bias, default_norm) = match arch {
            Arch::Qwen3Moe => (RopeStyle::Halves, QkNorm::PerHead, false, true),
            Arch::Qwen2Moe => (RopeStyle::Halves, QkNorm::None, true, false),
            Arch::Olmoe => (RopeStyle::Halves, QkNorm::Whole, false, false),
            Arch::Mixtral => (RopeStyle::Adjacent, QkNorm::None, false, true),
            Arch::Qwen3Next | Arch::Qwen35Moe | Arch::Qwen35 => (RopeStyle::Halves, QkNorm::PerHead, false, true),
            Arch::DeepSeek2 | Arch::DeepSeek4 => (RopeStyle::Adjacent, QkNorm::None, false, false),
            Arch::GptOss => (RopeStyle::Halves, QkNorm::None, true, false),
            // GLM-4.5 has q/k norms, GLM-4.5-Air has none; both have q/k/v biases (attention_bias).
            Arch::Glm4Moe => {
                let has = |name: &str| f.tensor(&format!("blk.0.{name}")).is_some();
                let qk_norm = if has("attn_q_norm.weight") {
                    QkNorm::PerHead
                } else {
                    QkNorm::None
                };
                (RopeStyle::Halves, qk_norm, has("attn_q.bias"), false)
            }
            // Its q/k norms span all heads: one weight of q_dim and one of kv_dim.
            Arch::MiniMaxM2 => (RopeStyle::Halves, QkNorm::Whole, false, true),
            // The converter keeps Llama 4's q/k in adjacent pairs; llama.cpp leaves the q/k norms out of
            // models with 128 experts (Maverick), by its model-type check.
            Arch::Llama4 => {
                let qk_norm = if n_expert == 128 {
                    QkNorm::None
                } else {
                    QkNorm::Unweighted
                };
                (RopeStyle::Adjacent, qk_norm, false, false)
            }
        };
        let gpt_oss = arch == Arch::GptOss;
        // llama.cpp's pattern for gpt-oss: layers 0, 2, 4, … slide, unless the file lists them.
        let sliding_window = f.get_u64(&k("attention.sliding_window"))?.unwrap_or(0) as usize;
        let sliding: Vec<bool> = match f.get_array(&k("attention.sliding_window_pattern"))? {
            // Llama 4's pattern lists chunked layers, not sliding ones (see `llama4_layers`).
            Some(_) if arch == Arch::Llama4 => vec![false; n_layer],
            Some(a) => a.iter().take(n_layer).map(|v| v.as_bool().unwrap_or(false)).collect(),
            None if gpt_oss => (0..n_layer).map(|i| i % 2 == 0).collect(),
            None => vec![false; n_layer],
        };
        if sliding.len() != n_layer || sliding.iter().any(|&s| s) && sliding_window == 0 {
            return Err(bad(format!(
                "{} does not describe {n_layer} layers with a positive window",
                k("attention.sliding_window_pattern")
            )));
        }
        let (chunked, nope) = if arch == Arch::Llama4 {
            llama4_layers(f, &k, n_layer).map_err(bad)?
        } else {
            (vec![false; n_layer], vec![false; n_layer])
        };
        let hybrid = matches!(arch, Arch::Qwen3Next | Arch::Qwen35Moe | Arch::Qwen35);
        // llama.cpp always renormalises the hybrids' and MiniMax-M2's top-k weights, whatever the metadata says.
        let norm_topk =
            hybrid || arch == Arch::MiniMaxM2 || f.get_bool(&k("expert_weights_norm"))?.unwrap_or(default_norm);
        let (mixers, delta_net) = if hybrid {
            hybrid_layers(f, &k, n_layer, arch != Arch::Qwen3Next).map_err(bad)?
        } else {
            (vec![Mixer::Attention; n_layer], None)
        };
        let v4 = if arch == Arch::DeepSeek4 {
            Some(v4_shape(f, &k, n_layer, n_embd, yarn).map_err(bad)?)
        } else {
            None
        };

        for (key, value, ok, range) in [
            (
                "attention.layer_norm_rms_epsilon",
                rms_eps,
                rms_eps > 0.0 && rms_eps < 1.0,
                "between 0 and 1",
            ),
            ("rope.freq_base", rope_base, rope_base > 1.0, "greater than 1"),
        ] {
            if !(value.is_finite() && ok) {
                return Err(bad(format!(
                    "{} is {value}; it must be a finite number {range}",
                    k(key)
                )));
            }
        }
        let c = Config {
            arch,
            arch_name,
            n_vocab,
            n_embd,
            n_layer,
            n_nextn,
            n_head,
            n_head_kv,
            head_dim,
            n_ctx_train,
            rms_eps,
            rope_base,
            rope_dims,
            rope_style,
            qk_norm,
            qkv_bias,
            n_expert,
            n_expert_used,
            expert_ff,
            shared_ff,
            norm_topk,
            mixers,
            attn_gate: hybrid,
            delta_net,
            mla,
            dense_lead,
            dense_ff,
            moe_every,
            scores,
            expert_groups,
            expert_groups_used,
            expert_weights_scale,
            shared_gated: !matches!(arch, Arch::DeepSeek2 | Arch::DeepSeek4 | Arch::Glm4Moe | Arch::Llama4),
            // DeepSeek-V4's YaRN is its compressed layers' alone (`V4Shape::compress_yarn`).
            yarn: if arch == Arch::DeepSeek4 { None } else { yarn },
            sliding,
            sliding_window,
            chunked,
            chunk: LLAMA4_CHUNK,
            nope,
            weigh_input: arch == Arch::Llama4,
            softmax_chosen: gpt_oss,
            // llama.cpp's constants for gpt-oss (the files carry no key for them)
            expert_act: match &v4 {
                _ if gpt_oss => Activation::ClampedSwiglu {
                    alpha: 1.702,
                    limit: 7.0,
                },
                Some((_, limits)) => Activation::ClampedSilu { limit: limits.0 },
                None => Activation::Silu,
            },
            shared_act: match &v4 {
                Some((_, limits)) => Activation::ClampedSilu { limit: limits.1 },
                None => Activation::Silu,
            },
            v4: v4.map(|(shape, _)| shape),
        };
        c.validate().map_err(bad)?;
        Ok(c)
    }

    /// Whether TITAN runs this architecture's multi-token-prediction block (to draft with it), where a file
    /// holds one: Qwen3-Next's, Qwen3.5/3.6 MoE's and GLM-4.5's, which llama.cpp's MTP graphs compose alike.
    pub fn runs_mtp(&self) -> bool {
        matches!(self.arch, Arch::Qwen3Next | Arch::Qwen35Moe | Arch::Glm4Moe)
    }

    fn validate(&self) -> std::result::Result<(), String> {
        let positive = [
            ("embedding_length", self.n_embd),
            ("block_count", self.n_layer),
            ("attention.head_count", self.n_head),
            ("attention.head_count_kv", self.n_head_kv),
            ("attention.key_length", self.head_dim),
            ("expert_count", self.n_expert),
            ("expert_used_count", self.n_expert_used),
            ("expert_feed_forward_length", self.expert_ff),
            ("vocabulary size", self.n_vocab),
        ];
        // A model without experts (the dense Qwen3.5) needs none of the expert keys.
        let experts_needed = (0..self.n_layer).any(|il| self.is_moe(il));
        for (name, v) in positive {
            if v == 0 && (experts_needed || !name.starts_with("expert")) {
                return Err(format!("metadata {name} is 0"));
            }
        }
        if !self.n_head.is_multiple_of(self.n_head_kv) {
            return Err(format!(
                "head_count {} is not a multiple of head_count_kv {}",
                self.n_head, self.n_head_kv
            ));
        }
        if self.n_expert_used > self.n_expert {
            return Err(format!(
                "expert_used_count {} exceeds expert_count {}",
                self.n_expert_used, self.n_expert
            ));
        }
        if self.dense_lead > self.n_layer || self.dense_lead > 0 && self.dense_ff == 0 {
            return Err(format!(
                "leading_dense_block_count {} with feed_forward_length {} does not fit {} layers",
                self.dense_lead, self.dense_ff, self.n_layer
            ));
        }
        if !self.n_expert.is_multiple_of(self.expert_groups)
            || self.expert_groups_used == 0
            || self.expert_groups_used > self.expert_groups
        {
            return Err(format!(
                "{} experts in {} groups, {} of them used, is not a valid grouping",
                self.n_expert, self.expert_groups, self.expert_groups_used
            ));
        }
        if self.expert_groups > 1 && self.n_expert / self.expert_groups < 2
            || self.expert_groups_used * (self.n_expert / self.expert_groups) < self.n_expert_used
        {
            return Err(format!(
                "{} experts in {} groups cannot give {} from {} groups",
                self.n_expert, self.expert_groups, self.n_expert_used, self.expert_groups_used
            ));
        }
        if !(self.expert_weights_scale.is_finite() && self.expert_weights_scale > 0.0) {
            return Err(format!(
                "expert_weights_scale is {}; it must be a positive number",
                self.expert_weights_scale
            ));
        }
        if self.rope_dims > self.head_dim || !self.rope_dims.is_multiple_of(2) {
            return Err(format!(
                "rope.dimension_count {} does not fit head size {}",
                self.rope_dims, self.head_dim
            ));
        }
        if let Some(v) = &self.v4 {
            let out = self.q_dim();
            if self.n_head_kv != 1 || !out.is_multiple_of(v.out_groups.max(1)) || v.out_groups == 0 {
                return Err(format!(
                    "DeepSeek-V4 attention with {} KV heads and {out} outputs in {} groups is not supported (one KV head, equal groups)",
                    self.n_head_kv, v.out_groups
                ));
            }
            if v.ratios.contains(&4) && self.rope_dims > v.idx_dim {
                return Err(format!(
                    "rope.dimension_count {} does not fit the indexer's head size {}",
                    self.rope_dims, v.idx_dim
                ));
            }
        }
        if matches!(self.arch, Arch::Qwen2Moe | Arch::Qwen3Next | Arch::Qwen35Moe) && self.shared_ff == 0 {
            return Err(format!("{} needs expert_shared_feed_forward_length", self.arch_name));
        }
        Ok(())
    }

    /// Whether layer `il` has experts (else a dense feed-forward of `dense_ff`).
    pub fn is_moe(&self, il: usize) -> bool {
        il >= self.dense_lead && (il + 1).is_multiple_of(self.moe_every)
    }

    pub fn q_dim(&self) -> usize {
        self.n_head * self.head_dim
    }

    /// Floats the KV cache holds per position and layer: keys and values of every KV head, or with MLA
    /// the latent vector and the key's RoPE part.
    pub fn kv_dim(&self) -> usize {
        match self.mla {
            Some(m) => m.kv_lora + m.rope,
            None => self.n_head_kv * self.head_dim,
        }
    }

    /// The attention scores' scale: 1/sqrt(head size), times DeepSeek's YaRN factor squared.
    pub fn attn_scale(&self) -> f32 {
        let base = 1.0 / (self.head_dim as f32).sqrt();
        match (self.arch, self.yarn) {
            (Arch::DeepSeek2, Some(y)) => {
                let m = y.rope_mscale() * (1.0 + 0.1 * y.log_mul * libm::logf(y.factor));
                m * m * base
            }
            _ => base,
        }
    }

    /// Rows of the query projection: the queries, and as many gate values when attention is gated.
    pub fn q_proj_dim(&self) -> usize {
        if self.attn_gate {
            2 * self.q_dim()
        } else {
            self.q_dim()
        }
    }

    /// How many layers attend over a KV cache.
    pub fn n_attention_layers(&self) -> usize {
        self.mixers.iter().filter(|&&m| m == Mixer::Attention).count()
    }

    /// Bytes a sequence of `n_ctx` positions holds: f32 keys and values of every attention layer, and the
    /// recurrent state of every linear-attention layer.
    pub fn kv_bytes(&self, n_ctx: usize) -> u128 {
        let recurrent = self.delta_net.map_or(0, |s| {
            (self.n_layer - self.n_attention_layers()) * crate::delta_net::DeltaState::bytes(&s)
        });
        // latent attention keeps keys only: its values are read out of them; DeepSeek-V4's keys are its values
        let tensors = if self.mla.is_some() || self.v4.is_some() { 1 } else { 2 };
        let compressed: u128 = self.v4.as_ref().map_or(0, |v| {
            let d = self.head_dim as u128;
            v.ratios
                .iter()
                .map(|&r| crate::compressed::LayerState::floats(r, d as usize, v.idx_dim, n_ctx) as u128)
                .sum::<u128>()
                * 4
        });
        tensors * 4 * self.n_attention_layers() as u128 * n_ctx as u128 * self.kv_dim() as u128
            + recurrent as u128
            + compressed
    }

    /// Bytes of the KV cache of the MTP block, for a sequence of `n_ctx` positions that drafts with it (one
    /// attention layer with keys and values: `Model::mtp_state`); 0 where TITAN does not run one.
    pub fn mtp_kv_bytes(&self, n_ctx: usize) -> u128 {
        if !self.runs_mtp() || self.n_nextn == 0 {
            return 0;
        }
        2 * 4 * n_ctx as u128 * self.kv_dim() as u128
    }
}

/// Llama 4's chunked layers (from `attention.sliding_window_pattern` where the file lists them, else
/// llama.cpp's pattern: three of every four) and its layers without RoPE (every fourth, llama.cpp's
/// `n_no_rope_layer_step`). A file whose `attention.sliding_window` is 0 has neither in llama.cpp, which
/// then gives the last layer no RoPE and no temperature: not supported.
fn llama4_layers(
    f: &GgufFile,
    k: &dyn Fn(&str) -> String,
    n_layer: usize,
) -> std::result::Result<(Vec<bool>, Vec<bool>), String> {
    if f.get_u64(&k("attention.sliding_window")).map_err(|e| e.to_string())? == Some(0) {
        return Err(format!(
            "{} 0 (a Llama 4 without chunked attention) is not supported",
            k("attention.sliding_window")
        ));
    }
    let chunked = match f
        .get_array(&k("attention.sliding_window_pattern"))
        .map_err(|e| e.to_string())?
    {
        Some(a) => {
            let flags: Option<Vec<bool>> = a.iter().take(n_layer).map(|v| v.as_bool()).collect();
            match flags {
                Some(flags) if flags.len() == n_layer => flags,
                _ => {
                    return Err(format!(
                        "{} is not an array of {n_layer} booleans",
                        k("attention.sliding_window_pattern")
                    ))
                }
            }
        }
        None => (0..n_layer)
            .map(|il| il % LLAMA4_PATTERN < LLAMA4_PATTERN - 1)
            .collect(),
    };
    let nope = (0..n_layer).map(|il| (il + 1) % LLAMA4_PATTERN == 0).collect();
    Ok((chunked, nope))
}

/// DeepSeek-V4's dimensions, and its experts' and shared expert's SwiGLU clamps, refused where llama.cpp's
/// graph would not run them (four streams, ratios 0/4/128, one KV head) or where TITAN does not (clamps that
/// differ between layers). `yarn` is the file's RoPE scaling, which only the compressed layers take.
#[allow(clippy::type_complexity)]
fn v4_shape(
    f: &GgufFile,
    k: &dyn Fn(&str) -> String,
    n_layer: usize,
    n_embd: usize,
    yarn: Option<Yarn>,
) -> std::result::Result<(V4Shape, (f32, f32)), String> {
    let get = |key: &str| -> std::result::Result<Option<u64>, String> { f.get_u64(&k(key)).map_err(|e| e.to_string()) };
    let need = |key: &str| {
        get(key)?
            .map(|v| v as usize)
            .ok_or_else(|| format!("missing {}", k(key)))
    };
    let float = |key: &str| -> std::result::Result<f32, String> {
        f.get_f64(&k(key))
            .map_err(|e| e.to_string())?
            .map(|v| v as f32)
            .ok_or_else(|| format!("missing {}", k(key)))
    };
    let array = |key: &str| -> std::result::Result<Vec<titan_gguf::Value>, String> {
        let a = f
            .get_array(&k(key))
            .map_err(|e| e.to_string())?
            .ok_or_else(|| format!("missing {}", k(key)))?;
        if a.len() != n_layer {
            return Err(format!("{} has {} entries for {n_layer} layers", k(key), a.len()));
        }
        Ok(a.to_vec())
    };
    let ratios = array("attention.compress_ratios")?
        .iter()
        .map(|v| v.as_i64().filter(|r| *r >= 0).map(|r| r as usize))
        .collect::<Option<Vec<usize>>>()
        .filter(|r| r.iter().all(|r| V4_RATIOS.contains(r)))
        .ok_or_else(|| {
            format!(
                "{} holds a ratio other than 0, 4 and 128",
                k("attention.compress_ratios")
            )
        })?;
    // One clamp for all layers: TITAN's experts take one activation (a node computes it from the file too).
    let clamp = |key: &str| -> std::result::Result<f32, String> {
        let values = array(key)?
            .iter()
            .map(|v| v.as_f64().map(|v| v as f32))
            .collect::<Option<Vec<f32>>>()
            .ok_or_else(|| format!("{} is not an array of numbers", k(key)))?;
        match values[..] {
            [first, ..] if values.iter().all(|&v| v == first) && first.is_finite() && first > 0.0 => Ok(first),
            _ => Err(format!(
                "{} is {values:?}: TITAN runs one positive clamp for all layers",
                k(key)
            )),
        }
    };
    let limits = (clamp("swiglu_clamp_exp")?, clamp("swiglu_clamp_shexp")?);
    let hc = need("hyper_connection.count")?;
    let shape = V4Shape {
        q_lora: need("attention.q_lora_rank")?,
        hc,
        sinkhorn_iters: need("hyper_connection.sinkhorn_iterations")?,
        hc_eps: float("hyper_connection.epsilon")?,
        window: need("attention.sliding_window")?,
        compress_base: float("attention.compress_rope_freq_base")?,
        // The attention factor cancels YaRN's magnitude scale, which is what a log multiplier of 1 gives.
        compress_yarn: yarn.map(|y| Yarn {
            log_mul: 1.0,
            deepseek: false,
            ..y
        }),
        out_groups: need("attention.output_group_count")?,
        out_rank: need("attention.output_lora_rank")?,
        idx_heads: get("attention.indexer.head_count")?.unwrap_or(0) as usize,
        idx_dim: get("attention.indexer.key_length")?.unwrap_or(0) as usize,
        idx_top_k: get("attention.indexer.top_k")?.unwrap_or(0) as usize,
        hash_layers: get("hash_layer_count")?.unwrap_or(0) as usize,
        ratios,
    };
    if hc != 4 {
        return Err(format!(
            "{} is {hc}; DeepSeek-V4 has 4 streams",
            k("hyper_connection.count")
        ));
    }
    if let Some(out) = get("embedding_length_out")? {
        if out as usize != hc * n_embd {
            return Err(format!("{} is {out}, not {hc} × {n_embd}", k("embedding_length_out")));
        }
    }
    if shape.q_lora == 0 || shape.window == 0 || shape.out_rank == 0 || shape.sinkhorn_iters == 0 {
        return Err(format!(
            "q_lora_rank {}, sliding_window {}, output_lora_rank {} and sinkhorn_iterations {} must be positive",
            shape.q_lora, shape.window, shape.out_rank, shape.sinkhorn_iters
        ));
    }
    if !(shape.hc_eps.is_finite()
        && shape.hc_eps >= 0.0
        && shape.compress_base.is_finite()
        && shape.compress_base > 1.0)
    {
        return Err(format!(
            "hyper_connection.epsilon {} and compress_rope_freq_base {} are out of range",
            shape.hc_eps, shape.compress_base
        ));
    }
    if shape.ratios.contains(&4) && (shape.idx_heads == 0 || shape.idx_dim == 0 || shape.idx_top_k == 0) {
        return Err(format!(
            "a ratio-4 layer needs the indexer's head_count, key_length and top_k (got {}, {}, {})",
            shape.idx_heads, shape.idx_dim, shape.idx_top_k
        ));
    }
    if shape.hash_layers > n_layer {
        return Err(format!(
            "{} {} exceeds {n_layer} layers",
            k("hash_layer_count"),
            shape.hash_layers
        ));
    }
    Ok((shape, limits))
}

/// DeepSeek's latent-attention dimensions.
fn mla_shape(f: &GgufFile, k: &dyn Fn(&str) -> String) -> std::result::Result<MlaShape, String> {
    let get = |key: &str| -> std::result::Result<Option<usize>, String> {
        f.get_u64(&k(key))
            .map(|v| v.map(|v| v as usize))
            .map_err(|e| e.to_string())
    };
    let need = |key: &str| get(key)?.ok_or_else(|| format!("missing {}", k(key)));
    let rope = need("rope.dimension_count")?;
    let key_mla = need("attention.key_length_mla")?;
    let m = MlaShape {
        q_lora: get("attention.q_lora_rank")?.unwrap_or(0),
        kv_lora: need("attention.kv_lora_rank")?,
        nope: key_mla.saturating_sub(rope),
        rope,
        v_dim: need("attention.value_length_mla")?,
    };
    if m.kv_lora == 0 || m.nope == 0 || m.v_dim == 0 {
        return Err(format!("latent attention of rank {}, key length {key_mla} with {rope} RoPE dimensions and value length {} is not supported", m.kv_lora, m.v_dim));
    }
    Ok(m)
}

/// The hybrids' layer pattern and linear-attention dimensions. Which layers are linear comes from
/// `attention.recurrent_layers` when the converter wrote it, else from `full_attention_interval` (every
/// n-th layer is full attention), as llama.cpp reads them.
fn hybrid_layers(
    f: &GgufFile,
    k: &dyn Fn(&str) -> String,
    n_layer: usize,
    tiled: bool,
) -> std::result::Result<(Vec<Mixer>, Option<DeltaNetShape>), String> {
    let get = |key: &str| -> std::result::Result<usize, String> {
        match f.get_u64(&k(key)) {
            Ok(Some(v)) => Ok(v as usize),
            Ok(None) => Err(format!("missing {}", k(key))),
            Err(e) => Err(e.to_string()),
        }
    };
    let mixers = match f
        .get_array(&k("attention.recurrent_layers"))
        .map_err(|e| e.to_string())?
    {
        Some(a) => {
            let flags: Vec<bool> = a
                .iter()
                .map(|v| v.as_bool())
                .collect::<Option<_>>()
                .ok_or_else(|| format!("{} is not an array of booleans", k("attention.recurrent_layers")))?;
            if flags.len() < n_layer {
                return Err(format!(
                    "{} has {} entries for {n_layer} layers",
                    k("attention.recurrent_layers"),
                    flags.len()
                ));
            }
            flags[..n_layer]
                .iter()
                .map(|&r| if r { Mixer::DeltaNet } else { Mixer::Attention })
                .collect()
        }
        None => {
            let interval = f
                .get_u64(&k("full_attention_interval"))
                .map_err(|e| e.to_string())?
                .unwrap_or(4) as usize;
            if interval == 0 {
                return Err(format!("{} is 0", k("full_attention_interval")));
            }
            (0..n_layer)
                .map(|i| {
                    if (i + 1) % interval == 0 {
                        Mixer::Attention
                    } else {
                        Mixer::DeltaNet
                    }
                })
                .collect()
        }
    };
    let shape = DeltaNetShape {
        conv_kernel: get("ssm.conv_kernel")?,
        n_k_heads: get("ssm.group_count")?,
        n_v_heads: get("ssm.time_step_rank")?,
        head_dim: get("ssm.state_size")?,
        tiled,
    };
    let inner = get("ssm.inner_size")?;
    if shape.conv_kernel == 0
        || shape.n_k_heads == 0
        || shape.head_dim == 0
        || !shape.n_v_heads.is_multiple_of(shape.n_k_heads)
    {
        return Err(format!(
            "linear attention of {} key heads, {} value heads, head size {} and a {}-tap convolution is not supported",
            shape.n_k_heads, shape.n_v_heads, shape.head_dim, shape.conv_kernel
        ));
    }
    if inner != shape.value_dim() {
        return Err(format!(
            "{} is {inner}, but {} value heads of {} make {}",
            k("ssm.inner_size"),
            shape.n_v_heads,
            shape.head_dim,
            shape.value_dim()
        ));
    }
    Ok((mixers, Some(shape)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;
    use titan_gguf::{GgufWriter, Value};
    use titan_kernels::GgmlType;

    /// The hyper-parameters of a glm4moe header as the converter writes it (3 main blocks, one dense; no
    /// q/k norms or biases), with `block_count` blocks of which `nextn` are MTP ones, and tensors for the
    /// first `held` blocks.
    fn glm(dir: &Path, block_count: u32, nextn: Option<u32>, held: usize) -> Result<Config> {
        let mut keys = vec![
            ("block_count", block_count),
            ("feed_forward_length", 128),
            ("expert_shared_count", 1),
            ("leading_dense_block_count", 1),
        ];
        keys.extend(nextn.map(|n| ("nextn_predict_layers", n)));
        let name = format!("glm-{block_count}-{nextn:?}-{held}.gguf");
        header(&dir.join(name), "glm4moe", &keys, held, |_| {})
    }

    /// A header of `arch` with the attention and expert shapes of the fixtures (hidden 64, 4 query and 2 KV
    /// heads of 32, RoPE on 16 dims, 8 experts top-2 of 32), `keys` besides, and tensors for `held` blocks.
    fn header(
        path: &Path,
        arch: &str,
        keys: &[(&str, u32)],
        held: usize,
        extra: impl FnOnce(&mut GgufWriter),
    ) -> Result<Config> {
        let mut w = GgufWriter::new();
        w.set("general.architecture", Value::String(arch.into()));
        let shapes = [
            ("embedding_length", 64),
            ("attention.head_count", 4),
            ("attention.head_count_kv", 2),
            ("attention.key_length", 32),
            ("rope.dimension_count", 16),
            ("expert_count", 8),
            ("expert_used_count", 2),
            ("expert_feed_forward_length", 32),
        ];
        for &(key, v) in shapes.iter().chain(keys) {
            w.set(&format!("{arch}.{key}"), Value::U32(v));
        }
        w.set(&format!("{arch}.attention.layer_norm_rms_epsilon"), Value::F32(1e-5));
        extra(&mut w);
        w.add_tensor("token_embd.weight", &[64, 16], GgmlType::F32).unwrap();
        for i in 0..held {
            w.add_tensor(&format!("blk.{i}.attn_norm.weight"), &[64], GgmlType::F32)
                .unwrap();
        }
        let data: Vec<Vec<u8>> = w.tensor_sizes().map(|(_, s)| vec![0u8; s as usize]).collect();
        let refs: Vec<&[u8]> = data.iter().map(Vec::as_slice).collect();
        w.write_all(&refs, &mut std::fs::File::create(path).unwrap()).unwrap();
        Config::from_gguf(&GgufFile::open(path).unwrap())
    }

    /// A deepseek4 header of 3 blocks as the converter writes it (ratios 0, 4, 128; 4 streams), with `edit`
    /// applied last.
    fn deepseek4(path: &Path, edit: impl FnOnce(&mut GgufWriter)) -> Result<Config> {
        let keys = [
            ("block_count", 3),
            ("attention.head_count_kv", 1),
            ("attention.key_length", 64),
            ("attention.q_lora_rank", 32),
            ("attention.sliding_window", 8),
            ("attention.output_group_count", 2),
            ("attention.output_lora_rank", 32),
            ("attention.indexer.head_count", 8),
            ("attention.indexer.key_length", 64),
            ("attention.indexer.top_k", 4),
            ("hyper_connection.count", 4),
            ("hyper_connection.sinkhorn_iterations", 20),
            ("hash_layer_count", 1),
            ("expert_gating_func", 4),
            ("expert_shared_count", 1),
        ];
        header(path, "deepseek4", &keys, 3, |w| {
            let floats = |v: f32| Value::Array(titan_gguf::ValueType::F32, vec![Value::F32(v); 3]);
            let ratios = [0, 4, 128].map(Value::I32).to_vec();
            w.set(
                "deepseek4.attention.compress_ratios",
                Value::Array(titan_gguf::ValueType::I32, ratios),
            );
            w.set("deepseek4.attention.compress_rope_freq_base", Value::F32(160000.0));
            w.set("deepseek4.hyper_connection.epsilon", Value::F32(1e-6));
            w.set("deepseek4.swiglu_clamp_exp", floats(10.0));
            w.set("deepseek4.swiglu_clamp_shexp", floats(10.0));
            edit(w);
        })
    }

    /// DeepSeek-V4's keys as llama.cpp reads them, and what TITAN refuses with a message that names the key:
    /// other than 4 streams, a ratio other than 0/4/128, another scoring than sqrt-softplus, clamps that differ.
    #[test]
    fn deepseek4_keys_and_refusals() {
        let dir = tempfile::tempdir().unwrap();
        let path = |name: &str| dir.path().join(name);
        let c = deepseek4(&path("plain.gguf"), |_| {}).unwrap();
        let v = c.v4.as_ref().unwrap();
        assert_eq!(
            (c.arch, c.scores, c.shared_ff, c.n_head_kv),
            (Arch::DeepSeek4, Scores::SqrtSoftplus, 32, 1)
        );
        assert_eq!(
            (v.hc, &v.ratios[..], v.hash_layers, v.idx_top_k),
            (4, &[0, 4, 128][..], 1, 4)
        );
        assert_eq!(c.expert_act, Activation::ClampedSilu { limit: 10.0 });
        let refused =
            |name: &str, edit: &dyn Fn(&mut GgufWriter)| deepseek4(&path(name), |w| edit(w)).unwrap_err().to_string();
        let e = refused("hc.gguf", &|w| w.set("deepseek4.hyper_connection.count", Value::U32(2)));
        assert!(e.contains("deepseek4.hyper_connection.count is 2"), "{e}");
        let e = refused("ratio.gguf", &|w| {
            let ratios = [0, 8, 128].map(Value::I32).to_vec();
            w.set(
                "deepseek4.attention.compress_ratios",
                Value::Array(titan_gguf::ValueType::I32, ratios),
            );
        });
        assert!(e.contains("a ratio other than 0, 4 and 128"), "{e}");
        let e = refused("gating.gguf", &|w| w.set("deepseek4.expert_gating_func", Value::U32(2)));
        assert!(e.contains("deepseek4.expert_gating_func 2 is not supported"), "{e}");
        let e = refused("clamp.gguf", &|w| {
            let limits = [10.0, 7.0, 10.0].map(Value::F32).to_vec();
            w.set(
                "deepseek4.swiglu_clamp_exp",
                Value::Array(titan_gguf::ValueType::F32, limits),
            );
        });
        assert!(e.contains("deepseek4.swiglu_clamp_exp is [10.0, 7.0, 10.0]"), "{e}");
    }

    /// MiniMax-M2 as llama.cpp reads it: q/k norms over all heads, RoPE on rope.dimension_count, the top-k
    /// weights renormalised even where expert_weights_norm says no, sigmoid scores without a key saying so
    /// (the converter writes one from scoring_func) and softmax only where the key asks for it.
    #[test]
    fn minimax_m2_defaults() {
        let dir = tempfile::tempdir().unwrap();
        let path = |name: &str| dir.path().join(name);
        let c = header(&path("plain.gguf"), "minimax-m2", &[("block_count", 2)], 2, |_| {}).unwrap();
        assert_eq!((c.arch, c.n_layer, c.n_nextn), (Arch::MiniMaxM2, 2, 0));
        assert_eq!((c.qk_norm, c.qkv_bias, c.shared_ff), (QkNorm::Whole, false, 0));
        assert_eq!((c.rope_dims, c.rope_style), (16, RopeStyle::Halves));
        assert!(c.scores == Scores::Sigmoid && c.norm_topk);
        let keys = [("block_count", 2), ("expert_gating_func", 1)];
        let c = header(&path("softmax.gguf"), "minimax-m2", &keys, 2, |w| {
            w.set("minimax-m2.expert_weights_norm", Value::Bool(false));
        })
        .unwrap();
        assert!(c.scores == Scores::Softmax && c.norm_topk);
    }

    /// GLM counts its MTP blocks in block_count: the forward pass has the others, whether the file holds
    /// the MTP blocks or the converter left them out; scores are sigmoid and the shared expert ungated
    /// without any key saying so, as llama.cpp reads GLM.
    #[test]
    fn glm_mtp_blocks_are_counted_out_of_the_forward_pass() {
        let dir = tempfile::tempdir().unwrap();
        for held in [4, 3] {
            let c = glm(dir.path(), 4, Some(1), held).unwrap();
            assert_eq!((c.n_layer, c.n_nextn, c.dense_lead), (3, 1, 1), "{held} blocks held");
            assert!(c.scores == Scores::Sigmoid && !c.shared_gated);
            assert_eq!((c.shared_ff, c.rope_dims, c.rope_style), (32, 16, RopeStyle::Halves));
            assert_eq!((c.qk_norm, c.qkv_bias), (QkNorm::None, false));
        }
        // Without nextn_predict_layers every block is a main one, and a missing one is an error.
        let e = glm(dir.path(), 4, None, 3).unwrap_err().to_string();
        assert!(
            e.contains("block_count is 4, but the file holds tensors for 3 blocks"),
            "{e}"
        );
        let e = glm(dir.path(), 2, Some(3), 2).unwrap_err().to_string();
        assert!(
            e.contains("glm4moe.nextn_predict_layers 3 exceeds glm4moe.block_count 2"),
            "{e}"
        );
    }

    /// Llama 4's attention temperature, llama.cpp's log(⌊(pos + 1) / 8192⌋ + 1) · 0.1 + 1: exactly 1 up to
    /// position 8190, then ln 2 · 0.1 + 1 from 8191 and ln 3 · 0.1 + 1 from 16383 (the values by hand).
    #[test]
    fn llama4_temperature_steps_every_8192_positions() {
        for pos in [0, 1, 51, 4096, 8190] {
            assert_eq!(llama4_attn_temp(pos), 1.0, "position {pos}");
        }
        for (pos, want) in [(8191, 1.069_314_7f32), (16382, 1.069_314_7), (16383, 1.109_861_2)] {
            assert_eq!(llama4_attn_temp(pos), want, "position {pos}");
        }
    }

    /// A llama4 header as the converter writes it (8 blocks, `n_expert` experts), with `extra` keys.
    fn llama4(dir: &Path, n_expert: u32, extra: &[(&str, u32)]) -> Result<Config> {
        let mut w = GgufWriter::new();
        w.set("general.architecture", Value::String("llama4".into()));
        for (key, v) in [
            ("block_count", 8),
            ("embedding_length", 64),
            ("attention.head_count", 4),
            ("attention.head_count_kv", 2),
            ("attention.key_length", 32),
            ("feed_forward_length", 128),
            ("expert_count", n_expert),
            ("expert_used_count", 1),
            ("expert_feed_forward_length", 32),
        ]
        .iter()
        .chain(extra)
        {
            w.set(&format!("llama4.{key}"), Value::U32(*v));
        }
        w.set("llama4.attention.layer_norm_rms_epsilon", Value::F32(1e-5));
        w.add_tensor("token_embd.weight", &[64, 16], GgmlType::F32).unwrap();
        for i in 0..8 {
            w.add_tensor(&format!("blk.{i}.attn_norm.weight"), &[64], GgmlType::F32)
                .unwrap();
        }
        let data: Vec<Vec<u8>> = w.tensor_sizes().map(|(_, s)| vec![0u8; s as usize]).collect();
        let refs: Vec<&[u8]> = data.iter().map(Vec::as_slice).collect();
        let path = dir.join(format!("llama4-{n_expert}-{}.gguf", extra.len()));
        w.write_all(&refs, &mut std::fs::File::create(&path).unwrap()).unwrap();
        Config::from_gguf(&GgufFile::open(&path).unwrap())
    }

    /// Llama 4 as llama.cpp reads it: MoE on every interleave_moe_layer_step-th layer, chunked attention on
    /// three layers of four and no RoPE on the fourth, sigmoid scores weighing the experts' input, an ungated
    /// shared expert of the experts' size, weightless q/k norms unless the model has 128 experts; a missing
    /// step, or a file without chunked attention, is an error that names the key.
    #[test]
    fn llama4_layers_and_routing_are_llama_cpps() {
        let dir = tempfile::tempdir().unwrap();
        let c = llama4(dir.path(), 16, &[("interleave_moe_layer_step", 2)]).unwrap();
        let moe: Vec<bool> = (0..8).map(|il| c.is_moe(il)).collect();
        assert_eq!(moe, [false, true, false, true, false, true, false, true]);
        assert_eq!(c.chunked, [true, true, true, false, true, true, true, false]);
        assert_eq!(c.nope, [false, false, false, true, false, false, false, true]);
        assert_eq!((c.chunk, c.dense_ff, c.shared_ff), (8192, 128, 32));
        assert!(c.scores == Scores::Sigmoid && c.weigh_input && !c.shared_gated && !c.norm_topk);
        assert_eq!((c.qk_norm, c.rope_style), (QkNorm::Unweighted, RopeStyle::Adjacent));
        let c = llama4(dir.path(), 128, &[("interleave_moe_layer_step", 1)]).unwrap();
        assert!((0..8).all(|il| c.is_moe(il)));
        assert_eq!(
            c.qk_norm,
            QkNorm::None,
            "Maverick's 128 experts: no q/k norms in llama.cpp"
        );
        let e = llama4(dir.path(), 16, &[]).unwrap_err().to_string();
        assert!(e.contains("missing llama4.interleave_moe_layer_step"), "{e}");
        let no_chunks = [("interleave_moe_layer_step", 1), ("attention.sliding_window", 0)];
        let e = llama4(dir.path(), 16, &no_chunks).unwrap_err().to_string();
        assert!(
            e.contains("llama4.attention.sliding_window 0 (a Llama 4 without chunked attention) is not supported"),
            "{e}"
        );
    }
}
