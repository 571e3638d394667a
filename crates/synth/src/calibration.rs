//! The weight scales that make a random model route like a trained one.
//!
//! What goes wrong with naive random weights: every token's residual stream drifts toward the same
//! vector (attention averages over the context, uniform 4-bit quants have a -0.5 mean that every row
//! shares), the token's identity is forgotten after a few layers, and every token picks the same few
//! experts. What a trained model does instead: consecutive tokens are related (a topic, a phrase), so
//! they share about a third of their experts, yet over a few hundred tokens most experts get used.
//!
//! How these weights reproduce that:
//!
//! - **Topics.** The vocabulary is split into topics of `topic_size` consecutive token ids. A token's
//!   embedding is `sqrt(topic_share)` of its topic's centre plus the rest its own random direction, and
//!   the LM head's row for a token leans (`head_topic`) on the same centre. The LM head's scale is
//!   solved for so that, at temperature 1, the next token stays in the current topic with probability
//!   `topic_stay` (see [`Calibration::head_logit`]) and otherwise jumps to a random other topic.
//!   Consecutive tokens of one topic have correlated residual streams, hence overlapping experts; a
//!   jump decorrelates them, and the jumps spread a few hundred tokens over most experts.
//! - **The token stays in the residual stream.** Attention (`attn_out`) and expert (`moe_out`)
//!   contributions, summed over all layers, stay below the unit-scale embedding (each layer gets
//!   `1/sqrt(n_layer)` of the budget, so a 48-layer model keeps the token as well as a 16-layer one),
//!   and no common component builds up over the layers.
//! - **Zero-mean weights** (see `blocks`), so no layer adds a direction shared by every row.
//! - **Routers** are plain random matrices of `router` logit scale: with token-specific inputs, each
//!   expert wins for some tokens.
//! - **Linear attention remembers, but not forever** (Gated DeltaNet layers of the hybrids). Each value
//!   head's state decays per token by `exp(-A · softplus(alpha + dt_bias))`: `A = exp(A_log)` is
//!   log-normal over heads around `linear_a`, so some heads keep a long memory and others a short one
//!   (as Mamba-2 spreads its heads' time steps), alpha is about N(0, 1) and dt_bias N(0, 0.5²). The
//!   per-token decay then spreads over (0, 1) instead of sitting at 0 (transformers' initialisation,
//!   A up to 16) or at 1. The layer's output goes through an RMS norm, so it is scaled by `ssm_out`
//!   alone, and it gets the same share of the budget as an attention layer.
//! - **Attention scores keep their spread whatever scales them.** YaRN multiplies cos and sin by its
//!   attention factor (gpt-oss: 1 + 0.1 ln 32), and DeepSeek-V2 multiplies its scores by mscale²; the
//!   query and key projections are divided by the square root of the score's gain, so scores spread
//!   by `attn_score` in every model. Latent attention gets the same: unit-scale queries, keys
//!   decompressed from the normalised latent vector to unit scale, values of unit scale.
//! - **Biases are small next to what they are added to** (gpt-oss): `bias` of the router's logits,
//!   the experts' pre-activations and outputs, the attention's output. A bias is common to every token,
//!   so a large one would be the shared direction the calibration avoids. The attention sinks are
//!   logits of N(0, `sink`²) against scores of spread `attn_score`: a head gives its sink a share
//!   near the start of a sequence and little once there are many positions.
//!
//! Scales are per unit of fan-in (`sigma = gain / sqrt(fan_in)`), so the same gains hold for every
//! preset's dimensions. The defaults were measured with `routing_report` (see the crate's tests and the
//! numbers in the report `synth` prints).

use crate::layout::Role;
use crate::preset::{Arch, Preset};

/// The gains. All are dimensionless; see the module documentation for what each one does.
#[derive(Clone, Debug, PartialEq)]
pub struct Calibration {
    /// Element RMS of the token embeddings (the residual stream's scale).
    pub embd_rms: f32,
    /// Token ids per topic.
    pub topic_size: usize,
    /// Share of an embedding's variance that comes from its topic's centre.
    pub topic_share: f32,
    /// Share of an LM-head row's variance that comes from its token's topic centre.
    pub head_topic: f32,
    /// Probability that a sampled token (temperature 1) continues the current topic.
    pub topic_stay: f32,
    /// Standard deviation of attention scores (q·k / sqrt(head_dim)).
    pub attn_score: f32,
    /// RMS of all layers' attention contributions together (per unit RMS of the mixed values).
    pub attn_out: f32,
    /// Standard deviation of the expert gate/up pre-activations.
    pub ffn_in: f32,
    /// RMS of all layers' MoE contributions together.
    pub moe_out: f32,
    /// Standard deviation of router logits.
    pub router: f32,
    /// Element RMS of the q/k/v biases (Qwen2-MoE).
    pub qkv_bias: f32,
    /// Median over the linear-attention heads of the decay rate A = exp(A_log) (`ssm_a` holds -A).
    pub linear_a: f32,
    /// Standard deviation of A_log over the heads.
    pub linear_a_spread: f32,
    /// RMS of a bias relative to the RMS of what it is added to (gpt-oss's router, expert and attention
    /// output biases).
    pub bias: f32,
    /// Standard deviation of the attention sinks' logits (gpt-oss).
    pub sink: f32,
}

