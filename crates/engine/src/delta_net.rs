//! Gated DeltaNet, the linear attention of Qwen3-Next and Qwen3.5: a causal convolution over the
//! projected queries, keys and values, then per value head a d × d state that decays by exp(g) and is
//! corrected towards each new value by the delta rule, read out by the query; then an RMS norm gated by
//! silu(z). What a sequence carries from one call to the next is its [`DeltaState`], not a KV cache.
//!
//! The recurrence runs token by token, also over a prompt: it is the form llama.cpp's CPU backend runs
//! too, and it makes a token's output the same bits however the prompt was split into calls (the
//! chunked form regroups the sums differently for each chunking). Each head is one thread's work, in
//! one fixed order.

use rayon::prelude::*;
use titan_kernels::{delta_rule_rows, exp_in_place, silu_in_place, DeltaStep};

use crate::config::DeltaNetShape;
use crate::ops::{exp, rms_norm, sigmoid};
use crate::weights::DeltaNet;

/// One linear-attention layer's state for one sequence.
#[derive(Default)]
pub struct DeltaState {
    /// The convolution's last `conv_kernel - 1` inputs, oldest first, `conv_dim` channels each.
    conv: Vec<f32>,
    /// Per value head a d × d matrix M, stored by rows: M[j][i] is how key dimension i maps to value
    /// dimension j, so reading value j is one contiguous dot product.
    ssm: Vec<f32>,
}

impl Clone for DeltaState {
    fn clone(&self) -> DeltaState {
        DeltaState {
            conv: self.conv.clone(),
            ssm: self.ssm.clone(),
        }
    }

    /// Into the buffers already there: a checkpoint of the state is taken once per prompt, and some
    /// models' states are tens of megabytes.
    fn clone_from(&mut self, source: &DeltaState) {
        self.conv.clone_from(&source.conv);
        self.ssm.clone_from(&source.ssm);
    }
}

impl DeltaState {
    pub fn new(s: &DeltaNetShape) -> DeltaState {
        DeltaState {
            conv: vec![0.0; (s.conv_kernel - 1) * s.conv_dim()],
            ssm: vec![0.0; s.n_v_heads * s.head_dim * s.head_dim],
        }
    }

    pub fn reset(&mut self) {
        self.conv.fill(0.0);
        self.ssm.fill(0.0);
    }

    /// Bytes a sequence holds for one layer.
    pub fn bytes(s: &DeltaNetShape) -> usize {
        4 * ((s.conv_kernel - 1) * s.conv_dim() + s.n_v_heads * s.head_dim * s.head_dim)
    }
}

/// The per-token gate inputs from their projections, in place: `beta` ← sigmoid(beta) (how strongly
/// each head writes) and `alpha` ← softplus(alpha + dt_bias) · a, the log of the head's decay (`a` is
/// negative). `joint`: Qwen3-Next's `ssm_ba` rows, per key head its value heads' betas then alphas,
/// split into `beta` and `alpha` first.
pub fn gates(s: &DeltaNetShape, w: &DeltaNet, joint: Option<&[f32]>, beta: &mut [f32], alpha: &mut [f32]) {
    let nv = s.n_v_heads;
    if let Some(ba) = joint {
        let per_k = nv / s.n_k_heads;
        for ((row, b), a) in ba
            .chunks_exact(2 * nv)
            .zip(beta.chunks_exact_mut(nv))
            .zip(alpha.chunks_exact_mut(nv))
        {
            for (g, group) in row.chunks_exact(2 * per_k).enumerate() {
                b[g * per_k..(g + 1) * per_k].copy_from_slice(&group[..per_k]);
                a[g * per_k..(g + 1) * per_k].copy_from_slice(&group[per_k..]);
            }
        }
    }
    for b in beta.iter_mut() {
        *b = sigmoid(*b);
    }
    for row in alpha.chunks_exact_mut(nv) {
        for ((x, &bias), &a) in row.iter_mut().zip(&w.dt_bias).zip(&w.a) {
            *x = softplus(*x + bias) * a;
        }
    }
}

/// log(1 + e^x), as llama.cpp computes it (x itself above 20).
fn softplus(x: f32) -> f32 {
    if x > 20.0 {
        x
    } else {
        libm::logf(1.0 + exp(x))
    }
}

/// Working space of [`mix`], kept between calls.
#[derive(Default)]
pub struct DeltaScratch {
    /// The convolution's input: the state's rows, then the span's.
    window: Vec<f32>,
    /// Each head's outputs for the span, head after head.
    heads: Vec<f32>,
    /// exp(g) per row and value head: each head's decay at each token.
    decay: Vec<f32>,
    /// silu(z), the output gate.
    gate: Vec<f32>,
    /// The l2 norm's weight: ones, one head long.
    unit: Vec<f32>,
}

