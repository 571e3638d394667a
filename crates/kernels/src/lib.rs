//! TITAN's compute kernels: the GGUF tensor formats (bit-compatible with ggml), activation
//! quantisation, dot products and the matrix multiply built on them.
//!
//! # Formats
//!
//! Weights: F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, MXFP4.
//! Activations: F32, Q8_0, Q8_1, Q8_K ([`GgmlType::act_type`] says which goes with which; the
//! activation formats also work as weights, paired with themselves). One module per format under
//! `formats/` holds its byte layout, dequantisation, dot product and, for activation formats,
//! quantisation. MXFP4's 4-bit floats are read as integers (twice their value, with the scale halved,
//! as ggml does), so it follows the integer rules below like the other 32-element formats.
//!
//! # Determinism contract
//!
//! A result never depends on the thread count, on how many rows share a call, or on which
//! instruction set computed it. That is what lets a trace taken on one machine match
//! one taken on several, byte for byte. The rules that make it so:
//!
//! - **One output, one dot product, one thread.** Every output of [`matmul`] is a single [`vec_dot`]
//!   over the whole row. Threads split the work over output (weight) rows only, never over the
//!   reduction dimension, and a batched call computes each output exactly as a single-row call does.
//! - **Integer work is exact, float work has one fixed order.** Inside a quantised block the products
//!   of quants (and, for K-quants, their sub-block scales and the mins against Q8_K's `bsums`) are summed
//!   in `i32`, which is exact, so a SIMD twin may sum them in any order. Each block then becomes one f32
//!   term with a fixed formula, written on each format's `vec_dot`, e.g. `(d_w · d_a) · f32(sumi)` for
//!   Q4_0 or `(d_w · d_a) · f32(sumi) - (dmin_w · d_a) · f32(summ)` for Q4_K. Term `b` is added to lane
//!   `b % 8` of eight f32 accumulators, which are reduced in the tree
//!   `((l0 + l4) + (l2 + l6)) + ((l1 + l5) + (l3 + l7))` — the order an AVX2 register reduces in.
//! - **Float weights** (F32, F16, BF16) take F32 activations (not f16, as llama.cpp does: more accurate).
//!   Weights are widened to f32 (exact), product `i` goes to lane `i % 8`, and the lanes are reduced in
//!   the same tree.
//! - **No fused multiply-add** anywhere in the scalar path: every product is rounded before it is
//!   added, as a SIMD twin with separate `mul` and `add` would do. (Rust never contracts `a * b + c`.)
//!
//! # Instruction sets
//!
//! Kernels are chosen at run time ([`isa`], [`set_isa`], the `TITAN_ISA` environment variable; see
//! `simd/`). AVX2 and AVX-512 (with VNNI) have kernels for Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, MXFP4,
//! Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, F32, F16, BF16 and the Q8_0 and Q8_K quantisers; every other
//! format runs its scalar twin on any ISA. Each kernel yields the scalar twin's bits: it follows
//! the rules above with exact integer sums, the same per-block f32 formula, separate multiply and
//! add, and the same lanes.
//!
//! The element-wise activations ([`exp_in_place`], [`silu_mul`]) evaluate `libm::expf`'s algorithm
//! eight lanes at a time on AVX2 and AVX-512, giving its bits for every input.
//!
//! On aarch64, [`Isa::Neon`] has kernels for the same formats and quantisers. It needs the ARMv8.2
//! dot product `sdot` (Apple M1, Graviton2, Cortex-A76 and later); older cores run scalar. An
//! 8-lane accumulator is two 4-lane registers (lanes 0..4 and 4..8), reduced in the tree above
//! (`accum.rs`) rather than in `vaddvq`'s order, and no kernel uses `fmla`. The kernels are tested
//! like the x86 ones (`simd/tests.rs` runs every available ISA against scalar, bit for bit), on an
//! x86 machine under emulation: `tools/test_aarch64.sh` cross-builds the tests and runs them in
//! `qemu-aarch64 -cpu max`, and fails if the emulated CPU does not offer NEON with `sdot`.
//!
//! # Layouts
//!
//! The SIMD Q4_0, Q5_0, Q8_0 and MXFP4 kernels read Q8_0 activations in a grouped layout
//! (`grouped.rs`: eight blocks side by side, block `k` in lane `k`), which [`Activations`] keeps
//! beside the plain rows. Their weights are plain GGUF rows, transposed into that arrangement in
//! registers, or (Q4_0, Q8_0 and MXFP4) — where [`regrouped_weights_pay`] — regrouped once at load by
//! [`regroup_weights`] ([`WeightLayout`]), which the scalar twin undoes block by block. Layouts move
//! bytes only: every layout gives the same bits.
//!
//! # Rounding of activations
//!
//! Activation quantisation follows llama.cpp's reference functions, so TITAN feeds the dot products
//! the same activation information llama.cpp does:
//!
//! - Q8_0 / Q8_1 (`quantize_row_q8_0_ref`, `quantize_row_q8_1_ref`): `d = amax / 127`, quants
//!   `round(x · (1 / d))` with C `roundf`'s rounding (half away from zero); `d` (and Q8_1's
//!   `s = Σq · d`) stored as f16, rounded to nearest even.
//! - Q8_K (`quantize_row_q8_K_ref`): `iscale = -127 / max` with `max` the first element of largest
//!   magnitude, quants `min(127, round_half_even(iscale · x))`, `d = 1 / iscale` stored as f32,
//!   `bsums` the exact sums of 16 quants.
//!
//! Dequantisation reproduces ggml's and gguf-py's values bit for bit (same operations, same order,
//! all in f32); the tests check that against vectors generated by `tools/gen_quant_vectors.py`.

