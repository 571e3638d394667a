//! The real models `titan synth` imitates: their dimensions and the GGUF metadata llama.cpp's
//! converter (`convert_hf_to_gguf.py`) writes for them, taken from each model's Hugging Face
//! `config.json`.

use std::fmt;
use std::str::FromStr;

/// A GGUF architecture, as `general.architecture` names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Arch {
    /// `qwen3moe`: per-head q/k RMS norms, no biases.
    Qwen3Moe,
    /// `qwen2moe`: q/k/v biases, a shared expert scaled by a sigmoid gate.
    Qwen2Moe,
    /// `olmoe`: q/k RMS norms over all heads together.
    Olmoe,
    /// `llama` with experts (Mixtral).
    Llama,
    /// `qwen35moe` (Qwen3.5 / Qwen3.6 MoE): Gated DeltaNet layers between gated full-attention layers
    /// (see [`Hybrid`]), per-head q/k RMS norms, routed experts plus a sigmoid-gated shared expert.
    Qwen35Moe,
    /// `gpt-oss`: attention sinks, a sliding window on every other layer, biases on every projection,
    /// the router and the experts, a softmax over the chosen experts' logits, a clamped SwiGLU.
    GptOss,
    /// `deepseek2` (DeepSeek-V2): multi-head latent attention (see [`Latent`]), dense first layers,
    /// routed experts plus ungated shared ones.
    DeepSeek2,
    /// `glm4moe` (GLM-4.5 / 4.6 / 4.7): partial RoPE, q/k/v biases, optional per-head q/k norms, dense
    /// first layers, sigmoid expert scores with a choosing bias, an ungated shared expert, and MTP
    /// (`nextn`) layers after the main ones (see [`Glm`]).
    Glm4Moe,
    /// `minimax-m2` (MiniMax-M2): partial RoPE, q/k RMS norms over all heads together, sigmoid expert
    /// scores with a choosing bias, renormalised; no shared expert, no dense layer.
    MiniMaxM2,
    /// `llama4` (Llama 4 Scout / Maverick, the text model): MoE layers every `moe_every`-th with a shared
    /// expert, weightless q/k norms, RoPE frequency scaling as a `rope_freqs` tensor (see [`Llama4`]).
    Llama4,
    /// `deepseek4` (DeepSeek-V4): hyper-connection streams, q-LoRA attention with one key-value head,
    /// compressed entries with the lightning indexer, sqrt-softplus routing (see [`V4`]).
    DeepSeek4,
}

impl Arch {
    pub fn gguf_name(self) -> &'static str {
        match self {
            Arch::Qwen3Moe => "qwen3moe",
            Arch::Qwen2Moe => "qwen2moe",
            Arch::Olmoe => "olmoe",
            Arch::Llama => "llama",
            Arch::Qwen35Moe => "qwen35moe",
            Arch::GptOss => "gpt-oss",
            Arch::DeepSeek2 => "deepseek2",
            Arch::Glm4Moe => "glm4moe",
            Arch::MiniMaxM2 => "minimax-m2",
            Arch::Llama4 => "llama4",
            Arch::DeepSeek4 => "deepseek4",
        }
    }
}

/// Which vocabulary the file carries (shape and special tokens of the real model's tokenizer).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum VocabKind {
    /// Byte-level BPE, pre-tokenizer "qwen2", ChatML control tokens at 151643..=151645.
    Qwen2,
    /// Byte-level BPE (GPT-NeoX style), pre-tokenizer "olmo", `<|endoftext|>` at 50279.
    Olmo,
    /// SentencePiece (`tokenizer.ggml.model = "llama"`): `<unk>`, `<s>`, `</s>`, 256 byte tokens.
    Llama,
    /// Qwen3.5's byte-level BPE, pre-tokenizer "qwen35", ChatML control tokens at 248044..=248046.
    Qwen35,
    /// o200k_harmony (gpt-oss): byte-level BPE, pre-tokenizer "gpt-4o", the harmony control tokens from
    /// 199998 and reserved ones up to the vocabulary's end.
    Harmony,
    /// DeepSeek-V2's byte-level BPE, pre-tokenizer "deepseek-llm", BOS and EOS at 100000 and 100001.
    DeepSeek,
    /// GLM-4.5's byte-level BPE, pre-tokenizer "glm4", control tokens from `<|endoftext|>` at 151329
    /// (`[gMASK]`, BOS, at 151331; `<|user|>` at 151336).
    Glm,
    /// MiniMax-M2's byte-level BPE, pre-tokenizer "minimax-m2", its added tokens from 200000: `]~b]`
    /// (a turn's start) at 200019, `[e~[` (EOS) at 200020, `]~!b[` (BOS) at 200034.
    MiniMax,
    /// Llama 4's byte-level BPE, pre-tokenizer "llama4", control tokens from `<|begin_of_text|>` (BOS) at
    /// 200000 (`<|eot|>` at 200008).
    Llama4,
}