impl Default for Calibration {
    fn default() -> Self {
        Calibration {
            embd_rms: 1.0,
            topic_size: 256,
            topic_share: 0.75,
            head_topic: 0.7,
            topic_stay: 0.75,
            attn_score: 2.0,
            attn_out: 0.5,
            ffn_in: 1.5,
            moe_out: 0.6,
            router: 2.0,
            qkv_bias: 0.3,
            linear_a: 0.2,
            linear_a_spread: 1.0,
            bias: 0.1,
            sink: 1.0,
        }
    }
}

/// How a tensor's values are drawn: `mean + sigma · noise` for vectors (for `ssm_a`, that is A_log, and
/// the tensor holds -exp(A_log) as the converter writes it); zero-mean with `sigma` for matrices
/// (token_embd and output add the topic structure on top).
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct Scale {
    pub mean: f32,
    pub sigma: f32,
}

impl Calibration {
    pub(crate) fn scale(&self, p: &Preset, role: Role) -> Scale {
        let fan = |n: usize| 1.0 / (n as f32).sqrt();
        let e = p.n_embd;
        let has_qk_norm = matches!(
            p.arch,
            Arch::Qwen3Moe | Arch::Olmoe | Arch::Qwen35Moe | Arch::MiniMaxM2 | Arch::Llama4
        ) || p.glm.is_some_and(|g| g.qk_norm);
        // The hybrids gate attention's output by a sigmoid of about 0.5; their attention layers make up
        // for it. Their linear-attention output is silu(z) (z about N(0, 1)) times a normalised vector.
        let attn_gate = if p.hybrid.is_some() { 2.0 } else { 1.0 };
        let silu_rms = glu_rms(1.0, 1.0);
        // Without q/k norms the score's spread is rms(q) · rms(k); with them it is the norms' weights.
        let qk = self.attn_score.sqrt();
        // q and k both shrink by the root of what llama.cpp multiplies their product by.
        let q_or_k = qk / score_gain(p).sqrt();
        let per_layer = fan(p.n_layer) * self.embd_rms;
        let act = act_rms(p, self.ffn_in);
        // One expert's output RMS such that the weighted sum of the chosen ones has the layer's share.
        let expert_out = self.moe_out * per_layer / topk_weight_rms(p, self.router);
        let (mean, sigma) = match role {
            Role::TokenEmbd => (0.0, self.embd_rms),
            Role::Output => (0.0, self.head_logit(p) / e as f32),
            Role::AttnNorm
            | Role::FfnNorm
            | Role::OutputNorm
            | Role::SsmNorm
            | Role::NextnNorm
            | Role::QANorm
            | Role::CompNorm => (1.0, 0.05),
            // DeepSeek-V4: every head and the key-value vector are RMS-normalised, so the projections' scale
            // only sets what the norms see; the output is grouped, then projected as attention's output is.
            Role::QA | Role::V4Kv | Role::CompKv | Role::CompGate | Role::IdxProj => (0.0, fan(e)),
            Role::QB | Role::IdxQB => (0.0, fan(p.v4.map_or(1, |v| v.q_lora))),
            Role::WoA => (0.0, fan(p.q_dim() / p.v4.map_or(1, |v| v.out_groups))),
            Role::WoB => (
                0.0,
                self.attn_out * per_layer * fan(p.v4.map_or(1, |v| v.out_groups * v.out_rank)),
            ),
            Role::Ape => (0.0, 0.5),
            // Mixing numbers of about unit spread around bases of 0: collapse weights near 0.5, outputs
            // placed with weights near 1, and a stream mixer that Sinkhorn makes doubly stochastic.
            Role::HcFn => (0.0, fan(p.v4.map_or(1, |v| v.hc) * e)),
            Role::HcBase => (0.0, 0.5),
            Role::HcScale => (1.0, 0.05),
            // Not drawn: distinct expert ids (`TensorData::chunk`).
            Role::TokenTable => (0.0, 0.0),
            // Not drawn: the converter's llama3 factors (`Llama4::rope_freqs`).
            Role::RopeFreqs => (1.0, 0.0),
            Role::QNorm | Role::KNorm => (qk, 0.05 * qk),
            Role::Wq | Role::Wk if has_qk_norm => (0.0, fan(e)),
            // The latent vector is normalised, so this matters only for the key's RoPE part.
            Role::Wq | Role::Wk | Role::KvA => (0.0, q_or_k * fan(e)),
            Role::Wv => (0.0, fan(e)),
            Role::KB => (0.0, q_or_k * fan(p.latent.map_or(1, |m| m.kv_lora))),
            Role::VB => (0.0, fan(p.latent.map_or(1, |m| m.kv_lora))),
            Role::KvNorm => (1.0, 0.05),
            Role::Wo => (0.0, attn_gate * self.attn_out * per_layer * fan(p.o_dim())),
            Role::Bo => (0.0, self.bias * self.attn_out * per_layer),
            Role::Sinks => (0.0, self.sink),
            Role::Bq | Role::Bk | Role::Bv => (0.0, self.qkv_bias),
            Role::Router => (0.0, self.router * fan(e)),
            Role::RouterBias => (0.0, self.bias * self.router),
            // Sigmoid scores spread about router / 4 (the sigmoid's slope at 0): a tenth of that, as
            // `bias` scales the other biases, nudges choices without deciding them.
            Role::ChoiceBias => (0.0, self.bias * self.router / 4.0),
            Role::EhProj => (0.0, fan(2 * e)),
            Role::GateExps | Role::UpExps | Role::GateShexp | Role::UpShexp | Role::DenseGate | Role::DenseUp => {
                (0.0, self.ffn_in * fan(e))
            }
            Role::GateExpsBias | Role::UpExpsBias => (0.0, self.bias * self.ffn_in),
            Role::DownExps => (0.0, expert_out * fan(p.expert_ff) / act),
            Role::DownExpsBias => (0.0, self.bias * expert_out),
            // A dense layer's feed-forward gets what a layer's experts get.
            Role::DenseDown => (0.0, self.moe_out * per_layer * fan(p.n_ff) / act),
            // The shared expert gets as much as the routed ones: twice that where a sigmoid gate of about
            // 0.5 scales it; DeepSeek's and GLM's shared experts have no gate.
            Role::DownShexp => {
                let gate = if matches!(p.arch, Arch::DeepSeek2 | Arch::Glm4Moe | Arch::Llama4 | Arch::DeepSeek4) {
                    1.0
                } else {
                    2.0
                };
                (0.0, gate * self.moe_out * per_layer * fan(p.shared_ff) / act)
            }
            Role::ShexpGate => (0.0, fan(e)),
            // q, k and v before the convolution, z, and the gates' inputs: about N(0, 1) each.
            Role::Wqkv | Role::Wz | Role::Beta | Role::Alpha => (0.0, fan(e)),
            Role::DtBias => (0.0, 0.5),
            Role::SsmA => (self.linear_a.ln(), self.linear_a_spread),
            // Four taps of N(0, 0.5²) over inputs of about unit scale: the convolution's output too.
            Role::Conv => (0.0, 0.5),
            Role::SsmOut => {
                let value_dim = p.hybrid.map_or(1, |h| h.value_dim());
                (0.0, self.attn_out * per_layer * fan(value_dim) / silu_rms)
            }
        };
        Scale { mean, sigma }
    }