mod accum;
mod activation;
mod error;
mod float_dot;
mod formats;
mod grouped;
mod matmul;
mod simd;
pub mod splitmix;
#[cfg(test)]
mod testutil;
mod types;
mod warm;

pub use activation::{exp, exp_in_place, silu, silu_in_place, silu_mul};
pub use error::KernelError;
pub use float_dot::{add_weighted_rows, delta_rule_rows, dot_f32, dot_rows, DeltaStep};
pub use grouped::weights_regroupable;
pub use matmul::{
    matmul, matmul_f32, matmul_many, regroup_weights, regroup_weights_in_place, Activations, MatmulJob, WeightLayout,
    WeightView,
};
pub use simd::{available_isas, isa, kernel_isa, regrouped_weights_pay, set_isa, Isa};
pub use types::GgmlType;
pub use warm::{set_polling, stay_warm};

use formats::{bf16, fp16, fp32, mxfp4, q2_k, q3_k, q4_0, q4_1, q4_k, q5_0, q5_1, q5_k, q6_k, q8_0, q8_1, q8_k};

/// Bytes taken by `n` elements of `ty`, or the error that says why `n` does not fit.
pub(crate) fn checked_row_bytes(ty: GgmlType, n: usize) -> Result<usize, KernelError> {
    if !n.is_multiple_of(ty.block_len()) {
        return Err(KernelError::NotWholeBlocks {
            ty,
            len: n,
            block_len: ty.block_len(),
        });
    }
    ty.row_bytes(n).ok_or(KernelError::TooLarge {
        what: "row",
        rows: 1,
        cols: n,
    })
}

/// Decodes `dst.len()` elements of type `ty` from `src`, which must hold exactly that many.
pub fn dequantize_row(ty: GgmlType, src: &[u8], dst: &mut [f32]) -> Result<(), KernelError> {
    let expected = checked_row_bytes(ty, dst.len())?;
    if src.len() != expected {
        return Err(KernelError::SizeMismatch {
            what: "source row",
            unit: "bytes",
            expected,
            actual: src.len(),
        });
    }
    dequantize_blocks(ty, src, dst);
    Ok(())
}