/// YaRN's extension of RoPE, as the converter writes it from the config's `rope_scaling`
/// (`rope.scaling.*`; beta_fast 32 and beta_slow 1 in both models that use it here).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Yarn {
    pub factor: f32,
    /// `original_max_position_embeddings`.
    pub orig_ctx: usize,
    /// DeepSeek's `mscale_all_dim`, written as `yarn_log_multiplier` = 0.1 × it (the converter's legacy
    /// factor, which llama.cpp divides out again).
    pub mscale_all_dim: Option<f32>,
}

/// Multi-head latent attention's dimensions (DeepSeek-V2 without q-LoRA): keys and values come from one
/// compressed latent vector per position, decompressed per head by `attn_k_b` / `attn_v_b`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Latent {
    /// `kv_lora_rank`: the latent vector's size.
    pub kv_lora: usize,
    /// `qk_nope_head_dim`: the part of a query/key head without RoPE.
    pub nope: usize,
    /// `qk_rope_head_dim`: the rotated part, one key part shared by all heads.
    pub rope: usize,
    /// `v_head_dim`.
    pub v_dim: usize,
}

/// What GLM-4.5 adds to a plain attention MoE (`glm4moe`) besides its partial RoPE
/// ([`Preset::rope_dims`]), as the converter writes it from the config.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Glm {
    /// Per-head q/k RMS norms (`use_qk_norm`: GLM-4.5 has them, GLM-4.5-Air not).
    pub qk_norm: bool,
    /// MTP blocks after the main ones (`num_nextn_predict_layers`), counted in `block_count`, each a
    /// whole MoE block plus `nextn.{eh_proj,enorm,hnorm,shared_head_norm}`.
    pub nextn_layers: usize,
}

/// What Llama 4 adds to a plain attention MoE (`llama4`), as the converter writes it from the config.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Llama4 {
    /// `interleave_moe_layer_step`: every `moe_every`-th layer has experts, the others a dense
    /// feed-forward of `n_ff` (`intermediate_size_mlp`). Scout 1, Maverick 2.
    pub moe_every: usize,
    /// The llama3 `rope_scaling` the converter turns into `rope_freqs`: factor, low and high frequency
    /// factors, original context.
    pub rope_factor: f32,
    pub low_freq_factor: f32,
    pub high_freq_factor: f32,
    pub rope_orig_ctx: usize,
}

impl Llama4 {
    /// The `rope_freqs` tensor, as the converter computes it: per pair, 1 for wavelengths under the
    /// original context / high factor, `rope_factor` above the original context / low factor, and the
    /// smooth blend between (empty where low = high, as Scout's).
    pub fn rope_freqs(&self, head_dim: usize, base: f32) -> Vec<f32> {
        let (low_wl, high_wl) = (
            self.rope_orig_ctx as f64 / self.low_freq_factor as f64,
            self.rope_orig_ctx as f64 / self.high_freq_factor as f64,
        );
        (0..head_dim / 2)
            .map(|i| {
                let freq = 1.0 / (base as f64).powf((2 * i) as f64 / head_dim as f64);
                let wavelen = 2.0 * std::f64::consts::PI / freq;
                if wavelen < high_wl {
                    1.0
                } else if wavelen > low_wl {
                    self.rope_factor
                } else {
                    let smooth = (self.rope_orig_ctx as f64 / wavelen - self.low_freq_factor as f64)
                        / (self.high_freq_factor - self.low_freq_factor) as f64;
                    (1.0 / ((1.0 - smooth) / self.rope_factor as f64 + smooth)) as f32
                }
            })
            .collect()
    }
}

/// What DeepSeek-V4 adds (`deepseek4`, docs/deepseek4.md), as the converter writes it from the config.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct V4 {
    pub q_lora: usize,
    /// Hyper-connection streams and Sinkhorn iterations (`hc_mult`, `hc_sinkhorn_iters`).
    pub hc: usize,
    pub sinkhorn_iters: usize,
    /// `o_groups`, `o_lora_rank`.
    pub out_groups: usize,
    pub out_rank: usize,
    /// The lightning indexer: heads, head size, entries kept.
    pub idx_heads: usize,
    pub idx_dim: usize,
    pub idx_top_k: usize,
    /// The first layers route by the token-to-expert table (`num_hash_layers`).
    pub hash_layers: usize,
    /// The compressed layers' RoPE base (`compress_rope_theta`).
    pub compress_base: f32,
    /// `swiglu_limit`, for the experts and the shared expert.
    pub clamp: f32,
    /// Each layer's compression ratio (0, 4 or 128; `compress_ratios`), at least one per layer.
    pub ratios: &'static [usize],
}