    /// The LM head's logit per unit cosine, solved so that the next token stays in the current topic
    /// with probability `topic_stay`.
    ///
    /// The final hidden state is the embedding (unit RMS) plus every layer's contributions (RMS about
    /// `r = hypot(attn_out, moe_out)`), so its cosine with the topic part of the current topic's head rows
    /// is `s = sqrt(topic_share · head_topic) / sqrt(1 + r²)`, and with other rows about 0. At
    /// temperature 1 the odds of staying are `T · e^(β s) / (V - T)` for topics of T tokens out of V;
    /// solving for `β` gives the scale.
    pub fn head_logit(&self, p: &Preset) -> f32 {
        let t = self.topic_size.clamp(1, p.n_vocab - 1) as f32;
        let v = p.n_vocab as f32;
        let r2 = self.attn_out.powi(2) + self.moe_out.powi(2);
        let s = (self.topic_share * self.head_topic).sqrt() / (1.0 + r2 / self.embd_rms.powi(2)).sqrt();
        let stay = self.topic_stay.clamp(0.01, 0.99);
        ((stay / (1.0 - stay)).ln() + ((v - t) / t).ln()).max(0.0) / s
    }
}

/// Root of the expected sum of squared routing weights of the chosen experts, by simulation of
/// N(0, router²) logits (fixed seed): what scales one expert's output to the weighted sum's. GLM and
/// MiniMax-M2 score by sigmoid (the choosing bias is small enough to leave out here), then renormalises and scales.
fn topk_weight_rms(p: &Preset, router: f32) -> f32 {
    let (n, k) = (p.n_expert, p.n_expert_used);
    // llama.cpp always renormalises the hybrids' top-k weights; gpt-oss's softmax over the chosen logits
    // is the same as renormalising.
    let norm = matches!(
        p.arch,
        Arch::Qwen3Moe
            | Arch::Llama
            | Arch::Qwen35Moe
            | Arch::GptOss
            | Arch::Glm4Moe
            | Arch::MiniMaxM2
            | Arch::DeepSeek4
    );
    let sqrt_softplus = p.arch == Arch::DeepSeek4;
    // Llama 4's sigmoid weight scales the expert's input, which scales a SwiGLU's output by between w and
    // w²: taken as w here.
    let sigmoid = matches!(p.arch, Arch::Glm4Moe | Arch::MiniMaxM2 | Arch::Llama4);
    let scale_all = p.expert_weights_scale.unwrap_or(1.0);
    let mut rng = crate::blocks::Rng::new(0x5eed);
    let (trials, mut acc) = (2000, 0.0f64);
    let mut logits = vec![0f32; n];
    for _ in 0..trials {
        logits.iter_mut().for_each(|l| *l = router * rng.normal());
        let max = logits.iter().cloned().fold(f32::MIN, f32::max);
        let total: f32 = logits.iter().map(|l| (l - max).exp()).sum();
        let mut probs: Vec<f32> = if sigmoid {
            logits.iter().map(|l| 1.0 / (1.0 + (-l).exp())).collect()
        } else if sqrt_softplus {
            logits.iter().map(|l| l.exp().ln_1p().sqrt()).collect()
        } else {
            logits.iter().map(|l| (l - max).exp() / total).collect()
        };
        probs.sort_by(|a, b| b.total_cmp(a));
        let chosen = &probs[..k];
        let scale = scale_all * if norm { 1.0 / chosen.iter().sum::<f32>() } else { 1.0 };
        acc += chosen.iter().map(|w| ((w * scale) as f64).powi(2)).sum::<f64>();
    }
    ((acc / trials as f64).sqrt()) as f32
}

