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
    /// Only the positions of the query's own chunk of `chunk` are seen, chunks starting at 0 (Llama 4's
    /// chunked attention, llama.cpp's `LLAMA_SWA_TYPE_CHUNKED`; 0: no chunks).
    pub chunk: usize,
    /// Per head, a logit that joins the softmax's denominator and attends to nothing (gpt-oss).
    pub sinks: Option<&'a [f32]>,
}

/// Query rows of one head attended together: each tile of keys and values is read once for all of them,
/// not once per row, which is what a long prompt chunk over a long cache is bound by.
const ROWS_TOGETHER: usize = 16;
/// Positions per tile: 64 keys of a 128-wide head are 32 KiB, which stays in the first-level cache while
/// every row of the group uses them.
const KEYS_PER_TILE: usize = 64;

/// `q`: n rows of n_head × head_dim for positions pos0..pos0+n; `out`: same shape; `scores`: working space.
///
/// Parallel over runs of (row, head) pairs. Within a run, the rows of each head go in groups of
/// [`ROWS_TOGETHER`] through the keys tile by tile; a row's scores are still each key's dot product with
/// its query, and its output still adds the values in position order, so its bits are those of the row
/// alone, whatever the batch.
pub fn attend(
    cache: &KvCache,
    layer: usize,
    s: &AttnShape,
    pos0: usize,
    q: &[f32],
    out: &mut [f32],
    scores: &mut Vec<f32>,
) {
    let scale = 1.0 / (s.head_dim as f32).sqrt();
    // The pairs are shared out in order among a few tasks per thread, each with scores for the whole
    // context of a group of rows: the working space is sized once per sequence (and thread count).
    let pairs = out.len() / s.head_dim;
    if pairs == 0 {
        return;
    }
    let tasks = pairs.min(4 * rayon::current_num_threads());
    let per_task = pairs.div_ceil(tasks);
    let together = ROWS_TOGETHER.min(per_task.div_ceil(s.n_head));
    let room = together * cache.n_ctx;
    scores.resize(tasks * room, 0.0);
    let chunk = per_task * s.head_dim;
    titan_kernels::stay_warm();
    out.par_chunks_mut(chunk)
        .zip(q.par_chunks(chunk))
        .zip(scores.par_chunks_mut(room))
        .enumerate()
        .for_each(|(task, ((o, q), scores))| {
            let first_pair = task * per_task;
            let pairs = first_pair..first_pair + o.len() / s.head_dim;
            for h in 0..s.n_head {
                // The rows i whose pair i · n_head + h falls in this task's run.
                let rows = pairs.start.saturating_sub(h).div_ceil(s.n_head)..(pairs.end + s.n_head - 1 - h) / s.n_head;
                for i0 in rows.clone().step_by(together) {
                    let group = Group {
                        rows: i0..(i0 + together).min(rows.end),
                        head: h,
                        first_pair: pairs.start,
                        pos0,
                        scale,
                    };
                    group.attend(cache, layer, s, q, o, scores);
                }
            }
        });
}

/// Rows of one head attended together, within a task's run of pairs.
struct Group {
    rows: std::ops::Range<usize>,
    head: usize,
    /// The first pair of the task's run: where its `q` and `out` start.
    first_pair: usize,
    pos0: usize,
    scale: f32,
}

impl Group {
    /// Where row `i`'s query and output are in the task's slices.
    fn at(&self, i: usize, s: &AttnShape) -> std::ops::Range<usize> {
        let start = (i * s.n_head + self.head - self.first_pair) * s.head_dim;
        start..start + s.head_dim
    }

    /// The positions row `i` sees: up to its own, from the window's or its chunk's start.
    fn seen(&self, i: usize, s: &AttnShape) -> std::ops::Range<usize> {
        let pos = self.pos0 + i;
        let window = if s.window > 0 {
            (pos + 1).saturating_sub(s.window)
        } else {
            0
        };
        let chunk = pos.checked_div(s.chunk).map_or(0, |c| c * s.chunk);
        window.max(chunk)..pos + 1
    }

    fn attend(&self, cache: &KvCache, layer: usize, s: &AttnShape, q: &[f32], o: &mut [f32], scores: &mut [f32]) {
        let kv_off = (self.head / (s.n_head / s.n_head_kv)) * s.head_dim;
        let (keys, values) = (&cache.k[layer], &cache.v[layer]);
        let n_ctx = cache.n_ctx;
        let span = self.seen(self.rows.start, s).start..self.seen(self.rows.end - 1, s).end;
        let tiles = || {
            (span.start..span.end)
                .step_by(KEYS_PER_TILE)
                .map(|t| t..(t + KEYS_PER_TILE).min(span.end))
        };
        for tile in tiles() {
            for (r, i) in self.rows.clone().enumerate() {
                let seen = self.seen(i, s);
                let (from, to) = (tile.start.max(seen.start), tile.end.min(seen.end));
                if from < to {
                    let row_scores = &mut scores[r * n_ctx..][from..to];
                    let at = from * cache.kv_dim + kv_off;
                    dot_rows(&q[self.at(i, s)], &keys[at..], cache.kv_dim, self.scale, row_scores);
                }
            }
        }
        for (r, i) in self.rows.clone().enumerate() {
            let row_scores = &mut scores[r * n_ctx..][self.seen(i, s)];
            match s.sinks {
                Some(sinks) => softmax_with_sink(row_scores, sinks[self.head]),
                None => softmax(row_scores),
            }
            o[self.at(i, s)].fill(0.0);
        }
        for tile in tiles() {
            for (r, i) in self.rows.clone().enumerate() {
                let seen = self.seen(i, s);
                let (from, to) = (tile.start.max(seen.start), tile.end.min(seen.end));
                if from < to {
                    let at = from * cache.kv_dim + kv_off;
                    add_weighted_rows(
                        &mut o[self.at(i, s)],
                        &scores[r * n_ctx..][from..to],
                        &values[at..],
                        cache.kv_dim,
                    );
                }
            }
        }
    }
}