/// transformers' default schedule for DeepseekV4Config's 43 layers: two of 128, then 128 and 4 alternating.
const V4_FLASH_RATIOS: [usize; 43] = {
    let mut r = [128; 43];
    let mut i = 3;
    while i < 43 {
        r[i] = 4;
        i += 2;
    }
    r
};

impl V4 {
    /// Layer `i`'s compression ratio.
    pub fn ratio(&self, i: usize) -> usize {
        self.ratios[i]
    }

    /// Width of a compressor's inputs for entries of `dim` at ratio `ratio` (twice at 4: overlapping windows).
    pub fn width(ratio: usize, dim: usize) -> usize {
        if ratio == 4 {
            2 * dim
        } else {
            dim
        }
    }
}

/// The linear-attention side of a Gated DeltaNet hybrid (`qwen35moe`), as the converter writes it from
/// the config: `ssm.*`, the layer pattern, and the full-attention layers' partial, multi-section RoPE.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Hybrid {
    /// Every n-th layer is full attention, the others linear (`full_attention_interval`; the converter
    /// also writes the pattern as `attention.recurrent_layers`).
    pub full_attention_interval: usize,
    /// Taps of the causal convolution (`linear_conv_kernel_dim`).
    pub conv_kernel: usize,
    /// Key heads (`linear_num_key_heads`, `ssm.group_count`).
    pub n_k_heads: usize,
    /// Value heads (`linear_num_value_heads`, `ssm.time_step_rank`).
    pub n_v_heads: usize,
    /// Size of each key and value head (`linear_key_head_dim` = `linear_value_head_dim`, `ssm.state_size`).
    pub head_dim: usize,
    /// Rotated dimensions of a full-attention head: `partial_rotary_factor` × `head_dim`.
    pub rope_dims: usize,
    /// `mrope_section`, padded to four as the converter pads it.
    pub rope_sections: [u32; 4],
}

impl Hybrid {
    pub fn key_dim(&self) -> usize {
        self.n_k_heads * self.head_dim
    }

    pub fn value_dim(&self) -> usize {
        self.n_v_heads * self.head_dim
    }

    /// Channels of the convolution: queries, keys and values together (`attn_qkv`'s rows).
    pub fn conv_dim(&self) -> usize {
        2 * self.key_dim() + self.value_dim()
    }

    /// Whether layer `i` is a linear-attention (recurrent) layer: llama.cpp's and the config's
    /// `(i + 1) % full_attention_interval != 0`.
    pub fn is_recurrent(&self, i: usize) -> bool {
        !(i + 1).is_multiple_of(self.full_attention_interval)
    }
}

/// A model's shape. `presets()` lists the real ones; tests build smaller ones from them.
#[derive(Clone, Debug, PartialEq)]
pub struct Preset {
    pub name: &'static str,
    /// The Hugging Face model it imitates.
    pub source: &'static str,
    pub arch: Arch,
    pub vocab: VocabKind,
    pub n_vocab: usize,
    pub n_ctx: usize,
    pub n_embd: usize,
    pub n_layer: usize,
    pub n_head: usize,
    pub n_head_kv: usize,
    pub head_dim: usize,
    /// Written as `attention.key_length` / `value_length` (only when the config has `head_dim`).
    pub write_head_dim: bool,
    /// `feed_forward_length` (the config's `intermediate_size`); 0 where the config has none, and then
    /// the key is not written (Qwen3.5 MoE).
    pub n_ff: usize,
    /// Each routed expert's feed-forward size.
    pub expert_ff: usize,
    /// Written as `expert_feed_forward_length` (Qwen-MoE converters; OLMoE and Mixtral use `n_ff`).
    pub write_expert_ff: bool,
    /// Shared-expert feed-forward size (Qwen2-MoE, Qwen3.5 MoE), 0 if none.
    pub shared_ff: usize,
    pub n_expert: usize,
    pub n_expert_used: usize,
    pub rope_base: f32,
    pub rms_eps: f32,
    /// The linear-attention layers of a hybrid; `None` for the all-attention architectures.
    pub hybrid: Option<Hybrid>,
    /// Leading layers with a dense feed-forward of `n_ff` instead of experts (`first_k_dense_replace`).
    pub dense_lead: usize,
    /// `expert_weights_scale` (DeepSeek's `routed_scaling_factor`), written when the converter writes it.
    pub expert_weights_scale: Option<f32>,
    pub yarn: Option<Yarn>,
    /// The sliding window of every other layer (layers 0, 2, …), 0 for none.
    pub sliding_window: usize,
    /// Latent attention (DeepSeek-V2); `head_dim` is then a query head's size, `nope + rope`.
    pub latent: Option<Latent>,
    /// Rotated dimensions of a head where RoPE covers part of it, written as `rope.dimension_count`
    /// (GLM's `partial_rotary_factor` × `head_dim`, MiniMax-M2's `rotary_dim`); `None` rotates the whole
    /// head (a hybrid's are in [`Hybrid`]).
    pub rope_dims: Option<usize>,
    /// GLM-4.5's q/k norms and MTP layers; `None` for the other architectures.
    pub glm: Option<Glm>,
    /// Llama 4's interleaving and RoPE scaling; `None` for the other architectures.
    pub llama4: Option<Llama4>,
    /// DeepSeek-V4's streams, compressed attention and routing; `None` for the other architectures.
    pub v4: Option<V4>,
}

