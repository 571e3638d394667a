//! DeepSeek-V4's hyper-connections (docs/deepseek4.md, step 2): the residual is `hc` streams of n_embd per
//! row. Each site (the mixer, the feed-forward) collapses them into its input with weights of their own
//! making, runs, and writes its output back into every stream beside a Sinkhorn-balanced mix of the old
//! ones; the head collapses them once more.
//!
//! Everything here is per row, in one fixed order, so a row's bits do not depend on its batch.

use titan_kernels::dot_f32;

use crate::ops::{rms_norm_unweighted, sigmoid};
use crate::weights::Hyper;

/// The constants of a model's hyper-connections.
#[derive(Clone, Copy, Debug)]
pub struct Streams {
    /// Streams per row.
    pub hc: usize,
    pub n_embd: usize,
    /// The RMS norm's epsilon, and the one added to every mixing weight.
    pub rms_eps: f32,
    pub eps: f32,
    pub sinkhorn_iters: usize,
}

/// One site's mixing numbers for a batch: per row, the collapse weights (`hc`), the output placement
/// (`hc`) and the stream mixer (`hc × hc`, source-major).
#[derive(Default)]
pub struct SiteMix {
    pre: Vec<f32>,
    post: Vec<f32>,
    comb: Vec<f32>,
    /// One row's normalised streams and raw mixing numbers.
    flat: Vec<f32>,
    raw: Vec<f32>,
    /// One row's new streams.
    row: Vec<f32>,
}

impl Streams {
    fn width(&self) -> usize {
        self.hc * self.n_embd
    }

    /// Every row of `x` (n_embd each) repeated into `hc` streams, into `streams`.
    pub fn spread(&self, x: &[f32], streams: &mut Vec<f32>) {
        streams.clear();
        for row in x.chunks_exact(self.n_embd) {
            for _ in 0..self.hc {
                streams.extend_from_slice(row);
            }
        }
    }

    /// The function of `site` applied to the unweighted-normalised streams of one row, into `m.raw`.
    fn raw(&self, site: &Hyper, streams: &[f32], m: &mut SiteMix) {
        m.flat.clear();
        m.flat.extend_from_slice(streams);
        rms_norm_unweighted(&mut m.flat, self.width(), self.rms_eps);
        m.raw.clear();
        m.raw
            .extend(site.func.chunks_exact(self.width()).map(|f| dot_f32(f, &m.flat)));
    }

    /// Site `site`'s mixing numbers for every row of `streams`, into `m`, and each row's collapsed input
    /// Σᵢ preᵢ · streamᵢ into `u` (n_embd per row).
    pub fn collapse(&self, site: &Hyper, streams: &[f32], m: &mut SiteMix, u: &mut Vec<f32>) {
        let hc = self.hc;
        let (scale, base) = (&site.scale, &site.base);
        m.pre.clear();
        m.post.clear();
        m.comb.clear();
        for row in streams.chunks_exact(self.width()) {
            self.raw(site, row, m);
            let raw = &m.raw;
            m.pre
                .extend((0..hc).map(|i| sigmoid(raw[i] * scale[0] + base[i]) + self.eps));
            m.post
                .extend((hc..2 * hc).map(|i| 2.0 * sigmoid(raw[i] * scale[1] + base[i])));
            let at = m.comb.len();
            m.comb
                .extend((2 * hc..(2 + hc) * hc).map(|i| raw[i] * scale[2] + base[i]));
            self.sinkhorn(&mut m.comb[at..]);
        }
        self.weigh(&m.pre, streams, u);
    }

    /// The head's collapse of every row of `streams` into `u`: its pre weights alone, with one scale.
    pub fn head(&self, site: &Hyper, streams: &[f32], m: &mut SiteMix, u: &mut Vec<f32>) {
        m.pre.clear();
        for row in streams.chunks_exact(self.width()) {
            self.raw(site, row, m);
            let pre = m
                .raw
                .iter()
                .zip(&site.base)
                .map(|(&r, &b)| sigmoid(r * site.scale[0] + b) + self.eps);
            m.pre.extend(pre);
        }
        self.weigh(&m.pre, streams, u);
    }

    /// Σᵢ wᵢ · streamᵢ per row, streams in order.
    fn weigh(&self, weights: &[f32], streams: &[f32], u: &mut Vec<f32>) {
        let d = self.n_embd;
        u.clear();
        for (row, w) in streams.chunks_exact(self.width()).zip(weights.chunks_exact(self.hc)) {
            let at = u.len();
            u.resize(at + d, 0.0);
            for (stream, &wi) in row.chunks_exact(d).zip(w) {
                for (o, &v) in u[at..].iter_mut().zip(stream) {
                    *o += wi * v;
                }
            }
        }
    }

    /// The mixer (`comb[src · hc + dst]`) made doubly stochastic: a softmax over the destinations of each
    /// source, then alternating normalisations of the destinations' and the sources' sums, each sum offset
    /// by the epsilon, in the references' order.
    fn sinkhorn(&self, comb: &mut [f32]) {
        let (hc, eps) = (self.hc, self.eps);
        for src in comb.chunks_exact_mut(hc) {
            crate::ops::softmax(src);
            src.iter_mut().for_each(|v| *v += eps);
        }
        let by_dst = |comb: &mut [f32]| {
            for dst in 0..hc {
                let sum = (0..hc).fold(0f32, |s, src| s + comb[src * hc + dst]) + eps;
                (0..hc).for_each(|src| comb[src * hc + dst] /= sum);
            }
        };
        by_dst(comb);
        for _ in 1..self.sinkhorn_iters {
            for src in comb.chunks_exact_mut(hc) {
                let sum = src.iter().sum::<f32>() + eps;
                src.iter_mut().for_each(|v| *v /= sum);
            }
            by_dst(comb);
        }
    }

    /// The site's output `y` (n_embd per row) written back: each row's stream `dst` becomes
    /// post[dst] · y + Σ_src comb[src][dst] · stream[src].
    pub fn expand(&self, m: &mut SiteMix, y: &[f32], streams: &mut [f32]) {
        let (hc, d) = (self.hc, self.n_embd);
        let SiteMix { post, comb, row, .. } = m;
        for (((x, y), post), comb) in streams
            .chunks_exact_mut(self.width())
            .zip(y.chunks_exact(d))
            .zip(post.chunks_exact(hc))
            .zip(comb.chunks_exact(hc * hc))
        {
            row.clear();
            for (dst, &p) in post.iter().enumerate() {
                row.extend(y.iter().map(|&v| p * v));
                let out = &mut row[dst * d..];
                for src in 0..hc {
                    let c = comb[src * hc + dst];
                    for (o, &v) in out.iter_mut().zip(&x[src * d..(src + 1) * d]) {
                        *o += c * v;
                    }
                }
            }
            x.copy_from_slice(row);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// After Sinkhorn every source's weights and every destination's weights sum to about one.
    #[test]
    fn sinkhorn_balances_rows_and_columns() {
        let s = Streams {
            hc: 4,
            n_embd: 1,
            rms_eps: 1e-6,
            eps: 1e-6,
            sinkhorn_iters: 20,
        };
        let mut comb: Vec<f32> = (0..16).map(|i| ((i * 7) % 5) as f32 - 2.0).collect();
        s.sinkhorn(&mut comb);
        for i in 0..4 {
            let src: f32 = comb[i * 4..(i + 1) * 4].iter().sum();
            let dst: f32 = (0..4).map(|j| comb[j * 4 + i]).sum();
            assert!((src - 1.0).abs() < 1e-3 && (dst - 1.0).abs() < 1e-3, "{src} {dst}");
        }
    }
}