/// Rows of a head's state that run through a span's tokens together: 16 rows of 128 are 8 KiB, which
/// stay in L1 while the tokens' queries and keys pass by.
const STATE_ROWS: usize = 16;

/// One sequence's rows through a linear-attention layer. `qkv` (rows × conv_dim) is the projection,
/// overwritten with the convolution's activations; `z` (rows × value_dim) the output gate; `beta`,
/// `g` (rows × n_v_heads) from [`gates`]. Writes rows × value_dim into `out` and advances `state`.
#[allow(clippy::too_many_arguments)]
pub fn mix(
    s: &DeltaNetShape,
    w: &DeltaNet,
    eps: f32,
    state: &mut DeltaState,
    qkv: &mut [f32],
    z: &[f32],
    beta: &[f32],
    g: &[f32],
    out: &mut [f32],
    scratch: &mut DeltaScratch,
) {
    let (c, d, nv) = (s.conv_dim(), s.head_dim, s.n_v_heads);
    let rows = qkv.len() / c;

    // conv: out[t][ch] = Σ_i window[t + i][ch] · w[i][ch], summed from the oldest tap; then silu.
    let window = &mut scratch.window;
    window.clear();
    window.extend_from_slice(&state.conv);
    window.extend_from_slice(qkv);
    for (t, row) in qkv.chunks_exact_mut(c).enumerate() {
        row.fill(0.0);
        for (x, w) in window[t * c..].chunks_exact(c).zip(w.conv.chunks_exact(c)) {
            for ((v, &x), &w) in row.iter_mut().zip(x).zip(w) {
                *v += x * w;
            }
        }
        silu_in_place(row);
    }
    state.conv.copy_from_slice(&window[rows * c..]);

    // l2 norm of each query and key head, as llama.cpp computes it: an RMS norm with eps / d, scaled
    // by 1 / sqrt(d), i.e. x / sqrt(Σx² + eps).
    let unit = &mut scratch.unit;
    unit.clear();
    unit.resize(d, 1.0);
    let l2_eps = eps / d as f32;
    let inv_sqrt_d = 1.0 / (d as f32).sqrt();
    for row in qkv.chunks_exact_mut(c) {
        let qk = &mut row[..2 * s.key_dim()];
        rms_norm(qk, unit, l2_eps);
        for v in qk.iter_mut() {
            *v *= inv_sqrt_d;
        }
    }

    // The delta rule, per value head: M ← exp(g)·M; δ = β (v − M k); M ← M + δ kᵀ; o = (M q) / sqrt(d).
    // Row j of M meets only δ_j and o_j, so a block of rows runs through every token of the span while
    // it stays in L1, and each element still sees the same operations in the same order as when the
    // tokens come one call at a time.
    let DeltaScratch { heads, decay, .. } = scratch;
    heads.resize(nv * rows * d, 0.0);
    decay.clear();
    decay.extend_from_slice(g);
    exp_in_place(decay);
    let (qkv, decay, key_dim) = (&*qkv, &*decay, s.key_dim());
    titan_kernels::stay_warm();
    let per_head = heads.par_chunks_mut(rows * d).zip(state.ssm.par_chunks_mut(d * d));
    per_head.enumerate().for_each(|(h, (o, m))| {
        let kh = s.key_head(h);
        for (j0, block) in m
            .chunks_mut(STATE_ROWS * d)
            .enumerate()
            .map(|(b, m)| (b * STATE_ROWS, m))
        {
            for (t, ot) in o.chunks_exact_mut(d).enumerate() {
                let row = &qkv[t * c..(t + 1) * c];
                let q = &row[kh * d..(kh + 1) * d];
                let k = &row[key_dim + kh * d..key_dim + (kh + 1) * d];
                let v = &row[2 * key_dim + h * d..2 * key_dim + (h + 1) * d];
                let step = DeltaStep {
                    decay: decay[t * nv + h],
                    beta: beta[t * nv + h],
                    k,
                    q,
                    v: &v[j0..],
                    scale: inv_sqrt_d,
                };
                delta_rule_rows(block, &step, &mut ot[j0..]);
            }
        }
    });

    // Gated RMS norm per head: norm(o) · silu(z), into the rows of `out`.
    let gate = &mut scratch.gate;
    gate.clear();
    gate.extend_from_slice(z);
    silu_in_place(gate);
    for t in 0..rows {
        for h in 0..nv {
            let o = &mut out[t * nv * d + h * d..][..d];
            o.copy_from_slice(&heads[h * rows * d + t * d..][..d]);
            rms_norm(o, &w.norm, eps);
            for (x, &zz) in o.iter_mut().zip(&gate[t * nv * d + h * d..][..d]) {
                *x *= zz;
            }
        }
    }
}
