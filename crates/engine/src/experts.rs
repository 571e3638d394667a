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
    /// Call `f` with the experts `ids` of `layer` (distinct), each as `(index in ids, weights)`, in batches
    /// as they become available: all at once when resident; one by one as their records arrive when
    /// streamed, so computing the first overlaps reading the rest.
    pub fn for_each_batch(&self, w: &Weights, layer: usize, ids: &[u32], mut f: impl FnMut(&[(usize, ExpertWeights<'_>)]) -> Result<()>) -> Result<()> {
        match self {
            ExpertSource::Resident => {
                let l = &w.layers[layer];
                let all: Vec<_> = ids
                    .iter()
                    .enumerate()
                    .map(|(i, &e)| {
                        let e = e as usize;
                        (i, ExpertWeights { gate: w.view(&l.gate_exps.expert(e)), up: w.view(&l.up_exps.expert(e)), down: w.view(&l.down_exps.expert(e)) })
                    })
                    .collect();
                f(&all)
            }
            ExpertSource::Streamed(cache) => {
                // The callback cannot return an error to the cache; keep the first one and stop computing.
                let mut failed: Option<EngineError> = None;
                cache.get_layer_with(layer, ids, &mut |i, rec| {
                    if failed.is_none() {
                        let ew = ExpertWeights { gate: rec.gate().weight_view(), up: rec.up().weight_view(), down: rec.down().weight_view() };
                        if let Err(e) = f(&[(i, ew)]) {
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

/// down(silu(gate(x)) · up(x)) for several feed-forwards at once (the experts of a batch, or the
/// shared expert): `x[i]` holds the rows of FFN `i` already quantised for its gate and up projections.
/// All gate and up products run in one parallel region, then all down products in another.
pub fn swiglu_many(ffns: &[ExpertWeights<'_>], x: &[Activations]) -> Result<Vec<Vec<f32>>> {
    let mut g: Vec<Vec<f32>> = ffns.iter().zip(x).map(|(f, a)| vec![0f32; a.rows() * f.gate.rows]).collect();
    let mut u: Vec<Vec<f32>> = ffns.iter().zip(x).map(|(f, a)| vec![0f32; a.rows() * f.up.rows]).collect();
    let mut jobs: Vec<MatmulJob> = Vec::with_capacity(2 * ffns.len());
    for (((f, a), g), u) in ffns.iter().zip(x).zip(&mut g).zip(&mut u) {
        jobs.push(MatmulJob { w: f.gate, acts: a, out: g });
        jobs.push(MatmulJob { w: f.up, acts: a, out: u });
    }
    matmul_many(&mut jobs)?;
    drop(jobs);
    let mut mid = Vec::with_capacity(ffns.len());
    for ((f, a), (g, u)) in ffns.iter().zip(x).zip(g.iter_mut().zip(&u)) {
        for (p, &q) in g.iter_mut().zip(u) {
            *p = silu(*p) * q;
        }
        let mut m = Activations::new();
        m.quantize(f.down.ty.act_type(), g, a.rows(), f.gate.rows)?;
        mid.push(m);
    }
    let mut y: Vec<Vec<f32>> = ffns.iter().zip(x).map(|(f, a)| vec![0f32; a.rows() * f.down.rows]).collect();
    let mut jobs: Vec<MatmulJob> = ffns.iter().zip(&mid).zip(&mut y).map(|((f, m), y)| MatmulJob { w: f.down, acts: m, out: y }).collect();
    matmul_many(&mut jobs)?;
    Ok(y)
}