impl Preset {
    pub fn q_dim(&self) -> usize {
        self.n_head * self.head_dim
    }

    pub fn kv_dim(&self) -> usize {
        self.n_head_kv * self.head_dim
    }

    /// Columns of the attention's output projection: every head's value.
    pub fn o_dim(&self) -> usize {
        self.latent.map_or(self.q_dim(), |m| self.n_head * m.v_dim)
    }
}

impl fmt::Display for Preset {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} ({}, {}): {} layers, hidden {}, {}/{} heads of {}, {} experts top-{} of ffn {}",
            self.name,
            self.source,
            self.arch.gguf_name(),
            self.n_layer,
            self.n_embd,
            self.n_head,
            self.n_head_kv,
            self.head_dim,
            self.n_expert,
            self.n_expert_used,
            self.expert_ff
        )?;
        if let Some(h) = &self.hybrid {
            write!(
                f,
                ", every {}th layer full attention, the others Gated DeltaNet of {}/{} heads of {}",
                h.full_attention_interval, h.n_k_heads, h.n_v_heads, h.head_dim
            )?;
        }
        if let Some(m) = &self.latent {
            write!(
                f,
                " (latent attention: kv_lora {}, nope {} + rope {}, v {})",
                m.kv_lora, m.nope, m.rope, m.v_dim
            )?;
        }
        if self.dense_lead > 0 {
            write!(f, ", first {} dense of ffn {}", self.dense_lead, self.n_ff)?;
        }
        if self.shared_ff > 0 {
            write!(f, " + shared expert of ffn {}", self.shared_ff)?;
        }
        if self.sliding_window > 0 {
            write!(f, ", sliding window {} on alternate layers", self.sliding_window)?;
        }
        write!(f, ", vocab {}", self.n_vocab)
    }
}

