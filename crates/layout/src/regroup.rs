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

/// Regroups `data` (whole rows of `ty`, `cols` wide) in place when that pays; the layout it is in after.
pub fn regroup_in_place(ty: GgmlType, cols: usize, data: &mut [u8]) -> WeightLayout {
    if pays(ty, cols) && regroup_weights_in_place(ty, cols, data) {
        WeightLayout::Regrouped
    } else {
        WeightLayout::Plain
    }
}
