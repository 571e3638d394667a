//! The seam between the forward pass and the experts' weights.
//!
//! The MoE layer asks this module for "the chosen experts of layer `l`, applied to their rows" and nothing
//! else, so where the weights live — in place in the GGUF mapping, or in a bounded cache fed from an
//! expert store on SSD (and, later, on a peer machine) — never touches the architectures. Whatever serves
//! an expert, its output for a row is a pure function of (row, expert weights), and the caller combines
//! the outputs in ascending expert-id order: see the determinism contract in DESIGN.md.

use titan_kernels::{matmul_f32, WeightView};
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
pub struct ExpertWeights<'a> {
    pub gate: WeightView<'a>,
    pub up: WeightView<'a>,
    pub down: WeightView<'a>,
}

impl ExpertSource {
    /// Call `f(i, weights)` once for each expert `ids[i]` of `layer` (ids distinct), in whatever order the
    /// weights become available.
    pub fn for_each(&self, w: &Weights, layer: usize, ids: &[u32], mut f: impl FnMut(usize, ExpertWeights<'_>) -> Result<()>) -> Result<()> {
        match self {
            ExpertSource::Resident => {
                let l = &w.layers[layer];
                for (i, &e) in ids.iter().enumerate() {
                    let e = e as usize;
                    f(i, ExpertWeights { gate: w.view(&l.gate_exps.expert(e)), up: w.view(&l.up_exps.expert(e)), down: w.view(&l.down_exps.expert(e)) })?;
                }
                Ok(())
            }
            ExpertSource::Streamed(cache) => {
                // The callback cannot return an error to the cache; keep the first one and stop computing.
                let mut failed: Option<EngineError> = None;
                cache.get_layer_with(layer, ids, &mut |i, rec| {
                    if failed.is_none() {
                        let ew = ExpertWeights { gate: rec.gate().weight_view(), up: rec.up().weight_view(), down: rec.down().weight_view() };
                        if let Err(e) = f(i, ew) {
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

/// down(silu(gate(x)) · up(x)), the feed-forward of every expert and of the shared expert.
pub fn swiglu_ffn(gate: &WeightView, up: &WeightView, down: &WeightView, x: &[f32], rows: usize) -> Result<Vec<f32>> {
    let ff = gate.rows;
    let mut g = vec![0f32; rows * ff];
    let mut u = vec![0f32; rows * ff];
    matmul_f32(gate, x, rows, &mut g)?;
    matmul_f32(up, x, rows, &mut u)?;
    for (a, &b) in g.iter_mut().zip(&u) {
        *a = silu(*a) * b;
    }
    let mut y = vec![0f32; rows * down.rows];
    matmul_f32(down, &g, rows, &mut y)?;
    Ok(y)
}
