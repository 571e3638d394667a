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
    /// One weight over all heads together (OLMoE).
    Whole,
}

#[derive(Clone, Debug)]
pub struct Config {
    pub arch: Arch,
    pub arch_name: String,
    pub n_vocab: usize,
    pub n_embd: usize,
    pub n_layer: usize,
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
}

/// How many transformer blocks the file has tensors for: one more than the highest `blk.N.` prefix.
fn blocks_in(f: &GgufFile) -> usize {
    f.tensors.iter().filter_map(|t| t.name.strip_prefix("blk.")?.split_once('.')?.0.parse::<usize>().ok()).map(|n| n + 1).max().unwrap_or(0)
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
        let bad = |what: String| EngineError::Model { path: path.clone(), what };
        let arch_name = f.get_str("general.architecture")?.ok_or_else(|| bad("metadata has no general.architecture".into()))?.to_string();
        let k = |s: &str| format!("{arch_name}.{s}");
        let n_expert = f.get_u64(&k("expert_count"))?.unwrap_or(0) as usize;
        let arch = match arch_name.as_str() {
            "qwen3moe" => Arch::Qwen3Moe,
            "qwen2moe" => Arch::Qwen2Moe,
            "olmoe" => Arch::Olmoe,
            "llama" if n_expert > 0 => Arch::Mixtral,
            "qwen3next" => Arch::Qwen3Next,
            "qwen35moe" => Arch::Qwen35Moe,
            "llama" => return Err(bad("architecture llama without experts (a dense model) is not supported: TITAN runs mixture-of-experts models".into())),
            other => {
                return Err(bad(format!(
                    "unsupported architecture {other:?} (supported: qwen3moe, qwen2moe, olmoe, llama with experts, qwen3next, qwen35moe)"
                )))
            }
        };
        let need = |key: &str| -> Result<usize> { Ok(f.u64_of(&k(key))? as usize) };
        let n_embd = need("embedding_length")?;
        let n_layer = need("block_count")?;
        let blocks = blocks_in(f);
        if n_layer != blocks && (whole || n_layer < blocks) {
            return Err(bad(format!("{} is {n_layer}, but the file holds tensors for {blocks} blocks", k("block_count"))));
        }
        let n_head = need("attention.head_count")?;
        let n_head_kv = f.get_u64(&k("attention.head_count_kv"))?.map(|v| v as usize).unwrap_or(n_head);
        let head_dim = match f.get_u64(&k("attention.key_length"))? {
            Some(v) => v as usize,
            None if n_head > 0 => n_embd / n_head,
            None => 0,
        };
        if let Some(v) = f.get_u64(&k("attention.value_length"))? {
            if v as usize != head_dim {
                return Err(bad(format!("attention.value_length {v} differs from key_length {head_dim}, which is not supported")));
            }
        }
        let n_expert_used = need("expert_used_count")?;
        let expert_ff = match f.get_u64(&k("expert_feed_forward_length"))? {
            Some(v) => v as usize,
            None => need("feed_forward_length")?,
        };
        let shared_ff = f.get_u64(&k("expert_shared_feed_forward_length"))?.unwrap_or(0) as usize;
        let rms_eps = f.get_f64(&k("attention.layer_norm_rms_epsilon"))?.ok_or_else(|| bad(format!("missing {}", k("attention.layer_norm_rms_epsilon"))))? as f32;
        let rope_base = f.get_f64(&k("rope.freq_base"))?.unwrap_or(10000.0) as f32;
        let rope_dims = f.get_u64(&k("rope.dimension_count"))?.map(|v| v as usize).unwrap_or(head_dim);
        // Qwen3.5's multi-section RoPE (`rope.dimension_sections`) gives text tokens the same position in
        // every section, which makes it the plain rotation over `rope.dimension_count` dimensions.
        if let Some(t) = f.get_str(&k("rope.scaling.type"))? {
            if t != "none" && t != "linear" || f.get_f64(&k("rope.scaling.factor"))?.is_some_and(|x| x != 1.0 && x != 0.0) {
                return Err(bad(format!("RoPE scaling {t:?} is not supported yet")));
            }
        }
        let n_ctx_train = f.get_u64(&k("context_length"))?.unwrap_or(4096) as usize;
        let n_vocab = match f.get_array("tokenizer.ggml.tokens")? {
            Some(a) => a.len(),
            None => f.tensor("token_embd.weight").map(|t| t.dims[1] as usize).ok_or_else(|| bad("no vocabulary and no token_embd.weight".into()))?,
        };
        let (rope_style, qk_norm, qkv_bias, default_norm) = match arch {
            Arch::Qwen3Moe => (RopeStyle::Halves, QkNorm::PerHead, false, true),
            Arch::Qwen2Moe => (RopeStyle::Halves, QkNorm::None, true, false),
            Arch::Olmoe => (RopeStyle::Halves, QkNorm::Whole, false, false),
            Arch::Mixtral => (RopeStyle::Adjacent, QkNorm::None, false, true),
            Arch::Qwen3Next | Arch::Qwen35Moe => (RopeStyle::Halves, QkNorm::PerHead, false, true),
        };
        let hybrid = matches!(arch, Arch::Qwen3Next | Arch::Qwen35Moe);
        // llama.cpp always renormalises the hybrids' top-k weights, whatever the metadata says.
        let norm_topk = hybrid || f.get_bool(&k("expert_weights_norm"))?.unwrap_or(default_norm);
        let (mixers, delta_net) = if hybrid { hybrid_layers(f, &k, n_layer, arch == Arch::Qwen35Moe).map_err(bad)? } else { (vec![Mixer::Attention; n_layer], None) };

        for (key, value, ok, range) in [
            ("attention.layer_norm_rms_epsilon", rms_eps, rms_eps > 0.0 && rms_eps < 1.0, "between 0 and 1"),
            ("rope.freq_base", rope_base, rope_base > 1.0, "greater than 1"),
        ] {
            if !(value.is_finite() && ok) {
                return Err(bad(format!("{} is {value}; it must be a finite number {range}", k(key))));
            }
        }
        let c = Config {
            arch, arch_name, n_vocab, n_embd, n_layer, n_head, n_head_kv, head_dim, n_ctx_train, rms_eps, rope_base,
            rope_dims, rope_style, qk_norm, qkv_bias, n_expert, n_expert_used, expert_ff, shared_ff, norm_topk, mixers,
            attn_gate: hybrid, delta_net,
        };
        c.validate().map_err(bad)?;
        Ok(c)
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
        for (name, v) in positive {
            if v == 0 {
                return Err(format!("metadata {name} is 0"));
            }
        }
        if !self.n_head.is_multiple_of(self.n_head_kv) {
            return Err(format!("head_count {} is not a multiple of head_count_kv {}", self.n_head, self.n_head_kv));
        }
        if self.n_expert_used > self.n_expert {
            return Err(format!("expert_used_count {} exceeds expert_count {}", self.n_expert_used, self.n_expert));
        }
        if self.rope_dims > self.head_dim || !self.rope_dims.is_multiple_of(2) {
            return Err(format!("rope.dimension_count {} does not fit head size {}", self.rope_dims, self.head_dim));
        }
        if matches!(self.arch, Arch::Qwen2Moe | Arch::Qwen3Next | Arch::Qwen35Moe) && self.shared_ff == 0 {
            return Err(format!("{} needs expert_shared_feed_forward_length", self.arch_name));
        }
        Ok(())
    }

    pub fn q_dim(&self) -> usize {
        self.n_head * self.head_dim
    }

    pub fn kv_dim(&self) -> usize {
        self.n_head_kv * self.head_dim
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
}

