//! Multi-head latent attention (DeepSeek-V2/V3) in its absorbed form, as llama.cpp's GGUF files store it:
//! each position keeps one latent vector (RMS-normed) and the key's RoPE part, shared by every head. A
//! head's query is taken into the latent space by `attn_k_b`, attends over [latent, RoPE part] as keys and
//! over the latent vectors as values, and `attn_v_b` takes the result out to the head's value.

use rayon::prelude::*;
use titan_kernels::{add_weighted_rows, dot_rows};

use crate::attention::KvCache;
use crate::ops::softmax;

/// `q`: n rows of n_head × `width` (the absorbed query, then its RoPE part), `width` = kv_lora + rope, for
/// positions pos0..; `out`: n rows of n_head × kv_lora. The keys of `layer` in `cache` are rows of
/// `width`, their first kv_lora values the latent vector. Parallel over (row, head) pairs, each computed by
/// one thread in one fixed order, as `attention::attend`.
#[allow(clippy::too_many_arguments)]
pub fn attend_latent(
    cache: &KvCache,
    layer: usize,
    n_head: usize,
    kv_lora: usize,
    scale: f32,
    pos0: usize,
    q: &[f32],
    out: &mut [f32],
    scores: &mut Vec<f32>,
) {
    let width = cache.kv_dim();
    let keys = cache.keys(layer);
    let pairs = out.len() / kv_lora;
    if pairs == 0 {
        return;
    }
    let tasks = pairs.min(4 * rayon::current_num_threads());
    let per_task = pairs.div_ceil(tasks);
    scores.resize(tasks * cache.n_ctx(), 0.0);
    let n_ctx = cache.n_ctx();
    titan_kernels::stay_warm();
    out.par_chunks_mut(per_task * kv_lora)
        .zip(q.par_chunks(per_task * width))
        .zip(scores.par_chunks_mut(n_ctx))
        .enumerate()
        .for_each(|(task, ((o, q), scores))| {
            for (j, (oh, qh)) in o.chunks_exact_mut(kv_lora).zip(q.chunks_exact(width)).enumerate() {
                let i = (task * per_task + j) / n_head;
                let scores = &mut scores[..pos0 + i + 1];
                dot_rows(qh, keys, width, scale, scores);
                softmax(scores);
                oh.fill(0.0);
                add_weighted_rows(oh, scores, keys, width);
            }
        });
}
