//! Which tensors a file holds, in what shape and encoding: the names and shapes llama.cpp's loader
//! expects for the architecture (`src/models/{olmoe,qwen2moe,qwen3moe,llama,qwen35moe,openai-moe,deepseek2,glm4-moe}.cpp`), and the
//! types llama-quantize would give them (`llama_tensor_get_type` in `src/llama-quant.cpp`).

use titan_kernels::GgmlType;
use titan_layout::names::{bias_name, weight_name};
use titan_layout::Part;

use crate::preset::{Arch, FileType, Preset};

/// What a tensor does, which decides its scale (see `calibration`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Role {
    TokenEmbd,
    OutputNorm,
    Output,
    AttnNorm,
    Wq,
    Wk,
    Wv,
    Wo,
    Bq,
    Bk,
    Bv,
    QNorm,
    KNorm,
    FfnNorm,
    Router,
    GateExps,
    UpExps,
    DownExps,
    GateShexp,
    UpShexp,
    DownShexp,
    ShexpGate,
    /// Gated DeltaNet (`qwen35moe`'s linear-attention layers): `attn_qkv`, the convolution's input.
    Wqkv,
    /// `attn_gate`: z, the gate of the output norm.
    Wz,
    /// `ssm_beta`: each value head's write strength, through a sigmoid.
    Beta,
    /// `ssm_alpha`: each value head's decay input.
    Alpha,
    /// `ssm_dt.bias`, added to alpha.
    DtBias,
    /// `ssm_a`: -exp(A_log) per value head.
    SsmA,
    /// `ssm_conv1d`: the causal convolution's taps.
    Conv,
    /// `ssm_norm`: the gated RMS norm's weight.
    SsmNorm,
    /// `ssm_out`: back to the residual stream.
    SsmOut,
    /// `attn_output.bias` (gpt-oss).
    Bo,
    /// `attn_sinks`: per head a logit that joins the softmax (gpt-oss).
    Sinks,
    /// `ffn_gate_inp.bias`: added to the router's logits (gpt-oss).
    RouterBias,
    /// The experts' biases: per expert (gpt-oss).
    GateExpsBias,
    UpExpsBias,
    DownExpsBias,
    /// A dense layer's feed-forward (DeepSeek's first layer): `ffn_gate`, `ffn_up`, `ffn_down`.
    DenseGate,
    DenseUp,
    DenseDown,
    /// `attn_kv_a_mqa`: the latent vector, then the key's RoPE part (latent attention).
    KvA,
    /// `attn_kv_a_norm`: the latent vector's RMS norm.
    KvNorm,
    /// `attn_k_b`: per head, its query's non-RoPE part into the latent space.
    KB,
    /// `attn_v_b`: per head, the latent vector to the head's value.
    VB,
    /// `exp_probs_b`: added to the expert scores to choose experts, not to weigh them (GLM).
    ChoiceBias,
    /// `nextn.eh_proj`: an MTP layer's projection of the embedding and the hidden state, concatenated.
    EhProj,
    /// `nextn.enorm`, `nextn.hnorm`, `nextn.shared_head_norm`: an MTP layer's RMS norms.
    NextnNorm,
    /// `rope_freqs`: what each RoPE pair's angle is divided by (Llama 4's llama3 scaling).
    RopeFreqs,
    /// DeepSeek-V4 (docs/deepseek4.md): `attn_q_a`, its norm, `attn_q_b`; `attn_kv`; the grouped output
    /// `attn_output_a` / `attn_output_b`.
    QA,
    QANorm,
    QB,
    V4Kv,
    WoA,
    WoB,
    /// A compressor's values, scores, per-position score offsets (`_ape`) and entry norm; the indexer's
    /// queries (`indexer.attn_q_b`) and head weights (`indexer.proj`).
    CompKv,
    CompGate,
    Ape,
    CompNorm,
    IdxQB,
    IdxProj,
    /// A hyper-connection site's function, bases and scales (`hc_*_fn`, `_base`, `_scale`).
    HcFn,
    HcBase,
    HcScale,
    /// `ffn_gate_tid2eid`: the experts of each token id (I32), in the first layers.
    TokenTable,
}

#[derive(Clone, Debug)]
pub(crate) struct TensorPlan {
    pub name: String,
    /// GGUF order: the row length (ne0) first.
    pub dims: Vec<u64>,
    pub ty: GgmlType,
    pub role: Role,
}

impl TensorPlan {
    pub fn cols(&self) -> usize {
        self.dims[0] as usize
    }