/// The hybrids' layer pattern and linear-attention dimensions. Which layers are linear comes from
/// `attention.recurrent_layers` when the converter wrote it, else from `full_attention_interval` (every
/// n-th layer is full attention), as llama.cpp reads them.
fn hybrid_layers(f: &GgufFile, k: &dyn Fn(&str) -> String, n_layer: usize, tiled: bool) -> std::result::Result<(Vec<Mixer>, Option<DeltaNetShape>), String> {
    let get = |key: &str| -> std::result::Result<usize, String> {
        match f.get_u64(&k(key)) {
            Ok(Some(v)) => Ok(v as usize),
            Ok(None) => Err(format!("missing {}", k(key))),
            Err(e) => Err(e.to_string()),
        }
    };
    let mixers = match f.get_array(&k("attention.recurrent_layers")).map_err(|e| e.to_string())? {
        Some(a) => {
            let flags: Vec<bool> = a.iter().map(|v| v.as_bool()).collect::<Option<_>>().ok_or_else(|| format!("{} is not an array of booleans", k("attention.recurrent_layers")))?;
            if flags.len() < n_layer {
                return Err(format!("{} has {} entries for {n_layer} layers", k("attention.recurrent_layers"), flags.len()));
            }
            flags[..n_layer].iter().map(|&r| if r { Mixer::DeltaNet } else { Mixer::Attention }).collect()
        }
        None => {
            let interval = f.get_u64(&k("full_attention_interval")).map_err(|e| e.to_string())?.unwrap_or(4) as usize;
            if interval == 0 {
                return Err(format!("{} is 0", k("full_attention_interval")));
            }
            (0..n_layer).map(|i| if (i + 1) % interval == 0 { Mixer::Attention } else { Mixer::DeltaNet }).collect()
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
    if shape.conv_kernel == 0 || shape.n_k_heads == 0 || shape.head_dim == 0 || shape.n_v_heads % shape.n_k_heads != 0 {
        return Err(format!("linear attention of {} key heads, {} value heads, head size {} and a {}-tap convolution is not supported", shape.n_k_heads, shape.n_v_heads, shape.head_dim, shape.conv_kernel));
    }
    if inner != shape.value_dim() {
        return Err(format!("{} is {inner}, but {} value heads of {} make {}", k("ssm.inner_size"), shape.n_v_heads, shape.head_dim, shape.value_dim()));
    }
    Ok((mixers, Some(shape)))
}
