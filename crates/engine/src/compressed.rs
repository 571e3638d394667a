//! DeepSeek-V4's compressed attention entries (docs/deepseek4.md, step 3): per layer of one sequence, what
//! its compressors saw at every position, and the entries of the windows completed so far.
//!
//! An entry is computed once, from its window's stored per-position inputs in one fixed order, by the
//! call that sees the window's last token, before any query of that call reads it. So its bits do not
//! depend on how a prompt is split into calls, or on the batch; and after [`crate::Sequence::truncate`]
//! to n positions the entries of windows ending before n are still those of their inputs, while the
//! others are never read before the call that completes their window again recomputes them (a query at
//! p sees only windows ending at p or before).

use crate::ops::{rms_norm, rope_head};

/// One compressor's memory over a sequence: `ratio` positions to a window, `width` inputs per position
/// (two halves at ratio 4, whose windows overlap), entries of `dim`.
#[derive(Clone)]
pub struct Windows {
    ratio: usize,
    dim: usize,
    /// Per position, the values and the scores (with the position-in-window offset already added).
    values: Vec<f32>,
    scores: Vec<f32>,
    /// Per complete window, its entry (normalised and rotated).
    entries: Vec<f32>,
    /// The slots' weights of one channel (working space).
    weights: Vec<f32>,
}

/// What a compressed layer keeps: its attention's entries, and at ratio 4 its indexer's keys.
#[derive(Clone)]
pub struct LayerState {
    pub attn: Windows,
    pub index: Option<Windows>,
}

impl LayerState {
    /// A layer of compression `ratio` (0: none) for `n_ctx` positions, attention entries of `dim`, indexer
    /// keys of `idx_dim`.
    pub fn new(ratio: usize, dim: usize, idx_dim: usize, n_ctx: usize) -> Option<LayerState> {
        (ratio > 0).then(|| LayerState {
            attn: Windows::new(ratio, dim, n_ctx),
            index: (ratio == 4).then(|| Windows::new(ratio, idx_dim, n_ctx)),
        })
    }

    /// Floats such a layer holds.
    pub fn floats(ratio: usize, dim: usize, idx_dim: usize, n_ctx: usize) -> usize {
        let one = |dim: usize| Windows::floats(ratio, dim, n_ctx);
        match ratio {
            0 => 0,
            4 => one(dim) + one(idx_dim),
            _ => one(dim),
        }
    }
}

impl Windows {
    fn width(ratio: usize, dim: usize) -> usize {
        if ratio == 4 {
            2 * dim
        } else {
            dim
        }
    }

    fn floats(ratio: usize, dim: usize, n_ctx: usize) -> usize {
        2 * n_ctx * Windows::width(ratio, dim) + n_ctx / ratio * dim
    }

    fn new(ratio: usize, dim: usize, n_ctx: usize) -> Windows {
        let width = Windows::width(ratio, dim);
        Windows {
            ratio,
            dim,
            values: vec![0.0; n_ctx * width],
            scores: vec![0.0; n_ctx * width],
            entries: vec![0.0; n_ctx / ratio * dim],
            weights: Vec::with_capacity(2 * ratio),
        }
    }

    fn width_of(&self) -> usize {
        Windows::width(self.ratio, self.dim)
    }

    /// How many entries a query at position `pos` sees: the windows whose last token is at `pos` or before.
    pub fn visible(&self, pos: usize) -> usize {
        (pos + 1) / self.ratio
    }

    /// Entry `w`.
    pub fn entry(&self, w: usize) -> &[f32] {
        &self.entries[w * self.dim..(w + 1) * self.dim]
    }

    /// The entries of windows `0..n`, one after another.
    pub fn entries(&self, n: usize) -> &[f32] {
        &self.entries[..n * self.dim]
    }

    /// Store the inputs of positions `pos0..` (`values` and `scores` rows of the compressor's width;
    /// `ape`: `ratio` rows of offsets by position in window), then compute the entries of the windows
    /// those positions complete, each normalised by `norm` and rotated by `rope(position, head)` at its
    /// window's first position.
    pub fn push(
        &mut self,
        pos0: usize,
        (values, scores): (&[f32], &[f32]),
        ape: &[f32],
        (norm, eps): (&[f32], f32),
        rope: &mut dyn FnMut(usize, &mut [f32]),
    ) {
        let (m, width) = (self.ratio, self.width_of());
        let n = values.len() / width;
        self.values[pos0 * width..(pos0 + n) * width].copy_from_slice(values);
        for (i, (dst, src)) in self.scores[pos0 * width..(pos0 + n) * width]
            .chunks_exact_mut(width)
            .zip(scores.chunks_exact(width))
            .enumerate()
        {
            let offset = &ape[(pos0 + i) % m * width..][..width];
            for ((d, &s), &o) in dst.iter_mut().zip(src).zip(offset) {
                *d = s + o;
            }
        }
        for w in pos0 / m..(pos0 + n) / m {
            self.compress(w);
            let entry = &mut self.entries[w * self.dim..(w + 1) * self.dim];
            rms_norm(entry, norm, eps);
            rope(w * m, entry);
        }
    }