    pub fn rows(&self) -> usize {
        self.dims[1..].iter().product::<u64>() as usize
    }
}

/// Every tensor of the file, in file order: token_embd, the blocks, output_norm, output.
pub(crate) fn plan(p: &Preset, ft: FileType) -> Vec<TensorPlan> {
    let (e, q, kv, v) = (p.n_embd as u64, p.q_dim() as u64, p.kv_dim() as u64, p.n_vocab as u64);
    let (o, h) = (p.o_dim() as u64, p.n_head as u64);
    let (ff, nx) = (p.expert_ff as u64, p.n_expert as u64);
    let mut out = Vec::new();
    let mut push = |name: String, dims: &[u64], role: Role, layer: Option<usize>| {
        let ty = tensor_type(p, ft, role, dims, layer);
        out.push(TensorPlan {
            name,
            dims: dims.to_vec(),
            ty,
            role,
        });
    };
    if p.llama4.is_some() {
        push(
            "rope_freqs.weight".into(),
            &[p.head_dim as u64 / 2],
            Role::RopeFreqs,
            None,
        );
    }
    push("token_embd.weight".into(), &[e, v], Role::TokenEmbd, None);
    // GLM's MTP layers follow the main ones as whole MoE blocks with a few tensors of their own.
    let nextn = p.glm.map_or(0, |g| g.nextn_layers);
    for i in 0..p.n_layer + nextn {
        let n = |s: &str| format!("blk.{i}.{s}");
        let l = Some(i);
        push(n("attn_norm.weight"), &[e], Role::AttnNorm, l);
        match &p.hybrid {
            Some(h) if h.is_recurrent(i) => {
                let (conv, vd, nv) = (h.conv_dim() as u64, h.value_dim() as u64, h.n_v_heads as u64);
                push(n("attn_qkv.weight"), &[e, conv], Role::Wqkv, l);
                push(n("attn_gate.weight"), &[e, vd], Role::Wz, l);
                push(n("ssm_conv1d.weight"), &[h.conv_kernel as u64, conv], Role::Conv, l);
                push(n("ssm_dt.bias"), &[nv], Role::DtBias, l);
                push(n("ssm_a"), &[nv], Role::SsmA, l);
                push(n("ssm_beta.weight"), &[e, nv], Role::Beta, l);
                push(n("ssm_alpha.weight"), &[e, nv], Role::Alpha, l);
                push(n("ssm_norm.weight"), &[h.head_dim as u64], Role::SsmNorm, l);
                push(n("ssm_out.weight"), &[vd, e], Role::SsmOut, l);
            }
            _ if p.v4.is_some() => v4_attention(p, i, &mut push),
            _ if p.latent.is_some() => {
                let m = p.latent.expect("matched");
                let (lora, nope, rope, vd) = (m.kv_lora as u64, m.nope as u64, m.rope as u64, m.v_dim as u64);
                push(n("attn_q.weight"), &[e, q], Role::Wq, l);
                push(n("attn_kv_a_mqa.weight"), &[e, lora + rope], Role::KvA, l);
                push(n("attn_kv_a_norm.weight"), &[lora], Role::KvNorm, l);
                // The converter splits kv_b_proj into these two, per head, for the absorbed form.
                push(n("attn_k_b.weight"), &[nope, lora, h], Role::KB, l);
                push(n("attn_v_b.weight"), &[lora, vd, h], Role::VB, l);
                push(n("attn_output.weight"), &[h * vd, e], Role::Wo, l);
            }
            _ => {
                // A hybrid's attention is gated: its query projection yields each head's queries, then as
                // many gate values.
                let q_rows = if p.hybrid.is_some() { 2 * q } else { q };
                push(n("attn_q.weight"), &[e, q_rows], Role::Wq, l);
                push(n("attn_k.weight"), &[e, kv], Role::Wk, l);
                push(n("attn_v.weight"), &[e, kv], Role::Wv, l);
                push(n("attn_output.weight"), &[o, e], Role::Wo, l);
                if matches!(p.arch, Arch::Qwen2Moe | Arch::GptOss | Arch::Glm4Moe) {
                    push(n("attn_q.bias"), &[q], Role::Bq, l);
                    push(n("attn_k.bias"), &[kv], Role::Bk, l);
                    push(n("attn_v.bias"), &[kv], Role::Bv, l);
                }
                if p.arch == Arch::GptOss {
                    push(n("attn_output.bias"), &[e], Role::Bo, l);
                    push(n("attn_sinks.weight"), &[h], Role::Sinks, l);
                }
                match p.arch {
                    Arch::Qwen3Moe | Arch::Qwen35Moe => {
                        push(n("attn_q_norm.weight"), &[p.head_dim as u64], Role::QNorm, l);
                        push(n("attn_k_norm.weight"), &[p.head_dim as u64], Role::KNorm, l);
                    }
                    Arch::Olmoe | Arch::MiniMaxM2 => {
                        push(n("attn_q_norm.weight"), &[q], Role::QNorm, l);
                        push(n("attn_k_norm.weight"), &[kv], Role::KNorm, l);
                    }
                    Arch::Glm4Moe if p.glm.is_some_and(|g| g.qk_norm) => {
                        push(n("attn_q_norm.weight"), &[p.head_dim as u64], Role::QNorm, l);
                        push(n("attn_k_norm.weight"), &[p.head_dim as u64], Role::KNorm, l);
                    }
                    // Llama 4's q/k norms have no weight.
                    Arch::Qwen2Moe
                    | Arch::Llama
                    | Arch::GptOss
                    | Arch::DeepSeek2
                    | Arch::Glm4Moe
                    | Arch::Llama4
                    | Arch::DeepSeek4 => {}
                }
            }
        }
        // The hybrids, gpt-oss and GLM name the norm before the experts after its place in the Hugging
        // Face model.
        let post = p.hybrid.is_some() || matches!(p.arch, Arch::GptOss | Arch::Glm4Moe);
        let ffn_norm = if post {
            "post_attention_norm.weight"
        } else {
            "ffn_norm.weight"
        };
        push(n(ffn_norm), &[e], Role::FfnNorm, l);
        // Llama 4's dense layers sit between its MoE ones.
        if i < p.dense_lead || p.llama4.is_some_and(|l| !(i + 1).is_multiple_of(l.moe_every)) {
            let dff = p.n_ff as u64;
            push(n("ffn_gate.weight"), &[e, dff], Role::DenseGate, l);
            push(n("ffn_up.weight"), &[e, dff], Role::DenseUp, l);
            push(n("ffn_down.weight"), &[dff, e], Role::DenseDown, l);
            continue;
        }
        push(n("ffn_gate_inp.weight"), &[e, nx], Role::Router, l);
        // DeepSeek-V4's first layers choose by the token instead of the biased scores.
        let hashed = p.v4.is_some_and(|v| i < v.hash_layers);
        if matches!(p.arch, Arch::Glm4Moe | Arch::MiniMaxM2) || p.v4.is_some() && !hashed {
            push(n("exp_probs_b.bias"), &[nx], Role::ChoiceBias, l);
        }
        if hashed {
            push(
                n("ffn_gate_tid2eid.weight"),
                &[p.n_expert_used as u64, v],
                Role::TokenTable,
                l,
            );
        }
        push(weight_name(i, Part::Gate), &[e, ff, nx], Role::GateExps, l);
        push(weight_name(i, Part::Up), &[e, ff, nx], Role::UpExps, l);
        push(weight_name(i, Part::Down), &[ff, e, nx], Role::DownExps, l);
        if p.arch == Arch::GptOss {
            push(n("ffn_gate_inp.bias"), &[nx], Role::RouterBias, l);
            push(bias_name(i, Part::Gate), &[ff, nx], Role::GateExpsBias, l);
            push(bias_name(i, Part::Up), &[ff, nx], Role::UpExpsBias, l);
            push(bias_name(i, Part::Down), &[e, nx], Role::DownExpsBias, l);
        }
        if p.shared_ff > 0 {
            let sf = p.shared_ff as u64;
            // The converter writes the gate as a one-row matrix; llama-quantize rewrites it as a vector.
            // DeepSeek's and GLM's shared experts have no gate.
            let gate_dims: &[u64] = if matches!(ft, FileType::F16 | FileType::Mxfp4) {
                &[e, 1]
            } else {
                &[e]
            };
            if !matches!(p.arch, Arch::DeepSeek2 | Arch::Glm4Moe | Arch::Llama4 | Arch::DeepSeek4) {
                push(n("ffn_gate_inp_shexp.weight"), gate_dims, Role::ShexpGate, l);
            }
            push(n("ffn_gate_shexp.weight"), &[e, sf], Role::GateShexp, l);
            push(n("ffn_up_shexp.weight"), &[e, sf], Role::UpShexp, l);
            push(n("ffn_down_shexp.weight"), &[sf, e], Role::DownShexp, l);
        }
        if i >= p.n_layer {
            push(n("nextn.eh_proj.weight"), &[2 * e, e], Role::EhProj, l);
            push(n("nextn.enorm.weight"), &[e], Role::NextnNorm, l);
            push(n("nextn.hnorm.weight"), &[e], Role::NextnNorm, l);
            push(n("nextn.shared_head_norm.weight"), &[e], Role::NextnNorm, l);
        }
    }
    if let Some(s) = p.v4 {
        let hc = s.hc as u64;
        push("output_hc_fn.weight".into(), &[hc * e, hc], Role::HcFn, None);
        push("output_hc_base.weight".into(), &[hc], Role::HcBase, None);
        push("output_hc_scale.weight".into(), &[1], Role::HcScale, None);
    }
    push("output_norm.weight".into(), &[e], Role::OutputNorm, None);
    push("output.weight".into(), &[e, v], Role::Output, None);
    out
}

