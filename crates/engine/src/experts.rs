//! The seam between the forward pass and the experts' weights.
//!
//! The MoE layer asks this module for "expert `e` of layer `l` applied to these rows" and nothing else,
//! so where the weights live — the GGUF mapping today; a bounded cache fed from an expert store on SSD,
//! or a peer machine, later — never touches the architectures. Whatever serves it, an expert's output
//! for a row is a pure function of (row, expert weights): see the determinism contract in DESIGN.md.

use titan_kernels::matmul_f32;

use crate::ops::silu;
use crate::weights::{Mat, Weights};
use crate::Result;

pub struct Experts<'a> {
    weights: &'a Weights,
}

impl<'a> Experts<'a> {
    pub fn resident(weights: &'a Weights) -> Self {
        Experts { weights }
    }

    /// `x`: `rows` rows of n_embd; returns `rows` rows of n_embd.
    pub fn forward(&self, layer: usize, expert: usize, x: &[f32], rows: usize) -> Result<Vec<f32>> {
        let l = &self.weights.layers[layer];
        swiglu_ffn(self.weights, &l.gate_exps.expert(expert), &l.up_exps.expert(expert), &l.down_exps.expert(expert), x, rows)
    }
}

/// down(silu(gate(x)) · up(x)), the feed-forward of every expert and of the shared expert.
pub fn swiglu_ffn(w: &Weights, gate: &Mat, up: &Mat, down: &Mat, x: &[f32], rows: usize) -> Result<Vec<f32>> {
    let ff = gate.rows;
    let mut g = vec![0f32; rows * ff];
    let mut u = vec![0f32; rows * ff];
    matmul_f32(&w.view(gate), x, rows, &mut g)?;
    matmul_f32(&w.view(up), x, rows, &mut u)?;
    for (a, &b) in g.iter_mut().zip(&u) {
        *a = silu(*a) * b;
    }
    let mut y = vec![0f32; rows * down.rows];
    matmul_f32(&w.view(down), &g, rows, &mut y)?;
    Ok(y)
}