/// Softmax in place with one more logit, `sink`, in the denominator only: the weights sum to less than
/// one by what the sink takes (llama.cpp's soft_max with sinks).
pub(crate) fn softmax_with_sink(x: &mut [f32], sink: f32) {
    let max = x.iter().copied().fold(sink, f32::max);
    x.iter_mut().for_each(|v| *v -= max);
    titan_kernels::exp_in_place(x);
    let sum = x.iter().sum::<f32>() + exp(sink - max);
    let inv = 1.0 / sum;
    for v in x.iter_mut() {
        *v *= inv;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A cache of `n_ctx` positions filled with values of a fixed pseudo-random walk.
    fn filled(n_ctx: usize, kv_dim: usize) -> KvCache {
        let mut cache = KvCache::new(&[true], n_ctx, kv_dim, true);
        let mut x = 0x9e37_79b9_u32;
        let mut next = || {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            (x as f32 / u32::MAX as f32) * 2.0 - 1.0
        };
        let k: Vec<f32> = (0..n_ctx * kv_dim).map(|_| next()).collect();
        let v: Vec<f32> = (0..n_ctx * kv_dim).map(|_| next()).collect();
        cache.store(0, 0, &k, &v);
        cache
    }

    /// Rows attended together — in groups, over tiles of keys, several heads to a task — have the bits of
    /// each row attended alone, with and without a window and sinks, on one thread and on several.
    #[test]
    fn rows_together_have_the_bits_of_rows_alone() {
        let (n_head, n_head_kv, head_dim) = (4, 2, 8);
        let (n_ctx, pos0, n) = (300, 37, 203);
        let cache = filled(n_ctx, n_head_kv * head_dim);
        let sinks = [0.5, -1.0, 2.0, 0.0];
        let q: Vec<f32> = (0..n * n_head * head_dim)
            .map(|i| ((i * 7919) % 101) as f32 / 50.0 - 1.0)
            .collect();
        let cases = [
            (0, 0, None),
            (70, 0, None),
            (0, 0, Some(&sinks[..])),
            (100, 0, Some(&sinks[..])),
            (0, 48, None),
        ];
        for (window, chunk, sinks) in cases {
            let s = AttnShape {
                n_head,
                n_head_kv,
                head_dim,
                window,
                chunk,
                sinks,
            };
            let q_dim = n_head * head_dim;
            let mut alone = vec![0.0; n * q_dim];
            let mut scores = Vec::new();
            for i in 0..n {
                let rows = i * q_dim..(i + 1) * q_dim;
                attend(&cache, 0, &s, pos0 + i, &q[rows.clone()], &mut alone[rows], &mut scores);
            }
            for threads in [1, 3] {
                let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build().unwrap();
                let mut together = vec![f32::NAN; n * q_dim];
                pool.install(|| attend(&cache, 0, &s, pos0, &q, &mut together, &mut scores));
                let differ = alone
                    .iter()
                    .zip(&together)
                    .position(|(a, b)| a.to_bits() != b.to_bits());
                assert_eq!(
                    differ,
                    None,
                    "window {window}, chunk {chunk}, sinks {}, {threads} threads",
                    sinks.is_some()
                );
            }
        }
    }

    /// A chunked layer's query at position p sees positions ⌊p / chunk⌋ · chunk ..= p, as llama.cpp's
    /// chunked mask: the bits of a window of p mod chunk + 1 positions. The chunk is llama.cpp's 8192 in a
    /// model (`config::LLAMA4_CHUNK`); 16 here, so that a batch crosses several chunk boundaries.
    #[test]
    fn a_chunk_sees_the_positions_since_its_start() {
        let (n_head, n_head_kv, head_dim, chunk) = (4, 2, 8, 16);
        let (n_ctx, pos0, n) = (120, 5, 100);
        let cache = filled(n_ctx, n_head_kv * head_dim);
        let q: Vec<f32> = (0..n * n_head * head_dim)
            .map(|i| ((i * 7919) % 101) as f32 / 50.0 - 1.0)
            .collect();
        let shape = |window, chunk| AttnShape {
            n_head,
            n_head_kv,
            head_dim,
            window,
            chunk,
            sinks: None,
        };
        let q_dim = n_head * head_dim;
        let mut chunked = vec![f32::NAN; n * q_dim];
        let mut scores = Vec::new();
        attend(&cache, 0, &shape(0, chunk), pos0, &q, &mut chunked, &mut scores);
        let mut full = vec![f32::NAN; n * q_dim];
        attend(&cache, 0, &shape(0, 0), pos0, &q, &mut full, &mut scores);
        for i in 0..n {
            let (pos, rows) = (pos0 + i, i * q_dim..(i + 1) * q_dim);
            let mut windowed = vec![f32::NAN; q_dim];
            let window = shape(pos % chunk + 1, 0);
            attend(&cache, 0, &window, pos, &q[rows.clone()], &mut windowed, &mut scores);
            assert_eq!(chunked[rows.clone()], windowed[..], "position {pos}");
            // The first position of a chunk sees itself alone; the last sees the whole chunk.
            if pos % chunk == 0 {
                assert_ne!(chunked[rows.clone()], full[rows], "position {pos}");
            }
        }
    }
}