/// How the planner adds a tensor: name, dims, role, layer.
type Push<'a> = dyn FnMut(String, &[u64], Role, Option<usize>) + 'a;

/// Block `i`'s DeepSeek-V4 attention and its two hyper-connection sites, as the converter names them.
fn v4_attention(p: &Preset, i: usize, push: &mut Push<'_>) {
    let s = p.v4.expect("a DeepSeek-V4 preset");
    let n = |x: &str| format!("blk.{i}.{x}");
    let l = Some(i);
    let (e, q, d, h) = (p.n_embd as u64, p.q_dim() as u64, p.head_dim as u64, p.n_head as u64);
    let (lora, groups, rank) = (s.q_lora as u64, s.out_groups as u64, s.out_rank as u64);
    push(n("attn_q_a.weight"), &[e, lora], Role::QA, l);
    push(n("attn_q_a_norm.weight"), &[lora], Role::QANorm, l);
    push(n("attn_q_b.weight"), &[lora, q], Role::QB, l);
    push(n("attn_kv.weight"), &[e, d], Role::V4Kv, l);
    push(n("attn_kv_a_norm.weight"), &[d], Role::KvNorm, l);
    push(n("attn_sinks.weight"), &[h], Role::Sinks, l);
    push(n("attn_output_a.weight"), &[q / groups, groups * rank], Role::WoA, l);
    push(n("attn_output_b.weight"), &[groups * rank, e], Role::WoB, l);
    let ratio = s.ratio(i);
    let mut compressor = |prefix: &str, dim: u64| {
        let width = crate::preset::V4::width(ratio, dim as usize) as u64;
        push(n(&format!("{prefix}_kv.weight")), &[e, width], Role::CompKv, l);
        push(n(&format!("{prefix}_gate.weight")), &[e, width], Role::CompGate, l);
        push(n(&format!("{prefix}_ape.weight")), &[width, ratio as u64], Role::Ape, l);
        push(n(&format!("{prefix}_norm.weight")), &[dim], Role::CompNorm, l);
    };
    if ratio > 0 {
        compressor("attn_compressor", d);
    }
    if ratio == 4 {
        let (ih, id) = (s.idx_heads as u64, s.idx_dim as u64);
        compressor("indexer_compressor", id);
        push(n("indexer.attn_q_b.weight"), &[lora, ih * id], Role::IdxQB, l);
        push(n("indexer.proj.weight"), &[e, ih], Role::IdxProj, l);
    }
    let (hc, mix) = (s.hc as u64, ((2 + s.hc) * s.hc) as u64);
    for site in ["hc_attn", "hc_ffn"] {
        push(n(&format!("{site}_fn.weight")), &[hc * e, mix], Role::HcFn, l);
        push(n(&format!("{site}_base.weight")), &[mix], Role::HcBase, l);
        push(n(&format!("{site}_scale.weight")), &[3], Role::HcScale, l);
    }
}

