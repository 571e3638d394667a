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
}

impl Arch {
    pub fn gguf_name(self) -> &'static str {
        match self {
            Arch::Qwen3Moe => "qwen3moe",
            Arch::Qwen2Moe => "qwen2moe",
            Arch::Olmoe => "olmoe",
            Arch::Llama => "llama",
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
    /// `feed_forward_length` (the config's `intermediate_size`).
    pub n_ff: usize,
    /// Each routed expert's feed-forward size.
    pub expert_ff: usize,
    /// Written as `expert_feed_forward_length` (Qwen-MoE converters; OLMoE and Mixtral use `n_ff`).
    pub write_expert_ff: bool,
    /// Shared-expert feed-forward size (Qwen2-MoE), 0 if none.
    pub shared_ff: usize,
    pub n_expert: usize,
    pub n_expert_used: usize,
    pub rope_base: f32,
    pub rms_eps: f32,
}

impl Preset {
    pub fn q_dim(&self) -> usize {
        self.n_head * self.head_dim
    }

    pub fn kv_dim(&self) -> usize {
        self.n_head_kv * self.head_dim
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
        if self.shared_ff > 0 {
            write!(f, " + shared expert of ffn {}", self.shared_ff)?;
        }
        write!(f, ", vocab {}", self.n_vocab)
    }
}

static PRESETS: [Preset; 4] = [
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
}

impl FileType {
    pub const ALL: [FileType; 5] = [FileType::F16, FileType::Q8_0, FileType::Q6_K, FileType::Q4_0, FileType::Q4_K_M];

    pub fn name(self) -> &'static str {
        match self {
            FileType::F16 => "f16",
            FileType::Q8_0 => "q8_0",
            FileType::Q6_K => "q6_k",
            FileType::Q4_0 => "q4_0",
            FileType::Q4_K_M => "q4_k_m",
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