    /// Entry `w` before its norm: per channel, the softmax over the window's slots of their scores weighs
    /// their values. At ratio 4 the slots are the previous window's first halves, then this window's
    /// second halves (the first window has no previous one).
    fn compress(&mut self, w: usize) {
        let (m, dim, width) = (self.ratio, self.dim, self.width_of());
        let Windows {
            values,
            scores,
            entries,
            weights,
            ..
        } = self;
        // (position, offset into the row) of each slot, in order
        let slots = |c: usize| {
            let prev = (m == 4 && w > 0).then(|| ((w - 1) * m..w * m).map(move |p| (p, c)));
            let half = if m == 4 { dim } else { 0 };
            prev.into_iter()
                .flatten()
                .chain((w * m..(w + 1) * m).map(move |p| (p, half + c)))
        };
        for c in 0..dim {
            weights.clear();
            weights.extend(slots(c).map(|(p, at)| scores[p * width + at]));
            crate::ops::softmax(weights);
            entries[w * dim + c] = slots(c)
                .zip(weights.iter())
                .fold(0f32, |acc, ((p, at), &wt)| acc + wt * values[p * width + at]);
        }
    }
}

/// RoPE on the last `cos.len() · 2` values of a vector, adjacent pairs.
pub fn rope_tail(v: &mut [f32], cos: &[f32], sin: &[f32]) {
    let r = 2 * cos.len();
    let at = v.len() - r;
    rope_head(&mut v[at..], cos, sin, false);
}

/// The lightning indexer's choice for one query: of the `keys` (`n` of `dim`), the `top_k` best by
/// Σ_h weight_h · ReLU(q_h · key), ascending, into `chosen` (all of them when there are no more than
/// `top_k`). Ties go to the earlier entry.
pub fn choose(
    q: &[f32],
    weights: &[f32],
    keys: &[f32],
    dim: usize,
    top_k: usize,
    scores: &mut Vec<f32>,
    chosen: &mut Vec<u32>,
) {
    let n = keys.len() / dim;
    chosen.clear();
    chosen.extend(0..n as u32);
    if n <= top_k {
        return;
    }
    scores.clear();
    scores.extend(keys.chunks_exact(dim).map(|k| {
        q.chunks_exact(dim).zip(weights).fold(0f32, |acc, (qh, &wh)| {
            let dot = qh.iter().zip(k).fold(0f32, |s, (&a, &b)| s + a * b);
            acc + wh * dot.max(0.0)
        })
    }));
    // a total order (ties by index), so the unstable sort, which needs no buffer, is deterministic
    chosen.sort_unstable_by(|&a, &b| scores[b as usize].total_cmp(&scores[a as usize]).then(a.cmp(&b)));
    chosen.truncate(top_k);
    chosen.sort_unstable();
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An entry has the same bits whether its window's positions come in one call or one at a time, and a
    /// window is complete (and visible) only once its last position is in.
    #[test]
    fn entries_do_not_depend_on_how_positions_arrive() {
        for ratio in [4, 128] {
            let (dim, n) = (6, 300);
            let width = Windows::width(ratio, dim);
            let values: Vec<f32> = (0..n * width).map(|i| ((i * 37) % 101) as f32 / 50.0 - 1.0).collect();
            let scores: Vec<f32> = (0..n * width).map(|i| ((i * 53) % 97) as f32 / 30.0 - 1.5).collect();
            let ape: Vec<f32> = (0..ratio * width).map(|i| (i % 7) as f32 / 10.0).collect();
            let norm = vec![1.0; dim];
            let mut rope = |pos: usize, e: &mut [f32]| e[0] += pos as f32;
            let mut whole = Windows::new(ratio, dim, n);
            whole.push(0, (&values, &scores), &ape, (&norm, 1e-6), &mut rope);
            let mut steps = Windows::new(ratio, dim, n);
            for p in 0..n {
                let row = p * width..(p + 1) * width;
                steps.push(p, (&values[row.clone()], &scores[row]), &ape, (&norm, 1e-6), &mut rope);
                assert_eq!(steps.visible(p), (p + 1) / ratio);
            }
            let all = n / ratio;
            assert!(all > 0);
            assert_eq!(whole.entries(all), steps.entries(all), "ratio {ratio}");
        }
    }

    #[test]
    fn the_indexer_keeps_the_best_in_ascending_order() {
        // two heads of 2; keys chosen so that scores are 3, -, 5, 1 (key 1 scores 0 after the ReLU)
        let q = [1.0, 0.0, 0.0, 1.0];
        let weights = [1.0, 2.0];
        let keys = [3.0, 0.0, -1.0, -1.0, 1.0, 2.0, 1.0, 0.0];
        let (mut scores, mut chosen) = (Vec::new(), Vec::new());
        choose(&q, &weights, &keys, 2, 2, &mut scores, &mut chosen);
        assert_eq!(chosen, vec![0, 2]);
        choose(&q, &weights, &keys, 2, 4, &mut scores, &mut chosen);
        assert_eq!(chosen, vec![0, 1, 2, 3]);
    }
}
