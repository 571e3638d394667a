//! Mixture-of-experts: routing (f32 softmax, top-k with ties broken by ascending expert id) and the
//! canonical combination of the chosen experts' outputs.

use titan_kernels::Activations;

use crate::config::Config;
use crate::experts::{swiglu_many, ExpertSource, ExpertWeights};
use crate::ops::sigmoid;
use crate::weights::{SharedExpert, Weights};
use crate::Result;

/// The routing decision for a batch: per row, `k` (expert id, weight) pairs in ascending expert-id order.
#[derive(Clone, Debug, PartialEq)]
pub struct Routing {
    pub k: usize,
    pub ids: Vec<u32>,
    pub weights: Vec<f32>,
}

/// Route each row of `logits` (`n_expert` router logits per row).
pub fn route(logits: &[f32], n_expert: usize, k: usize, norm_topk: bool) -> Routing {
    let rows = logits.len() / n_expert;
    let mut ids = Vec::with_capacity(rows * k);
    let mut weights = Vec::with_capacity(rows * k);
    let mut probs = vec![0f32; n_expert];
    let mut order: Vec<u32> = Vec::with_capacity(n_expert);
    for row in logits.chunks_exact(n_expert) {
        probs.copy_from_slice(row);
        crate::ops::softmax(&mut probs);
        order.clear();
        order.extend(0..n_expert as u32);
        // Highest probability first; equal probabilities by ascending id, so the choice is total and stable.
        order.sort_by(|&a, &b| probs[b as usize].total_cmp(&probs[a as usize]).then(a.cmp(&b)));
        let chosen = &mut order[..k];
        let scale = if norm_topk { 1.0 / chosen.iter().fold(0f32, |s, &e| s + probs[e as usize]) } else { 1.0 };
        chosen.sort_unstable();
        for &e in chosen.iter() {
            ids.push(e);
            weights.push(probs[e as usize] * scale);
        }
    }
    Routing { k, ids, weights }
}

/// The MoE block for `rows` rows of `x` (already normalised) routed by `routing`: the chosen experts,
/// combined canonically, plus the shared expert if any.
pub fn moe_block(w: &Weights, experts: &ExpertSource, c: &Config, layer: usize, x: &[f32], rows: usize, routing: &Routing) -> Result<Vec<f32>> {
    let d = c.n_embd;

    // Group rows by expert so each expert's weights are read once per batch.
    let mut slots_of: Vec<Vec<usize>> = vec![Vec::new(); c.n_expert];
    for (slot, &e) in routing.ids.iter().enumerate() {
        slots_of[e as usize].push(slot);
    }
    let ids: Vec<u32> = (0..c.n_expert as u32).filter(|&e| !slots_of[e as usize].is_empty()).collect();

    // The layer's input is quantised once; each expert gets its rows as byte copies of those rows.
    let l = &w.layers[layer];
    let in_ty = l.gate_exps.mat.ty.act_type();
    let mut input = Activations::new();
    input.quantize(in_ty, x, rows, d)?;

    // contributions[slot] = the expert's output for (row, slot), slot = row * k + j.
    let mut contributions = vec![0f32; rows * routing.k * d];
    experts.for_each_batch(w, layer, &ids, |batch| {
        let mut acts = Vec::with_capacity(batch.len());
        for (i, ew) in batch {
            let row_idx: Vec<usize> = slots_of[ids[*i] as usize].iter().map(|&slot| slot / routing.k).collect();
            let mut a = Activations::new();
            if ew.gate.ty.act_type() == in_ty && ew.up.ty.act_type() == in_ty {
                a.gather_from(&input, &row_idx);
            } else {
                // Gate and up of another type than the layer's first expert (rare): quantise these rows for them.
                let rows_f32: Vec<f32> = row_idx.iter().flat_map(|&r| x[r * d..(r + 1) * d].iter().copied()).collect();
                a.quantize(ew.gate.ty.act_type(), &rows_f32, row_idx.len(), d)?;
            }
            acts.push(a);
        }
        let ffns: Vec<ExpertWeights> = batch.iter().map(|(_, ew)| *ew).collect();
        let ys = swiglu_many(&ffns, &acts)?;
        for ((i, _), y) in batch.iter().zip(&ys) {
            for (yi, &slot) in y.chunks_exact(d).zip(&slots_of[ids[*i] as usize]) {
                contributions[slot * d..(slot + 1) * d].copy_from_slice(yi);
            }
        }
        Ok(())
    })?;

    // Canonical combination: Σ w_e · y_e in ascending expert-id order (the slots are already in that order),
    // after every contribution has arrived, one multiply and one add per term.
    let mut out = vec![0f32; rows * d];
    for r in 0..rows {
        let acc = &mut out[r * d..(r + 1) * d];
        for j in 0..routing.k {
            let slot = r * routing.k + j;
            let wgt = routing.weights[slot];
            for (a, &y) in acc.iter_mut().zip(&contributions[slot * d..(slot + 1) * d]) {
                *a += wgt * y;
            }
        }
    }

    if let Some(sh) = &w.layers[layer].shared {
        shared_expert(w, sh, x, rows, d, &mut out)?;
    }
    Ok(out)
}

/// Qwen2-MoE's shared expert: out += sigmoid(x · gate_inp) · ffn(x).
fn shared_expert(w: &Weights, sh: &SharedExpert, x: &[f32], rows: usize, d: usize, out: &mut [f32]) -> Result<()> {
    let mut acts = Activations::new();
    acts.quantize(sh.gate.ty.act_type(), x, rows, d)?;
    let ffn = ExpertWeights { gate: w.view(&sh.gate), up: w.view(&sh.up), down: w.view(&sh.down) };
    let y = swiglu_many(&[ffn], &[acts])?.remove(0);
    for r in 0..rows {
        let xr = &x[r * d..(r + 1) * d];
        let g = sigmoid(xr.iter().zip(&sh.gate_inp).fold(0f32, |s, (a, b)| s + a * b));
        for (o, &v) in out[r * d..(r + 1) * d].iter_mut().zip(&y[r * d..(r + 1) * d]) {
            *o += v * g;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn top_k_ties_break_by_ascending_id_and_output_is_sorted() {
        // experts 1 and 3 tie for the top; 0 and 2 tie below.
        let r = route(&[1.0, 2.0, 1.0, 2.0], 4, 3, false);
        assert_eq!(r.ids, vec![0, 1, 3]);
        let r = route(&[5.0, 0.0, 0.0, 1.0], 4, 2, true);
        assert_eq!(r.ids, vec![0, 3]);
        assert!((r.weights[0] + r.weights[1] - 1.0).abs() < 1e-6);
        assert!(r.weights[0] > r.weights[1]);
    }
}