/// Dequantises whole blocks; the caller has checked that `src` and `dst` describe the same blocks.
pub(crate) fn dequantize_blocks(ty: GgmlType, src: &[u8], dst: &mut [f32]) {
    match ty {
        GgmlType::F32 => fp32::dequantize(src, dst),
        GgmlType::F16 => fp16::dequantize(src, dst),
        GgmlType::BF16 => bf16::dequantize(src, dst),
        GgmlType::Q4_0 => q4_0::dequantize(src, dst),
        GgmlType::Q4_1 => q4_1::dequantize(src, dst),
        GgmlType::Q5_0 => q5_0::dequantize(src, dst),
        GgmlType::Q5_1 => q5_1::dequantize(src, dst),
        GgmlType::Q8_0 => q8_0::dequantize(src, dst),
        GgmlType::Q8_1 => q8_1::dequantize(src, dst),
        GgmlType::Q2_K => q2_k::dequantize(src, dst),
        GgmlType::Q3_K => q3_k::dequantize(src, dst),
        GgmlType::Q4_K => q4_k::dequantize(src, dst),
        GgmlType::Q5_K => q5_k::dequantize(src, dst),
        GgmlType::Q6_K => q6_k::dequantize(src, dst),
        GgmlType::Q8_K => q8_k::dequantize(src, dst),
        GgmlType::MXFP4 => mxfp4::dequantize(src, dst),
        // Integers as numbers (exact up to 2^24: a table's indices).
        GgmlType::I32 => {
            for (d, b) in dst.iter_mut().zip(src.chunks_exact(4)) {
                *d = i32::from_le_bytes([b[0], b[1], b[2], b[3]]) as f32;
            }
        }
    }
}

/// Encodes the activations `src` as `act_ty` (F32, Q8_0, Q8_1 or Q8_K) into `dst`, which must be
/// exactly `act_ty.row_bytes(src.len())` long. Rounding is documented at the crate root.
pub fn quantize_row(act_ty: GgmlType, src: &[f32], dst: &mut [u8]) -> Result<(), KernelError> {
    let quantize = simd::quant_kernel(isa(), act_ty)?;
    let expected = checked_row_bytes(act_ty, src.len())?;
    if dst.len() != expected {
        return Err(KernelError::SizeMismatch {
            what: "destination row",
            unit: "bytes",
            expected,
            actual: dst.len(),
        });
    }
    quantize.run(src, dst);
    Ok(())
}