/// How much larger llama.cpp's attention score is than q·k / sqrt(head size) with q and k as projected:
/// YaRN's attention factor on cos and sin, squared (every dimension gpt-oss rotates), and DeepSeek-V2's
/// mscale² on the whole score (its RoPE factor is then 1). Computed with TITAN's own YaRN, which
/// matches llama.cpp's.
fn score_gain(p: &Preset) -> f32 {
    let Some(y) = p.yarn else { return 1.0 };
    let deepseek = p.arch == Arch::DeepSeek2;
    let log_mul = y.mscale_all_dim.unwrap_or(0.0);
    let engine = titan_engine::config::Yarn {
        factor: y.factor,
        orig_ctx: y.orig_ctx,
        beta_fast: 32.0,
        beta_slow: 1.0,
        log_mul,
        deepseek,
    };
    let m = if deepseek {
        1.0 + 0.1 * log_mul * y.factor.ln()
    } else {
        1.0
    };
    (engine.rope_mscale() * m).powi(2)
}

/// RMS of the experts' activation for gate and up pre-activations of N(0, c²): silu(g) · u, or gpt-oss's
/// g · sigmoid(1.702 g) · (u + 1) (its clamp at 7 is beyond the tails that matter here).
fn act_rms(p: &Preset, c: f32) -> f32 {
    if p.arch == Arch::GptOss {
        glu_rms(c, 1.702) * (1.0 + 1.0 / (c * c)).sqrt()
    } else {
        glu_rms(c, 1.0)
    }
}

/// RMS of g · sigmoid(alpha · g) · u for independent g, u ~ N(0, c²), by quadrature (u contributes c);
/// alpha 1 is SwiGLU's silu(g) · u.
fn glu_rms(c: f32, alpha: f64) -> f32 {
    let (n, lim) = (4000, 8.0f64);
    let c = c as f64;
    let mut acc = 0.0;
    for i in 0..n {
        let z = -lim + (i as f64 + 0.5) * 2.0 * lim / n as f64;
        let g = c * z;
        let act = g / (1.0 + (-alpha * g).exp());
        acc += act * act * (-z * z / 2.0).exp();
    }
    let e_act2 = acc * (2.0 * lim / n as f64) / (2.0 * std::f64::consts::PI).sqrt();
    (e_act2.sqrt() * c) as f32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn swiglu_rms_matches_a_sampled_estimate() {
        // E[silu(g)^2] for g ~ N(0,1) is about 0.3557 (numerically), so rms(silu(g)·u) ≈ 0.5964.
        assert!((glu_rms(1.0, 1.0) - 0.5964).abs() < 0.002, "{}", glu_rms(1.0, 1.0));
    }
}
