//! Causal self-attention over a KV cache (grouped-query: several query heads share a KV head).
//!
//! Each query row attends to cache positions 0..=its own position with one fixed order of operations,
//! so a token's attention output is the same whether it was computed in a prompt batch or alone.

use rayon::prelude::*;
use titan_kernels::{add_weighted_rows, dot_rows};

use crate::ops::{exp, softmax};

/// Keys and values of every layer for one sequence, f32 (llama.cpp defaults to f16 here; f32 keeps the
/// cache exact, and on MoE models it is a small share of memory at the context sizes TITAN targets).
pub struct KvCache {
    n_ctx: usize,
    kv_dim: usize,
    /// Per layer: [n_ctx × kv_dim] keys, then values.
    k: Vec<Vec<f32>>,
    v: Vec<Vec<f32>>,
}

impl KvCache {
    /// A cache for the layers whose `attends` entry is true (the others get none); keys only when
    /// `values` is false (latent attention reads its values out of the keys).
    pub fn new(attends: &[bool], n_ctx: usize, kv_dim: usize, values: bool) -> KvCache {
        let per_layer = |&a: &bool| if a { touched_zeros(n_ctx * kv_dim) } else { Vec::new() };
        let v = if values {
            attends.iter().map(per_layer).collect()
        } else {
            vec![Vec::new(); attends.len()]
        };
        KvCache {
            n_ctx,
            kv_dim,
            k: attends.iter().map(per_layer).collect(),
            v,
        }
    }

    pub fn n_ctx(&self) -> usize {
        self.n_ctx
    }

    /// Floats per position and layer.
    pub fn kv_dim(&self) -> usize {
        self.kv_dim
    }

    /// Store rows of keys and values (`n × kv_dim` each; no values in a keys-only cache) for positions
    /// pos..pos+n of `layer`.
    pub fn store(&mut self, layer: usize, pos: usize, k: &[f32], v: &[f32]) {
        let at = pos * self.kv_dim;
        self.k[layer][at..at + k.len()].copy_from_slice(k);
        if !v.is_empty() {
            self.v[layer][at..at + v.len()].copy_from_slice(v);
        }
    }

    /// The keys of `layer`, position after position.
    pub fn keys(&self, layer: usize) -> &[f32] {
        &self.k[layer]
    }
}

/// `n` zeros with every page of them written now. Zeroed memory is mapped on first touch, so a cache made
/// with `vec!` alone takes a page fault for each new position of each layer as decoding reaches it: on
/// the 2-core VMs this is measured on, that was 70–120 µs per layer and token for OLMoE-1B-7B (a fifth
/// of its decode time). Written here, the cost is paid once when the sequence is made, as llama.cpp
/// pays it by clearing its cache.
fn touched_zeros(n: usize) -> Vec<f32> {
    /// Floats per 4 KiB page (on larger pages, this writes each page more than once, which is harmless).
    const PAGE: usize = 1024;
    let mut v = vec![0.0; n];
    for page in v.chunks_mut(PAGE) {
        // An opaque zero: the compiler knows the memory is zero already and would drop a plain store.
        page[0] = std::hint::black_box(0.0);
    }
    v
}

pub struct AttnShape<'a> {
    pub n_head: usize,
    pub n_head_kv: usize,
    pub head_dim: usize,
    /// Only the last `window` positions are seen (0: all of them).
    pub window: usize,
    /// Per head, a logit that joins the softmax's denominator and attends to nothing (gpt-oss).
    pub sinks: Option<&'a [f32]>,
}

/// `q`: n rows of n_head × head_dim for positions pos0..pos0+n; `out`: same shape; `scores`: working space.
/// Parallel over (row, head) pairs; each pair is computed by one thread in one fixed order.
pub fn attend(
    cache: &KvCache,
    layer: usize,
    s: &AttnShape,
    pos0: usize,
    q: &[f32],
    out: &mut [f32],
    scores: &mut Vec<f32>,
) {
    let group = s.n_head / s.n_head_kv;
    let scale = 1.0 / (s.head_dim as f32).sqrt();
    let (keys, values) = (&cache.k[layer], &cache.v[layer]);
    // The pairs are shared out in order among a few tasks per thread, each with scores for the whole
    // context: the working space is sized once per sequence (and thread count), whatever the batch.
    let pairs = out.len() / s.head_dim;
    if pairs == 0 {
        return;
    }
    let tasks = pairs.min(4 * rayon::current_num_threads());
    let per_task = pairs.div_ceil(tasks);
    scores.resize(tasks * cache.n_ctx, 0.0);
    let chunk = per_task * s.head_dim;
    titan_kernels::stay_warm();
    out.par_chunks_mut(chunk)
        .zip(q.par_chunks(chunk))
        .zip(scores.par_chunks_mut(cache.n_ctx))
        .enumerate()
        .for_each(|(task, ((o, q), scores))| {
            for (j, (oh, qh)) in o
                .chunks_exact_mut(s.head_dim)
                .zip(q.chunks_exact(s.head_dim))
                .enumerate()
            {
                let idx = task * per_task + j;
                let (i, h) = (idx / s.n_head, idx % s.n_head);
                let kv_off = (h / group) * s.head_dim;
                let pos = pos0 + i;
                let first = if s.window > 0 {
                    (pos + 1).saturating_sub(s.window)
                } else {
                    0
                };
                let scores = &mut scores[first..=pos];
                let at = first * cache.kv_dim + kv_off;
                dot_rows(qh, &keys[at..], cache.kv_dim, scale, scores);
                match s.sinks {
                    Some(sinks) => softmax_with_sink(scores, sinks[h]),
                    None => softmax(scores),
                }
                oh.fill(0.0);
                add_weighted_rows(oh, scores, &values[at..], cache.kv_dim);
            }
        });
}

/// Softmax in place with one more logit, `sink`, in the denominator only: the weights sum to less than
/// one by what the sink takes (llama.cpp's soft_max with sinks).
fn softmax_with_sink(x: &mut [f32], sink: f32) {
    let max = x.iter().copied().fold(sink, f32::max);
    x.iter_mut().for_each(|v| *v -= max);
    titan_kernels::exp_in_place(x);
    let sum = x.iter().sum::<f32>() + exp(sink - max);
    let inv = 1.0 / sum;
    for v in x.iter_mut() {
        *v *= inv;
    }
}