/// llama.cpp's `use_more_bits`: the first and last eighth of the layers and every third one between.
fn use_more_bits(i: usize, n: usize) -> bool {
    let (i, n) = (i as i64, n as i64);
    i < n / 8 || i >= 7 * n / 8 || (i - n / 8) % 3 == 2
}

/// The type llama.cpp gives this tensor: the converter's choice (F32 for vectors and the router, F16
/// for the rest of an f16 file), then llama-quantize's mix for the quantised file types.
fn tensor_type(p: &Preset, ft: FileType, role: Role, dims: &[u64], layer: Option<usize>) -> GgmlType {
    use GgmlType::*;
    // The converter keeps vectors, the router, the shared expert's gate, the convolution and the experts'
    // biases in F32, and llama-quantize leaves them (and every `_norm`, and any `.bias`) alone.
    if role == Role::TokenTable {
        return I32;
    }
    // (and DeepSeek-V4's hyper-connection functions and compressor offsets, which TITAN decodes to f32)
    let f32_roles = matches!(
        role,
        Role::Router
            | Role::ShexpGate
            | Role::Conv
            | Role::GateExpsBias
            | Role::UpExpsBias
            | Role::DownExpsBias
            | Role::HcFn
            | Role::Ape
    );
    if dims.len() == 1 || f32_roles {
        return F32;
    }
    let stacked = dims.len() == 3 && dims[2] > 1;
    let base = match ft {
        FileType::F16 => return F16,
        // The checkpoint's MXFP4 tensors are its experts; the converter writes the rest as F16.
        FileType::Mxfp4 if matches!(role, Role::GateExps | Role::UpExps | Role::DownExps) => return MXFP4,
        FileType::Mxfp4 => return F16,
        // llama-quantize's rule takes every 3-D tensor of more than one matrix for experts (latent
        // attention's per-head attn_k_b / attn_v_b too), and everything else, the output included, Q8_0.
        FileType::Mxfp4_Moe => return if stacked { MXFP4 } else { Q8_0 },
        FileType::Q8_0 => Q8_0,
        FileType::Q6_K => Q6_K,
        FileType::Q4_0 => Q4_0,
        FileType::Q4_K_M => Q4_K,
    };
    let cols = dims[0] as usize;
    let eight_experts = p.n_expert == 8;
    let more_bits = |l: Option<usize>| ft == FileType::Q4_K_M && use_more_bits(l.unwrap_or(0), p.n_layer);
    let ty = match role {
        Role::Output if !cols.is_multiple_of(base.block_len()) => Q8_0,
        Role::Output if base != Q8_0 => Q6_K,
        // "for the 8-expert model, bumping this to Q8_0 trades just ~128MB"; llama-quantize counts
        // attn_qkv with attn_v (`category_is_attn_v`), and a hybrid has one or the other in each layer, so
        // the attn_v counter is the layer index.
        Role::Wv | Role::Wqkv | Role::Wk if eight_experts => Q8_0,
        Role::Wv | Role::Wqkv if more_bits(layer) => Q6_K,
        // llama-quantize counts every `ffn_down` (dense, routed, shared) by its layer.
        Role::DownExps | Role::DownShexp | Role::DenseDown if more_bits(layer) => Q6_K,
        Role::Wo if eight_experts && ft == FileType::Q4_K_M => Q5_K,
        _ => base,
    };
    // llama.cpp's fallback when a row is not whole blocks of the chosen type.
    if !cols.is_multiple_of(ty.block_len()) {
        match ty {
            Q4_K => Q5_0,
            Q5_K => Q5_0, // llama.cpp picks Q5_1, which no preset needs; Q5_0 has the same block size
            Q6_K => Q8_0,
            other => other,
        }
    } else {
        ty
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::preset::preset;

    fn ty_of(plan: &[TensorPlan], name: &str) -> GgmlType {
        plan.iter()
            .find(|t| t.name == name)
            .unwrap_or_else(|| panic!("no {name}"))
            .ty
    }

    #[test]
    fn q4_k_m_follows_llama_quantize() {
        let p = preset("qwen3-30b-a3b").unwrap();
        let plan = plan(p, FileType::Q4_K_M);
        assert_eq!(ty_of(&plan, "token_embd.weight"), GgmlType::Q4_K);
        assert_eq!(ty_of(&plan, "output.weight"), GgmlType::Q6_K);
        assert_eq!(ty_of(&plan, "blk.0.ffn_gate_inp.weight"), GgmlType::F32);
        assert_eq!(ty_of(&plan, "blk.0.attn_q_norm.weight"), GgmlType::F32);
        // 48 layers: more bits for 0..6, 42..48 and 6 + 3k + 2.
        for (l, want) in [
            (0, true),
            (5, true),
            (6, false),
            (8, true),
            (9, false),
            (11, true),
            (41, true),
            (42, true),
            (40, false),
        ] {
            let t = if want { GgmlType::Q6_K } else { GgmlType::Q4_K };
            assert_eq!(ty_of(&plan, &format!("blk.{l}.attn_v.weight")), t, "layer {l}");
            assert_eq!(ty_of(&plan, &format!("blk.{l}.ffn_down_exps.weight")), t, "layer {l}");
            assert_eq!(ty_of(&plan, &format!("blk.{l}.ffn_up_exps.weight")), GgmlType::Q4_K);
        }
        // Qwen1.5-MoE's experts have 1408 columns: not whole K-quant blocks.
        let plan = crate::layout::plan(preset("qwen1.5-moe-a2.7b").unwrap(), FileType::Q4_K_M);
        assert_eq!(ty_of(&plan, "blk.0.ffn_down_exps.weight"), GgmlType::Q8_0);
        assert_eq!(ty_of(&plan, "blk.1.ffn_down_exps.weight"), GgmlType::Q8_0);
        assert_eq!(ty_of(&plan, "blk.3.ffn_down_exps.weight"), GgmlType::Q5_0);
        assert_eq!(ty_of(&plan, "blk.3.ffn_down_shexp.weight"), GgmlType::Q4_K);
        // Mixtral: 8 experts.
        let plan = crate::layout::plan(preset("mixtral-8x7b").unwrap(), FileType::Q4_K_M);
        assert_eq!(ty_of(&plan, "blk.3.attn_v.weight"), GgmlType::Q8_0);
        assert_eq!(ty_of(&plan, "blk.3.attn_k.weight"), GgmlType::Q8_0);
        assert_eq!(ty_of(&plan, "blk.3.attn_output.weight"), GgmlType::Q5_K);
    }

    /// Qwen3.6-35B-A3B at its real size: llama-quantize's Q4_K_M counts attn_qkv (linear layers) and
    /// attn_v (full-attention layers) together, one per layer, so both follow `use_more_bits` by layer;
    /// with 256 experts nothing is bumped to Q8_0 or Q5_K.
    #[test]
    fn hybrid_q4_k_m_follows_llama_quantize() {
        let p = preset("qwen3.6-35b-a3b").unwrap();
        let plan = plan(p, FileType::Q4_K_M);
        let dims = |name: &str| {
            plan.iter()
                .find(|t| t.name == name)
                .unwrap_or_else(|| panic!("no {name}"))
                .dims
                .clone()
        };
        // 40 layers: more bits for 0..5, 35..40 and 5 + 3k + 2.
        for (l, more) in [
            (0, true),
            (3, true),
            (4, true),
            (5, false),
            (7, true),
            (11, false),
            (13, true),
            (33, false),
            (34, true),
            (35, true),
            (39, true),
        ] {
            let t = if more { GgmlType::Q6_K } else { GgmlType::Q4_K };
            let mixer = if (l + 1) % 4 == 0 { "attn_v" } else { "attn_qkv" };
            assert_eq!(ty_of(&plan, &format!("blk.{l}.{mixer}.weight")), t, "layer {l}");
            assert_eq!(ty_of(&plan, &format!("blk.{l}.ffn_down_exps.weight")), t, "layer {l}");
            assert_eq!(ty_of(&plan, &format!("blk.{l}.ffn_down_shexp.weight")), t, "layer {l}");
        }
        assert_eq!(ty_of(&plan, "blk.3.attn_output.weight"), GgmlType::Q4_K);
        assert_eq!(ty_of(&plan, "blk.3.attn_k.weight"), GgmlType::Q4_K);
        assert_eq!(ty_of(&plan, "blk.0.attn_gate.weight"), GgmlType::Q4_K);
        assert_eq!(ty_of(&plan, "blk.0.ssm_alpha.weight"), GgmlType::Q4_K);
        assert_eq!(ty_of(&plan, "blk.0.ssm_out.weight"), GgmlType::Q4_K);
        assert_eq!(ty_of(&plan, "blk.0.ssm_conv1d.weight"), GgmlType::F32);
        assert_eq!(ty_of(&plan, "output.weight"), GgmlType::Q6_K);
        // Full attention: 16 heads of 256, queries and gates (8192 rows), 2 KV heads; Gated DeltaNet: 16 key
        // and 32 value heads of 128 (conv channels 2·2048 + 4096).
        assert_eq!(dims("blk.3.attn_q.weight"), [2048, 8192]);
        assert_eq!(dims("blk.3.attn_k.weight"), [2048, 512]);
        assert_eq!(dims("blk.3.attn_output.weight"), [4096, 2048]);
        assert_eq!(dims("blk.0.attn_qkv.weight"), [2048, 8192]);
        assert_eq!(dims("blk.0.ssm_out.weight"), [4096, 2048]);
        assert_eq!(dims("blk.0.ssm_conv1d.weight"), [4, 8192]);
        assert_eq!(dims("blk.39.ffn_gate_exps.weight"), [2048, 512, 256]);
        assert_eq!(dims("token_embd.weight"), [2048, 248320]);
        let linear = plan.iter().filter(|t| t.name.ends_with("ssm_a")).count();
        assert_eq!(
            (
                linear,
                plan.iter().filter(|t| t.name.ends_with("attn_q.weight")).count()
            ),
            (30, 10)
        );

        // Qwen3.5-122B-A10B: hidden 3072, 32 heads of 256 (16384 rows with the gates), 16 key and 64 value
        // heads of 128 (conv channels 2·2048 + 8192), experts of 1024; 48 layers, more bits from 42.
        let plan = crate::layout::plan(preset("qwen3.5-122b-a10b").unwrap(), FileType::Q4_K_M);
        let dims = |name: &str| {
            plan.iter()
                .find(|t| t.name == name)
                .unwrap_or_else(|| panic!("no {name}"))
                .dims
                .clone()
        };
        assert_eq!(dims("blk.47.attn_q.weight"), [3072, 16384]);
        assert_eq!(dims("blk.47.attn_output.weight"), [8192, 3072]);
        assert_eq!(dims("blk.0.attn_qkv.weight"), [3072, 12288]);
        assert_eq!(dims("blk.0.ssm_out.weight"), [8192, 3072]);
        assert_eq!(dims("blk.0.ssm_alpha.weight"), [3072, 64]);
        assert_eq!(dims("blk.0.ffn_down_exps.weight"), [1024, 3072, 256]);
        assert_eq!(ty_of(&plan, "blk.42.attn_qkv.weight"), GgmlType::Q6_K);
        assert_eq!(ty_of(&plan, "blk.40.attn_qkv.weight"), GgmlType::Q4_K);
    }

    /// gpt-oss-20b at its real size: hidden 2880 is not whole K-quant blocks, so Q4_K_M falls back to
    /// Q5_0 (Q6_K to Q8_0) for every matrix that reads the hidden state, as llama-quantize does; the
    /// MXFP4 types keep the experts MXFP4 and the biases, sinks and router F32.
    #[test]
    fn gpt_oss_layout_and_types() {
        let p = preset("gpt-oss-20b").unwrap();
        let plan = plan(p, FileType::Mxfp4_Moe);
        let dims = |name: &str| {
            plan.iter()
                .find(|t| t.name == name)
                .unwrap_or_else(|| panic!("no {name}"))
                .dims
                .clone()
        };
        assert_eq!(dims("token_embd.weight"), [2880, 201088]);
        assert_eq!(dims("blk.0.attn_q.weight"), [2880, 4096]);
        assert_eq!(dims("blk.0.attn_k.weight"), [2880, 512]);
        assert_eq!(dims("blk.0.attn_output.weight"), [4096, 2880]);
        assert_eq!(dims("blk.0.attn_sinks.weight"), [64]);
        assert_eq!(dims("blk.23.ffn_gate_exps.weight"), [2880, 2880, 32]);
        assert_eq!(dims("blk.23.ffn_down_exps.bias"), [2880, 32]);
        assert_eq!(dims("blk.23.ffn_gate_inp.bias"), [32]);
        assert_eq!(plan.iter().filter(|t| t.name.starts_with("blk.0.")).count(), 19);
        for (name, ty) in [
            ("blk.0.ffn_up_exps.weight", GgmlType::MXFP4),
            ("blk.0.attn_q.weight", GgmlType::Q8_0),
            ("token_embd.weight", GgmlType::Q8_0),
            ("output.weight", GgmlType::Q8_0),
            ("blk.0.ffn_gate_inp.weight", GgmlType::F32),
            ("blk.0.ffn_up_exps.bias", GgmlType::F32),
            ("blk.0.attn_sinks.weight", GgmlType::F32),
            ("blk.0.post_attention_norm.weight", GgmlType::F32),
        ] {
            assert_eq!(ty_of(&plan, name), ty, "{name}");
        }
        let plan = crate::layout::plan(p, FileType::Mxfp4);
        assert_eq!(ty_of(&plan, "blk.0.ffn_down_exps.weight"), GgmlType::MXFP4);
        assert_eq!(ty_of(&plan, "blk.0.attn_q.weight"), GgmlType::F16);
        assert_eq!(ty_of(&plan, "output.weight"), GgmlType::F16);
        let plan = crate::layout::plan(p, FileType::Q4_K_M);
        assert_eq!(ty_of(&plan, "blk.0.attn_q.weight"), GgmlType::Q5_0);
        assert_eq!(ty_of(&plan, "blk.0.attn_output.weight"), GgmlType::Q4_K, "4096 columns");
        assert_eq!(
            ty_of(&plan, "blk.0.attn_v.weight"),
            GgmlType::Q8_0,
            "more bits, falling back"
        );
        assert_eq!(ty_of(&plan, "blk.3.attn_v.weight"), GgmlType::Q5_0);
        assert_eq!(ty_of(&plan, "blk.0.ffn_down_exps.weight"), GgmlType::Q8_0);
        assert_eq!(ty_of(&plan, "output.weight"), GgmlType::Q8_0);
    }

    /// DeepSeek-V2-Lite at its real size: latent attention's per-head tensors, a dense first layer, the
    /// shared experts; Q4_K_M counts every ffn_down by layer and falls back where 1408, 10944 or 128
    /// columns are not whole K-quant blocks.
    #[test]
    fn deepseek_layout_and_types() {
        let p = preset("deepseek-v2-lite").unwrap();
        let plan = plan(p, FileType::Q4_K_M);
        let dims = |name: &str| {
            plan.iter()
                .find(|t| t.name == name)
                .unwrap_or_else(|| panic!("no {name}"))
                .dims
                .clone()
        };
        assert_eq!(dims("blk.0.attn_q.weight"), [2048, 3072]);
        assert_eq!(dims("blk.0.attn_kv_a_mqa.weight"), [2048, 576]);
        assert_eq!(dims("blk.0.attn_kv_a_norm.weight"), [512]);
        assert_eq!(dims("blk.0.attn_k_b.weight"), [128, 512, 16]);
        assert_eq!(dims("blk.0.attn_v_b.weight"), [512, 128, 16]);
        assert_eq!(dims("blk.0.attn_output.weight"), [2048, 2048]);
        assert_eq!(dims("blk.0.ffn_gate.weight"), [2048, 10944]);
        assert_eq!(dims("blk.0.ffn_down.weight"), [10944, 2048]);
        assert_eq!(dims("blk.26.ffn_gate_exps.weight"), [2048, 1408, 64]);
        assert_eq!(dims("blk.26.ffn_down_shexp.weight"), [2816, 2048]);
        assert_eq!(dims("token_embd.weight"), [2048, 102400]);
        assert!(
            plan.iter()
                .all(|t| !(t.name.starts_with("blk.0.") && t.name.contains("exp"))),
            "layer 0 is dense"
        );
        assert!(
            plan.iter().all(|t| !t.name.contains("ffn_gate_inp_shexp")),
            "DeepSeek's shared experts have no gate"
        );
        for (name, ty) in [
            ("blk.0.ffn_down.weight", GgmlType::Q8_0),
            ("blk.0.ffn_gate.weight", GgmlType::Q4_K),
            ("blk.0.attn_k_b.weight", GgmlType::Q5_0),
            ("blk.0.attn_v_b.weight", GgmlType::Q4_K),
            ("blk.0.attn_kv_a_mqa.weight", GgmlType::Q4_K),
            ("blk.1.ffn_down_exps.weight", GgmlType::Q8_0),
            ("blk.1.ffn_down_shexp.weight", GgmlType::Q6_K),
            ("blk.4.ffn_down_exps.weight", GgmlType::Q5_0),
            ("blk.4.ffn_down_shexp.weight", GgmlType::Q4_K),
            ("blk.4.ffn_up_exps.weight", GgmlType::Q4_K),
            ("blk.4.ffn_gate_inp.weight", GgmlType::F32),
            ("output.weight", GgmlType::Q6_K),
        ] {
            assert_eq!(ty_of(&plan, name), ty, "{name}");
        }
        // llama-quantize's MXFP4_MOE takes the per-head 3-D tensors for experts too.
        let plan = crate::layout::plan(p, FileType::Mxfp4_Moe);
        assert_eq!(ty_of(&plan, "blk.0.attn_k_b.weight"), GgmlType::MXFP4);
        assert_eq!(ty_of(&plan, "blk.0.ffn_down.weight"), GgmlType::Q8_0);
    }

    #[test]
    fn q4_0_keeps_llama_quantizes_output_rule() {
        let plan = plan(preset("olmoe-1b-7b").unwrap(), FileType::Q4_0);
        assert_eq!(ty_of(&plan, "output.weight"), GgmlType::Q6_K);
        assert_eq!(ty_of(&plan, "token_embd.weight"), GgmlType::Q4_0);
        assert_eq!(ty_of(&plan, "blk.7.ffn_down_exps.weight"), GgmlType::Q4_0);
        let plan = crate::layout::plan(preset("olmoe-1b-7b").unwrap(), FileType::F16);
        assert_eq!(ty_of(&plan, "output.weight"), GgmlType::F16);
        assert_eq!(ty_of(&plan, "blk.0.ffn_gate_inp.weight"), GgmlType::F32);
    }
}