/// Dot product of one weight row (`n` elements of `w_ty`) with one activation row already encoded as
/// `w_ty.act_type()`, in the fixed order documented at the crate root, on the instruction set
/// [`isa`] selects.
///
/// # Panics
///
/// If `n` is not a whole number of blocks or a row is shorter than `n` elements; debug builds also
/// check that both rows are exactly `n` elements long. (A single dot, for tests and tools: [`matmul`]
/// is the checked and fast entry point.)
pub fn vec_dot(w_ty: GgmlType, n: usize, w: &[u8], act: &[u8]) -> f32 {
    let act_ty = w_ty.act_type();
    assert!(
        n.is_multiple_of(w_ty.block_len()),
        "vec_dot: {n} elements is not a whole number of {w_ty} blocks"
    );
    let w_bytes = n / w_ty.block_len() * w_ty.block_bytes();
    let act_bytes = n / act_ty.block_len() * act_ty.block_bytes();
    debug_assert_eq!(w.len(), w_bytes, "vec_dot: {w_ty} weight row of {n} elements");
    debug_assert_eq!(act.len(), act_bytes, "vec_dot: {act_ty} activation row of {n} elements");
    let (w, act) = (&w[..w_bytes], &act[..act_bytes]);
    let kernel = simd::dot_kernel(isa(), w_ty, WeightLayout::Plain);
    let mut out = [0f32];
    match kernel.layout {
        simd::ActLayout::Plain => kernel.run(w, w.len(), &[act], &mut out),
        simd::ActLayout::Grouped => {
            let mut g = vec![0u8; grouped::row_bytes(n / act_ty.block_len())];
            grouped::regroup(act, &mut g);
            kernel.run(w, w.len(), &[&g], &mut out);
        }
    }
    out[0]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dequantize_row_rejects_bad_lengths() {
        let mut dst = vec![0f32; 32];
        let err = dequantize_row(GgmlType::Q4_0, &[0u8; 17], &mut dst).unwrap_err();
        assert!(
            matches!(
                err,
                KernelError::SizeMismatch {
                    expected: 18,
                    actual: 17,
                    ..
                }
            ),
            "{err}"
        );
        let err = dequantize_row(GgmlType::Q4_K, &[0u8; 144], &mut dst).unwrap_err();
        assert!(
            matches!(
                err,
                KernelError::NotWholeBlocks {
                    len: 32,
                    block_len: 256,
                    ..
                }
            ),
            "{err}"
        );
        assert!(dequantize_row(GgmlType::Q4_0, &[0u8; 18], &mut dst).is_ok());
        assert!(dequantize_row(GgmlType::F16, &[], &mut []).is_ok());
    }

    #[test]
    fn quantize_row_rejects_bad_types_and_lengths() {
        let x = [0.5f32; 256];
        let err = quantize_row(GgmlType::Q4_K, &x, &mut [0u8; 144]).unwrap_err();
        assert!(matches!(err, KernelError::NotActivationType(GgmlType::Q4_K)), "{err}");
        let err = quantize_row(GgmlType::Q8_K, &x[..100], &mut [0u8; 292]).unwrap_err();
        assert!(matches!(err, KernelError::NotWholeBlocks { .. }), "{err}");
        let err = quantize_row(GgmlType::Q8_0, &x, &mut [0u8; 34]).unwrap_err();
        assert!(
            matches!(
                err,
                KernelError::SizeMismatch {
                    expected: 272,
                    actual: 34,
                    ..
                }
            ),
            "{err}"
        );
        assert!(quantize_row(GgmlType::Q8_1, &x, &mut [0u8; 288]).is_ok());
    }

    #[test]
    fn blocks_accumulate_in_eight_lanes_for_every_type() {
        // A one-block row's result is that block's term exactly (0 + t = t, and the other lanes are 0),
        // so the full row must equal the documented lane reduction of the per-block results.
        let mut rng = crate::testutil::Rng::new(5);
        for ty in GgmlType::ALL {
            let (act_ty, blocks) = (ty.act_type(), 21);
            let block_len = ty.block_len().max(act_ty.block_len());
            let n = blocks * block_len;
            let w = crate::testutil::random_row(ty, n, &mut rng);
            let x: Vec<f32> = (0..n).map(|_| rng.normal()).collect();
            let mut act = vec![0u8; act_ty.row_bytes(n).unwrap()];
            quantize_row(act_ty, &x, &mut act).unwrap();
            let (wb, ab) = (ty.row_bytes(block_len).unwrap(), act_ty.row_bytes(block_len).unwrap());
            let mut lanes = accum::Lanes8::default();
            for b in 0..blocks {
                let term = vec_dot(ty, block_len, &w[b * wb..(b + 1) * wb], &act[b * ab..(b + 1) * ab]);
                lanes.add(b, term);
            }
            assert_eq!(vec_dot(ty, n, &w, &act).to_bits(), lanes.sum().to_bits(), "{ty}");
        }
    }

    #[test]
    fn errors_say_what_differs() {
        let err = KernelError::ActivationTypeMismatch {
            weight: GgmlType::Q4_K,
            expected: GgmlType::Q8_K,
            actual: GgmlType::Q8_0,
        };
        assert_eq!(err.to_string(), "Q4_K weights need Q8_K activations, got Q8_0");
    }
}