static PRESETS: [Preset; 12] = [
    Preset {
        name: "olmoe-1b-7b",
        source: "allenai/OLMoE-1B-7B-0924",
        arch: Arch::Olmoe,
        vocab: VocabKind::Olmo,
        n_vocab: 50304,
        n_ctx: 4096,
        n_embd: 2048,
        n_layer: 16,
        n_head: 16,
        n_head_kv: 16,
        head_dim: 128,
        write_head_dim: false,
        n_ff: 1024,
        expert_ff: 1024,
        write_expert_ff: false,
        shared_ff: 0,
        n_expert: 64,
        n_expert_used: 8,
        rope_base: 10000.0,
        rms_eps: 1e-5,
        hybrid: None,
        dense_lead: 0,
        expert_weights_scale: None,
        yarn: None,
        sliding_window: 0,
        rope_dims: None,
        glm: None,
        llama4: None,
        v4: None,
        latent: None,
    },
    Preset {
        name: "qwen3-30b-a3b",
        source: "Qwen/Qwen3-30B-A3B",
        arch: Arch::Qwen3Moe,
        vocab: VocabKind::Qwen2,
        n_vocab: 151936,
        n_ctx: 40960,
        n_embd: 2048,
        n_layer: 48,
        n_head: 32,
        n_head_kv: 4,
        head_dim: 128,
        write_head_dim: true,
        n_ff: 6144,
        expert_ff: 768,
        write_expert_ff: true,
        shared_ff: 0,
        n_expert: 128,
        n_expert_used: 8,
        rope_base: 1_000_000.0,
        rms_eps: 1e-6,
        hybrid: None,
        dense_lead: 0,
        expert_weights_scale: None,
        yarn: None,
        sliding_window: 0,
        rope_dims: None,
        glm: None,
        llama4: None,
        v4: None,
        latent: None,
    },
    Preset {
        name: "qwen1.5-moe-a2.7b",
        source: "Qwen/Qwen1.5-MoE-A2.7B",
        arch: Arch::Qwen2Moe,
        vocab: VocabKind::Qwen2,
        n_vocab: 151936,
        n_ctx: 8192,
        n_embd: 2048,
        n_layer: 24,
        n_head: 16,
        n_head_kv: 16,
        head_dim: 128,
        write_head_dim: false,
        n_ff: 5632,
        expert_ff: 1408,
        write_expert_ff: true,
        shared_ff: 5632,
        n_expert: 60,
        n_expert_used: 4,
        rope_base: 1_000_000.0,
        rms_eps: 1e-6,
        hybrid: None,
        dense_lead: 0,
        expert_weights_scale: None,
        yarn: None,
        sliding_window: 0,
        rope_dims: None,
        glm: None,
        llama4: None,
        v4: None,
        latent: None,
    },
    Preset {
        name: "mixtral-8x7b",
        source: "mistralai/Mixtral-8x7B-v0.1",
        arch: Arch::Llama,
        vocab: VocabKind::Llama,
        n_vocab: 32000,
        n_ctx: 32768,
        n_embd: 4096,
        n_layer: 32,
        n_head: 32,
        n_head_kv: 8,
        head_dim: 128,
        write_head_dim: false,
        n_ff: 14336,
        expert_ff: 14336,
        write_expert_ff: false,
        shared_ff: 0,
        n_expert: 8,
        n_expert_used: 2,
        rope_base: 1_000_000.0,
        rms_eps: 1e-5,
        hybrid: None,
        dense_lead: 0,
        expert_weights_scale: None,
        yarn: None,
        sliding_window: 0,
        rope_dims: None,
        glm: None,
        llama4: None,
        v4: None,
        latent: None,
    },
    // Qwen3.6-35B-A3B has Qwen3.5-35B-A3B's text architecture (`qwen3_5_moe_text`), so one shape serves
    // both. From the config: 40 layers in a 3 linear : 1 full pattern; full attention 16 heads / 2 KV of
    // 256, output-gated, rotary over 25% (64 dims) in sections [11, 11, 10], theta 1e7; Gated DeltaNet
    // 16 key / 32 value heads of 128, 4 taps; 256 experts top-8 of 512 plus a shared expert of 512;
    // no `intermediate_size`. The config's MTP block is not written (the converter's `--no-mtp`, as the
    // published GGUFs are): TITAN and llama.cpp's main pass do not use it.
    Preset {
        name: "qwen3.6-35b-a3b",
        source: "Qwen/Qwen3.6-35B-A3B",
        arch: Arch::Qwen35Moe,
        vocab: VocabKind::Qwen35,
        n_vocab: 248320,
        n_ctx: 262144,
        n_embd: 2048,
        n_layer: 40,
        n_head: 16,
        n_head_kv: 2,
        head_dim: 256,
        write_head_dim: true,
        n_ff: 0,
        expert_ff: 512,
        write_expert_ff: true,
        shared_ff: 512,
        n_expert: 256,
        n_expert_used: 8,
        rope_base: 10_000_000.0,
        rms_eps: 1e-6,
        hybrid: Some(Hybrid {
            full_attention_interval: 4,
            conv_kernel: 4,
            n_k_heads: 16,
            n_v_heads: 32,
            head_dim: 128,
            rope_dims: 64,
            rope_sections: [11, 11, 10, 0],
        }),
        dense_lead: 0,
        expert_weights_scale: None,
        yarn: None,
        sliding_window: 0,
        rope_dims: None,
        glm: None,
        llama4: None,
        v4: None,
        latent: None,
    },
    // The same architecture, wider: 48 layers, hidden 3072, 32 heads / 2 KV of 256, Gated DeltaNet
    // 16 key / 64 value heads of 128, 256 experts top-8 of 1024 plus a shared expert of 1024.
    Preset {
        name: "qwen3.5-122b-a10b",
        source: "Qwen/Qwen3.5-122B-A10B",
        arch: Arch::Qwen35Moe,
        vocab: VocabKind::Qwen35,
        n_vocab: 248320,
        n_ctx: 262144,
        n_embd: 3072,
        n_layer: 48,
        n_head: 32,
        n_head_kv: 2,
        head_dim: 256,
        write_head_dim: true,
        n_ff: 0,
        expert_ff: 1024,
        write_expert_ff: true,
        shared_ff: 1024,
        n_expert: 256,
        n_expert_used: 8,
        rope_base: 10_000_000.0,
        rms_eps: 1e-6,
        hybrid: Some(Hybrid {
            full_attention_interval: 4,
            conv_kernel: 4,
            n_k_heads: 16,
            n_v_heads: 64,
            head_dim: 128,
            rope_dims: 64,
            rope_sections: [11, 11, 10, 0],
        }),
        dense_lead: 0,
        expert_weights_scale: None,
        yarn: None,
        sliding_window: 0,
        rope_dims: None,
        glm: None,
        llama4: None,
        v4: None,
        latent: None,
    },
    // gpt-oss-20b, from its config: 24 layers, hidden 2880, 64 query / 8 KV heads of 64 (so the query is
    // 4096 wide, wider than the hidden size), sliding window 128 on layers 0, 2, …, YaRN factor 32 over
    // 4096 (context 131072), theta 150000; 32 experts top-4 of 2880 (`intermediate_size`, which the
    // converter writes as both feed-forward lengths); o200k_harmony padded to 201088.
    Preset {
        name: "gpt-oss-20b",
        source: "openai/gpt-oss-20b",
        arch: Arch::GptOss,
        vocab: VocabKind::Harmony,
        n_vocab: 201088,
        n_ctx: 131072,
        n_embd: 2880,
        n_layer: 24,
        n_head: 64,
        n_head_kv: 8,
        head_dim: 64,
        write_head_dim: true,
        n_ff: 2880,
        expert_ff: 2880,
        write_expert_ff: true,
        shared_ff: 0,
        n_expert: 32,
        n_expert_used: 4,
        rope_base: 150_000.0,
        rms_eps: 1e-5,
        hybrid: None,
        dense_lead: 0,
        expert_weights_scale: None,
        yarn: Some(Yarn {
            factor: 32.0,
            orig_ctx: 4096,
            mscale_all_dim: None,
        }),
        sliding_window: 128,
        rope_dims: None,
        glm: None,
        llama4: None,
        v4: None,
        latent: None,
    },
    // DeepSeek-V2-Lite, from its config: 27 layers, hidden 2048, 16 heads, no q-LoRA, kv_lora_rank 512,
    // qk_nope 128 + qk_rope 64 (query heads of 192), v_head 128; layer 0 dense with ffn 10944, then 64
    // routed experts top-6 of 1408 (softmax scores, greedy, not renormalised, routed scale 1.0) and 2
    // shared experts; YaRN factor 40 over 4096 (context 163840) with mscale_all_dim 0.707, theta 10000.
    // The converter writes MLA as one KV head (`head_count_kv` 1).
    Preset {
        name: "deepseek-v2-lite",
        source: "deepseek-ai/DeepSeek-V2-Lite",
        arch: Arch::DeepSeek2,
        vocab: VocabKind::DeepSeek,
        n_vocab: 102400,
        n_ctx: 163840,
        n_embd: 2048,
        n_layer: 27,
        n_head: 16,
        n_head_kv: 1,
        head_dim: 192,
        write_head_dim: false,
        n_ff: 10944,
        expert_ff: 1408,
        write_expert_ff: true,
        shared_ff: 2 * 1408,
        n_expert: 64,
        n_expert_used: 6,
        rope_base: 10_000.0,
        rms_eps: 1e-6,
        hybrid: None,
        dense_lead: 1,
        expert_weights_scale: Some(1.0),
        yarn: Some(Yarn {
            factor: 40.0,
            orig_ctx: 4096,
            mscale_all_dim: Some(0.707),
        }),
        sliding_window: 0,
        rope_dims: None,
        glm: None,
        llama4: None,
        v4: None,
        latent: Some(Latent {
            kv_lora: 512,
            nope: 128,
            rope: 64,
            v_dim: 128,
        }),
    },
    // GLM-4.5-Air, from its config: 46 layers, hidden 4096, 96 query / 8 KV heads of 128 (the query
    // 12288 wide), rotary over half of each head (64 dims), theta 1e6, q/k/v biases, no q/k norms;
    // layer 0 dense with ffn 10944, then 128 routed experts top-8 of 1408 (sigmoid scores with the
    // choosing bias, one group, renormalised, routed scale 1.0) and 1 shared expert of 1408; one MTP
    // layer (block 46, counted in block_count: 47); vocabulary 151552; context 131072.
    Preset {
        name: "glm-4.5-air",
        source: "zai-org/GLM-4.5-Air",
        arch: Arch::Glm4Moe,
        vocab: VocabKind::Glm,
        n_vocab: 151552,
        n_ctx: 131072,
        n_embd: 4096,
        n_layer: 46,
        n_head: 96,
        n_head_kv: 8,
        head_dim: 128,
        write_head_dim: true,
        n_ff: 10944,
        expert_ff: 1408,
        write_expert_ff: true,
        shared_ff: 1408,
        n_expert: 128,
        n_expert_used: 8,
        rope_base: 1_000_000.0,
        rms_eps: 1e-5,
        hybrid: None,
        dense_lead: 1,
        expert_weights_scale: Some(1.0),
        yarn: None,
        sliding_window: 0,
        rope_dims: Some(64),
        glm: Some(Glm {
            qk_norm: false,
            nextn_layers: 1,
        }),
        llama4: None,
        v4: None,
        latent: None,
    },
    // Llama-4-Scout-17B-16E, from its text config: 48 layers, hidden 5120, 40 query / 8 KV heads of 128,
    // every layer MoE (interleave_moe_layer_step 1): 16 experts top-1 of intermediate_size 8192 and a
    // shared expert of the same size; intermediate_size_mlp 16384 (feed_forward_length, unused with every
    // layer MoE); RoPE theta 500000 with llama3 scaling (factor 16, low = high freq factor 1, original
    // context 8192); q/k norms (use_qk_norm); chunked attention of 8192 on three layers of four and
    // NoPE on the fourth (llama.cpp's constants, no keys); vocabulary 202048; context 10485760.
    Preset {
        name: "llama-4-scout",
        source: "meta-llama/Llama-4-Scout-17B-16E",
        arch: Arch::Llama4,
        vocab: VocabKind::Llama4,
        n_vocab: 202048,
        n_ctx: 10_485_760,
        n_embd: 5120,
        n_layer: 48,
        n_head: 40,
        n_head_kv: 8,
        head_dim: 128,
        write_head_dim: true,
        n_ff: 16384,
        expert_ff: 8192,
        write_expert_ff: true,
        shared_ff: 8192,
        n_expert: 16,
        n_expert_used: 1,
        rope_base: 500_000.0,
        rms_eps: 1e-5,
        hybrid: None,
        dense_lead: 0,
        expert_weights_scale: None,
        yarn: None,
        sliding_window: 0,
        rope_dims: None,
        glm: None,
        llama4: Some(Llama4 {
            moe_every: 1,
            rope_factor: 16.0,
            low_freq_factor: 1.0,
            high_freq_factor: 1.0,
            rope_orig_ctx: 8192,
        }),
        v4: None,
        latent: None,
    },
    // MiniMax-M2, from its config: 62 layers, hidden 3072, 48 query / 8 KV heads of 128 (the query 6144
    // wide), RoPE on 64 of 128 dims (rotary_dim), theta 5e6, q/k norms over all heads (use_qk_norm,
    // qk_norm_type per_layer), no biases; every layer 256 experts top-8 of 1536 (sigmoid scores with the
    // choosing bias, renormalised), no shared expert (shared_intermediate_size 0); vocabulary 200064;
    // context 196608. Its config has num_mtp_modules 3, but the checkpoints hold no MTP weights and the
    // converter writes none.
    Preset {
        name: "minimax-m2",
        source: "MiniMaxAI/MiniMax-M2",
        arch: Arch::MiniMaxM2,
        vocab: VocabKind::MiniMax,
        n_vocab: 200064,
        n_ctx: 196608,
        n_embd: 3072,
        n_layer: 62,
        n_head: 48,
        n_head_kv: 8,
        head_dim: 128,
        write_head_dim: true,
        // The converter writes intermediate_size as both lengths.
        n_ff: 1536,
        expert_ff: 1536,
        write_expert_ff: true,
        shared_ff: 0,
        n_expert: 256,
        n_expert_used: 8,
        rope_base: 5_000_000.0,
        rms_eps: 1e-6,
        hybrid: None,
        dense_lead: 0,
        expert_weights_scale: None,
        yarn: None,
        sliding_window: 0,
        rope_dims: Some(64),
        glm: None,
        llama4: None,
        v4: None,
        latent: None,
    },
    // DeepSeek-V4-Flash, from transformers 5.12's DeepseekV4Config defaults (its checkpoint): 43 layers, hidden
    // 4096, 64 query heads of 512 and one key-value head (RoPE on the last 64 dims), q-LoRA 1024, 8 output
    // groups of rank 1024, a sliding window of 128, compressed layers by the class's default schedule (two of
    // 128, then 4 and 128 alternating; the checkpoint's own list may differ) with YaRN (factor 16, original
    // context 65536, compress base 160000), the lightning indexer of 64 heads of 128 keeping 512 entries; 4
    // hyper-connection streams, 20 Sinkhorn iterations; 256 routed experts top-6 of 2048 (sqrt-softplus scores
    // with the choosing bias, renormalised, routed scale 1.5; the first 3 layers by the token table) and one
    // shared expert of 2048, SwiGLU clamp 10; vocabulary 129280 (written with DeepSeek-V2's vocabulary layout);
    // context 1048576. Its MTP layer is left out, as the converter leaves it out.
    Preset {
        name: "deepseek-v4-flash",
        source: "deepseek-ai/DeepSeek-V4-Flash-Base",
        arch: Arch::DeepSeek4,
        vocab: VocabKind::DeepSeek,
        n_vocab: 129280,
        n_ctx: 1_048_576,
        n_embd: 4096,
        n_layer: 43,
        n_head: 64,
        n_head_kv: 1,
        head_dim: 512,
        write_head_dim: true,
        n_ff: 0,
        expert_ff: 2048,
        write_expert_ff: true,
        shared_ff: 2048,
        n_expert: 256,
        n_expert_used: 6,
        rope_base: 10000.0,
        rms_eps: 1e-6,
        hybrid: None,
        dense_lead: 0,
        expert_weights_scale: Some(1.5),
        yarn: Some(Yarn {
            factor: 16.0,
            orig_ctx: 65536,
            mscale_all_dim: None,
        }),
        sliding_window: 128,
        rope_dims: Some(64),
        glm: None,
        llama4: None,
        v4: Some(V4 {
            q_lora: 1024,
            hc: 4,
            sinkhorn_iters: 20,
            out_groups: 8,
            out_rank: 1024,
            idx_heads: 64,
            idx_dim: 128,
            idx_top_k: 512,
            hash_layers: 3,
            compress_base: 160000.0,
            clamp: 10.0,
            ratios: &V4_FLASH_RATIOS,
        }),
        latent: None,
    },
];

