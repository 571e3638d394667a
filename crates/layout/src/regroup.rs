//! Matrices laid out for the SIMD kernels: the one rule for when, wherever the bytes come from (the
//! model's mapping at load, a record read from the store, a shard).
//!
//! x86's Q4_0, Q8_0 and MXFP4 kernels read a row fastest with its scales first and its quants pre-transposed
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
    let mut buf = huge_zeroed(src.len());
    regroup_weights(ty, cols, src, &mut buf).then_some(buf)
}

/// A zeroed buffer of `len` bytes that the kernel backs with transparent huge pages where it can
/// (`MADV_HUGEPAGE`, before any page is touched): decode streams these matrices once per token, and
/// 2 MiB pages spare it a TLB miss every 4 KiB and let the hardware prefetcher run past what would be a
/// page boundary. On the Zen 4 EPYC (THP in `madvise` mode) gpt-oss-20b's 8-layer file decoded 8%
/// faster with its regrouped copies so backed (four interleaved pairs, every pair faster) and loaded no
/// slower (2 MiB faults, 512 times fewer). Advice only: where it is refused the buffer is as `vec!`
/// makes it.
fn huge_zeroed(len: usize) -> Vec<u8> {
    let mut buf = vec![0u8; len];
    #[cfg(target_os = "linux")]
    {
        const PAGE: usize = 4096;
        let start = buf.as_mut_ptr() as usize;
        let first = start.next_multiple_of(PAGE);
        let pages = (start + len).saturating_sub(first) / PAGE * PAGE;
        if pages >= 2 << 20 {
            // SAFETY: `first .. first + pages` lies inside `buf`'s allocation (page-aligned, whole pages), and
            // MADV_HUGEPAGE changes how its pages are backed, never their contents (zero, as `vec!` made them).
            unsafe { libc::madvise(first as *mut libc::c_void, pages, libc::MADV_HUGEPAGE) };
        }
    }
    buf
}

/// Regroups `data` (whole rows of `ty`, `cols` wide: a matrix of an expert record streamed from the
/// store) in place when that pays; the layout it is in after. Regrouping is one pass over the record on the
/// reading thread, repaid only over the uses the record gets before it is evicted. For Q4_0 and Q8_0 one
/// use repays it; MXFP4's does not: on the Zen 4 EPYC, gpt-oss-20b's 8-layer file with a 1 GiB budget for
/// its 3.15 GiB of experts decoded 8% slower and prompted 18% slower with its records regrouped (three
/// interleaved pairs of `titan bench -p 16 -n 32 --expert-budget 1GiB`, every pair), as 13.3 MB of
/// odd-sized 17-byte blocks are regrouped per miss, so streamed MXFP4 records stay plain.
pub fn regroup_in_place(ty: GgmlType, cols: usize, data: &mut [u8]) -> WeightLayout {
    if ty != GgmlType::MXFP4 && pays(ty, cols) && regroup_weights_in_place(ty, cols, data) {
        WeightLayout::Regrouped
    } else {
        WeightLayout::Plain
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn streamed_records_regroup_q4_0_where_it_pays_and_leave_mxfp4_plain() {
        // One row of 256 elements: a whole group of either type.
        let mut q4_0 = vec![0u8; GgmlType::Q4_0.row_bytes(256).unwrap()];
        let want = if pays(GgmlType::Q4_0, 256) {
            WeightLayout::Regrouped
        } else {
            WeightLayout::Plain
        };
        assert_eq!(regroup_in_place(GgmlType::Q4_0, 256, &mut q4_0), want);
        let mut mxfp4: Vec<u8> = (0..GgmlType::MXFP4.row_bytes(256).unwrap()).map(|i| i as u8).collect();
        let before = mxfp4.clone();
        assert_eq!(regroup_in_place(GgmlType::MXFP4, 256, &mut mxfp4), WeightLayout::Plain);
        assert_eq!(mxfp4, before, "a plain record's bytes are left as they are");
        // Resident MXFP4 matrices are regrouped where the kernels take them so.
        assert_eq!(
            regrouped(GgmlType::MXFP4, 256, &before).is_some(),
            pays(GgmlType::MXFP4, 256)
        );
    }
}
