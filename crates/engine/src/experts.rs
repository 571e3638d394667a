//! The seam between the forward pass and the experts' weights.
//!
//! The MoE layer asks this module for "the chosen experts of layer `l`, applied to their rows" and nothing
//! else, so where the weights live — in place in the GGUF mapping, or in a bounded cache fed from an
//! expert store on SSD (and, later, on a peer machine) — never touches the architectures. Whatever serves
//! an expert, its output for a row is a pure function of (row, expert weights), and the caller combines
//! the outputs in ascending expert-id order: see the determinism contract in DESIGN.md.

use titan_kernels::{matmul_many, Activations, MatmulJob, WeightView};
use titan_store::ExpertCache;

use crate::ops::silu;
use crate::scratch::{recycle, slots};
use crate::weights::Weights;
use crate::{EngineError, Result};

/// Where the experts come from.
pub enum ExpertSource {
    /// Read in place from the GGUF mapping (the whole model fits in memory, or the page cache copes).
    Resident,
    /// Served by a bounded cache over an expert store: a layer's misses are read together, and each
    /// expert is computed as soon as its record has arrived.
    Streamed(ExpertCache),
}

/// One expert's three matrices.
#[derive(Clone, Copy)]
pub struct ExpertWeights<'a> {
    pub gate: WeightView<'a>,
    pub up: WeightView<'a>,
    pub down: WeightView<'a>,
}

impl ExpertSource {
    /// Call `f(first, batch)` with the experts `ids[first..first + batch.len()]` of `layer` (distinct), in
    /// batches as they become available: all at once when resident; one by one as their records arrive
    /// when streamed, so computing the first overlaps reading the rest. `views` is kept empty by the
    /// caller and lends its allocation to the resident batch's list.
    pub fn for_each_batch(
        &self,
        w: &Weights,
        layer: usize,
        ids: &[u32],
        views: &mut Vec<ExpertWeights<'static>>,
        mut f: impl FnMut(usize, &[ExpertWeights<'_>]) -> Result<()>,
    ) -> Result<()> {
        match self {
            ExpertSource::Resident => {
                let l = &w.layers[layer];
                let mut all: Vec<ExpertWeights> = recycle(std::mem::take(views));
                all.extend(ids.iter().map(|&e| {
                    let e = e as usize;
                    ExpertWeights { gate: w.view(&l.gate_exps.expert(e)), up: w.view(&l.up_exps.expert(e)), down: w.view(&l.down_exps.expert(e)) }
                }));
                let r = f(0, &all);
                *views = recycle(all);
                r
            }
            ExpertSource::Streamed(cache) => {
                // The callback cannot return an error to the cache; keep the first one and stop computing.
                let mut failed: Option<EngineError> = None;
                cache.get_layer_with(layer, ids, &mut |i, rec| {
                    if failed.is_none() {
                        let ew = ExpertWeights { gate: rec.gate().weight_view(), up: rec.up().weight_view(), down: rec.down().weight_view() };
                        if let Err(e) = f(i, std::slice::from_ref(&ew)) {
                            failed = Some(e);
                        }
                    }
                })?;
                failed.map_or(Ok(()), Err)
            }
        }
    }

    pub fn cache(&self) -> Option<&ExpertCache> {
        match self {
            ExpertSource::Resident => None,
            ExpertSource::Streamed(c) => Some(c),
        }
    }
}

/// The working buffers of [`swiglu_many`], kept between calls: per feed-forward, its gate and up
/// outputs, their quantised product and its output.
#[derive(Default)]
pub struct FfnScratch {
    gate: Vec<Vec<f32>>,
    up: Vec<Vec<f32>>,
    mid: Vec<Activations>,
    out: Vec<Vec<f32>>,
    /// Always empty: the allocation of the matmul job lists (see [`recycle`]).
    jobs: Vec<MatmulJob<'static>>,
}

/// down(silu(gate(x)) · up(x)) for several feed-forwards at once (the experts of a batch, or the
/// shared expert): `x[i]` holds the rows of FFN `i` already quantised for its gate and up projections,
/// and the result's element `i` its output rows. All gate and up products run in one parallel region,
/// then all down products in another.
pub fn swiglu_many<'s>(ffns: &[ExpertWeights<'_>], x: &[Activations], s: &'s mut FfnScratch) -> Result<&'s [Vec<f32>]> {
    let n = ffns.len();
    let (gate, up, mid, out) = (slots(&mut s.gate, n), slots(&mut s.up, n), slots(&mut s.mid, n), slots(&mut s.out, n));
    let mut jobs: Vec<MatmulJob> = recycle(std::mem::take(&mut s.jobs));
    for (((f, a), g), u) in ffns.iter().zip(x).zip(gate.iter_mut()).zip(up.iter_mut()) {
        g.resize(a.rows() * f.gate.rows, 0.0);
        u.resize(a.rows() * f.up.rows, 0.0);
        jobs.push(MatmulJob { w: f.gate, acts: a, out: g });
        jobs.push(MatmulJob { w: f.up, acts: a, out: u });
    }
    matmul_many(&mut jobs)?;
    // A fresh list for the down products: this ends the first list's borrows of `gate` and `up`.
    let mut jobs: Vec<MatmulJob> = recycle(jobs);
    for (((f, a), (g, u)), m) in ffns.iter().zip(x).zip(gate.iter_mut().zip(up.iter())).zip(mid.iter_mut()) {
        for (p, &q) in g.iter_mut().zip(u.iter()) {
            *p = silu(*p) * q;
        }
        m.quantize(f.down.ty.act_type(), g, a.rows(), f.gate.rows)?;
    }
    for ((f, m), y) in ffns.iter().zip(mid.iter()).zip(out.iter_mut()) {
        y.resize(m.rows() * f.down.rows, 0.0);
        jobs.push(MatmulJob { w: f.down, acts: m, out: y });
    }
    matmul_many(&mut jobs)?;
    s.jobs = recycle(jobs);
    Ok(&s.out[..n])
}