/// Every preset, with the real model's dimensions.
pub fn presets() -> &'static [Preset] {
    &PRESETS
}

/// The preset called `name`.
pub fn preset(name: &str) -> Option<&'static Preset> {
    PRESETS.iter().find(|p| p.name == name)
}

/// The GGUF weight encoding of the whole file, named as llama-quantize names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[allow(non_camel_case_types)]
pub enum FileType {
    F16,
    Q8_0,
    Q6_K,
    Q4_0,
    /// llama.cpp's Q4_K_M mix: Q4_K, with Q6_K for the output, and for attn_v and ffn_down in the
    /// layers `use_more_bits` picks.
    Q4_K_M,
    /// What the converter writes from a checkpoint whose experts are MXFP4 (gpt-oss): the experts kept
    /// in MXFP4, the other matrices F16 (`general.file_type` MOSTLY_MXFP4_MOE, as the converter marks it).
    Mxfp4,
    /// llama-quantize's MXFP4_MOE: the expert-stacked (3-D) tensors MXFP4, every other matrix, the
    /// embedding and the output included, Q8_0.
    Mxfp4_Moe,
}

impl FileType {
    pub const ALL: [FileType; 7] = [
        FileType::F16,
        FileType::Q8_0,
        FileType::Q6_K,
        FileType::Q4_0,
        FileType::Q4_K_M,
        FileType::Mxfp4,
        FileType::Mxfp4_Moe,
    ];

