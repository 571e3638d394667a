//! Matrices laid out for the SIMD kernels: the one rule for when, wherever the bytes come from (the
//! model's mapping at load, a record read from the store, a shard).
//!
//! x86's Q4_0/Q8_0 kernels read a row fastest with its scales first and its quants pre-transposed
//! (`titan_kernels::regroup_weights`): the same bytes rearranged, so the same bits out of the kernels,
//! without the transposition in registers on every call.

use titan_kernels::{regroup_weights, regroup_weights_in_place, regrouped_weights_pay, weights_regroupable};
use titan_kernels::{GgmlType, WeightLayout};

/// Whether the kernels take a `ty` matrix with rows of `cols` regrouped on this machine.
pub fn pays(ty: GgmlType, cols: usize) -> bool {
    weights_regroupable(ty, cols) && regrouped_weights_pay(ty)
}

/// `src` (whole rows of `ty`, `cols` wide) regrouped into a new buffer, when that pays.
pub fn regrouped(ty: GgmlType, cols: usize, src: &[u8]) -> Option<Vec<u8>> {
    if !pays(ty, cols) {
        return None;
    }
    let mut buf = vec![0u8; src.len()];
    regroup_weights(ty, cols, src, &mut buf).then_some(buf)
}

/// Regroups `data` (whole rows of `ty`, `cols` wide) in place when that pays; the layout it is in after.
pub fn regroup_in_place(ty: GgmlType, cols: usize, data: &mut [u8]) -> WeightLayout {
    if pays(ty, cols) && regroup_weights_in_place(ty, cols, data) {
        WeightLayout::Regrouped
    } else {
        WeightLayout::Plain
    }
}