    pub fn name(self) -> &'static str {
        match self {
            FileType::F16 => "f16",
            FileType::Q8_0 => "q8_0",
            FileType::Q6_K => "q6_k",
            FileType::Q4_0 => "q4_0",
            FileType::Q4_K_M => "q4_k_m",
            FileType::Mxfp4 => "mxfp4",
            FileType::Mxfp4_Moe => "mxfp4_moe",
        }
    }

    /// `general.file_type` (llama.cpp's `llama_ftype`).
    pub fn llama_ftype(self) -> u32 {
        match self {
            FileType::F16 => 1,
            FileType::Q4_0 => 2,
            FileType::Q8_0 => 7,
            FileType::Q4_K_M => 15,
            FileType::Q6_K => 18,
            FileType::Mxfp4 | FileType::Mxfp4_Moe => 38,
        }
    }
}

impl fmt::Display for FileType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for FileType {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let lower = s.to_ascii_lowercase();
        FileType::ALL.into_iter().find(|t| t.name() == lower).ok_or_else(|| {
            let names: Vec<_> = FileType::ALL.iter().map(|t| t.name()).collect();
            format!("unknown type {s:?}: use one of {}", names.join(", "))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `rope_freqs` as the converter writes it: the llama4 fixture's tensor (head 32, original context 64:
    /// 3 fast pairs, 13 slow), and Scout's (head 128, original context 8192: 35 fast pairs, 29 slow, by the
    /// converter's formula run in Python).
    #[test]
    fn llama4_rope_freqs_are_the_converters() {
        let mut l = Llama4 {
            moe_every: 2,
            rope_factor: 16.0,
            low_freq_factor: 1.0,
            high_freq_factor: 1.0,
            rope_orig_ctx: 64,
        };
        let step = |fast: usize, slow: usize| [vec![1.0; fast], vec![16.0; slow]].concat();
        assert_eq!(l.rope_freqs(32, 500_000.0), step(3, 13));
        l.rope_orig_ctx = 8192;
        assert_eq!(l.rope_freqs(128, 500_000.0), step(35, 29));
    }

    /// The hybrids' numbers agree with each other as the real configs' do: M-RoPE sections cover the
    /// rotated half of a head, the value heads tile the key heads, the layer count is whole blocks of the
    /// pattern.
    #[test]
    fn hybrid_presets_are_consistent() {
        for p in presets().iter().filter(|p| p.arch == Arch::Qwen35Moe) {
            let h = p.hybrid.expect("qwen35moe presets are hybrids");
            assert_eq!(
                2 * h.rope_sections.iter().sum::<u32>() as usize,
                h.rope_dims,
                "{}",
                p.name
            );
            assert_eq!(h.rope_dims * 4, p.head_dim, "{}: partial_rotary_factor 0.25", p.name);
            assert!(
                h.n_v_heads.is_multiple_of(h.n_k_heads) && p.n_layer.is_multiple_of(h.full_attention_interval),
                "{}",
                p.name
            );
            assert_eq!(
                (0..p.n_layer).filter(|&i| !h.is_recurrent(i)).count(),
                p.n_layer / 4,
                "{}",
                p.name
            );
        }
    }
}
