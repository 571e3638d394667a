//! aarch64 kernels: NEON with the ARMv8.2 dot-product extension (`sdot`: Apple M1 and later,
//! Graviton2 and later, Cortex-A76 and later).
//!
//! The same plan as `x86.rs`, on two 128-bit registers where x86 uses one 256-bit register, and each
//! body reproduces its scalar twin in `formats/` bit for bit:
//!
//! - integer sums are exact: `sdot` multiplies signed bytes by signed bytes and adds each group of
//!   four into an i32 lane with no intermediate narrower than 32 bits, so unlike x86's `maddubs` it
//!   has no pair bound, needs no unsigned weight encoding, and takes quants straight with their
//!   offsets (Q4_0's `-8`, Q6_K's `-32`) applied — Q8_K's `bsums` are used only where the scalar twin
//!   uses them (Q4_K/Q5_K mins);
//! - each block's f32 term uses the scalar formula with separate `fmul` and `fadd` (never `fmla`),
//!   operands in the scalar code's order, and is added to lane `block % 8` — for Q4_0, Q5_0, Q8_0
//!   and MXFP4 by handling 8 blocks at once in the grouped layout of `grouped.rs` (blocks 0..4 in
//!   one register, 4..8 in the other); for Q4_1 and Q5_1 by handling 8 blocks at once after
//!   reducing their sums into lanes; for K-quants by reducing the block's integers to scalars and
//!   using [`Lanes8`] directly;
//! - the lanes are reduced by [`Lanes8::sum`] (lane `k` of the low register is lane `k`, of the high
//!   register lane `k + 4`), not by `vaddvq`, whose pairwise order differs.
//!
//! Every kernel takes one weight row and `R` (1..=its `max_rows`) activation rows, unpacks each weight
//! block once and multiplies it with all `R` rows; each row's arithmetic is exactly what it would be
//! alone.
//!
//! Two instructions go through `asm!` because their intrinsics are not stable Rust: `sdot`
//! (`vdotq_s32`) and the f16 → f32 widening `fcvtl` (`vcvt_f32_f16`, whose `float16x4_t` is
//! unstable). `fcvtl` is exact and quiets a NaN keeping its payload, as the scalar `f16_at` does.
//!
//! The kernels assume nothing about the activation quants' range (any i8 is exact). On AArch64,
//! vector and scalar float instructions obey the same control register (unlike 32-bit NEON, which
//! always flushed subnormals), so the twins treat subnormals, rounding and NaNs alike.
//!
//! # Safety
//!
//! Every `unsafe fn` here executes NEON instructions, and the kernels the dot product's `sdot`, which is
//! undefined behaviour on a core without it. Only the entry points carry `#[target_feature]`: the `entry!`
//! kernels (NEON and the dot product), `sdot` itself and the quantisers (NEON). `super` hands them out only
//! inside a `DotKernel` or `QuantKernel`, which it builds only after `Isa::is_available` confirmed NEON and
//! the dot product on this CPU. The `#[inline(always)]` helpers have no features of their own: they are
//! called only from those entry points, and inlined into them. Their `# Safety` sections call that
//! obligation *the NEON context*: running on a CPU with NEON and the dot product, inside an entry point
//! compiled with the features the helper uses. They also name the bytes a helper reads or writes through raw
//! pointers; each `SAFETY:` comment says why both hold where it stands. The row kernels derive every pointer
//! from slices whose lengths they check: `nb` whole weight blocks in `w`, and an `assert!` that each
//! activation row holds as many.

use std::arch::aarch64::*;
use std::arch::asm;
use std::array;

use super::{ActLayout, DotFn, DotKernel, Isa, QuantFn, MAX_ROWS};
use crate::accum::Lanes8;
use crate::formats::{f16_at, f16_bytes, mxfp4, q3_k, q8_0, q8_1, q8_k};
use crate::{grouped, GgmlType};

/// The dot-product kernel for `ty` on `isa`, if there is a NEON one. The caller checks the CPU.
pub(super) fn dot_kernel(isa: Isa, ty: GgmlType) -> Option<DotKernel> {
    use ActLayout::{Grouped, Plain};
    if isa != Isa::Neon {
        return None;
    }
    // As on x86: grouped kernels keep a row's state in few registers and take the most rows.
    let (f, layout, max_rows): (DotFn, _, _) = match ty {
        GgmlType::Q4_0 => (q4_0, Grouped, 8),
        GgmlType::Q5_0 => (q5_0, Grouped, 8),
        GgmlType::Q8_0 => (q8_0, Grouped, 8),
        GgmlType::MXFP4 => (mxfp4, Grouped, 8),
        GgmlType::Q4_1 => (q4_1, Plain, 4),
        GgmlType::Q5_1 => (q5_1, Plain, 4),
        GgmlType::Q2_K => (q2_k, Plain, 4),
        GgmlType::Q3_K => (q3_k, Plain, 4),
        GgmlType::Q4_K => (q4_k, Plain, 4),
        GgmlType::Q5_K => (q5_k, Plain, 4),
        GgmlType::Q6_K => (q6_k, Plain, 4),
        GgmlType::F32 => (f32, Plain, 4),
        GgmlType::F16 => (f16, Plain, 4),
        GgmlType::BF16 => (bf16, Plain, 4),
        _ => return None,
    };
    debug_assert!(max_rows <= MAX_ROWS);
    Some(DotKernel {
        f,
        isa,
        layout,
        max_rows,
    })
}

/// The activation quantiser for `act_ty` on `isa`, if there is a NEON one. The caller checks the CPU.
pub(super) fn quant_fn(isa: Isa, act_ty: GgmlType) -> Option<QuantFn> {
    let f: QuantFn = match (isa, act_ty) {
        (Isa::Neon, GgmlType::Q8_0) => quantize_q8_0,
        (Isa::Neon, GgmlType::Q8_K) => quantize_q8_k,
        _ => return None,
    };
    Some(f)
}

/// One entry point per format: enables the features, picks the row count (up to the `max_rows`
/// that `dot_kernel` declares for it; `DotKernel::run` has checked the count) and runs every weight
/// row of the call.
macro_rules! entry {
    ($name:ident, $body:ident, $($r:literal)+) => {
        /// # Safety
        ///
        /// The CPU must have NEON and the dot product: `super` hands this function out only in the `DotKernel` that
        /// `dot_kernel` builds after `Isa::is_available` confirmed them.
        #[target_feature(enable = "neon,dotprod")]
        unsafe fn $name(w: &[u8], row_bytes: usize, acts: &[&[u8]], out: &mut [f32]) {
            // SAFETY: this function is compiled with NEON and the dot product, and its caller guarantees the CPU
            // has them (`# Safety`): the context `$body` needs. `$body` reads memory only through the slices `w`
            // (one row of whole blocks) and `a`, whose lengths it asserts against `w`, and writes `out` as a slice.
            unsafe {
                match acts.len() {
                    $($r => {
                        let a = rows::<$r>(acts);
                        for (w, out) in w.chunks_exact(row_bytes).zip(out.chunks_exact_mut($r)) {
                            $body::<$r>(w, a, out);
                        }
                    })+
                    n => unreachable!("{n} rows"),
                }
            }
        }
    };
}

entry!(q4_0, q4_0_rows, 1 2 3 4 5 6 7 8);
entry!(q5_0, q5_0_rows, 1 2 3 4 5 6 7 8);
entry!(q8_0, q8_0_rows, 1 2 3 4 5 6 7 8);
entry!(mxfp4, mxfp4_rows, 1 2 3 4 5 6 7 8);
entry!(q4_1, q4_1_rows, 1 2 3 4);
entry!(q5_1, q5_1_rows, 1 2 3 4);
entry!(q2_k, q2_k_rows, 1 2 3 4);
entry!(q3_k, q3_k_rows, 1 2 3 4);
entry!(q4_k, q4_k_rows, 1 2 3 4);
entry!(q5_k, q5_k_rows, 1 2 3 4);
entry!(q6_k, q6_k_rows, 1 2 3 4);
entry!(f32, f32_rows, 1 2 3 4);
entry!(f16, f16_rows, 1 2 3 4);
entry!(bf16, bf16_rows, 1 2 3 4);

/// The first `R` activation rows as an array (the entry points pass exactly `R`).
#[inline(always)]
fn rows<'a, const R: usize>(acts: &[&'a [u8]]) -> [&'a [u8]; R] {
    array::from_fn(|i| acts[i])
}

// Loads go through `vld1q_u8`: GGUF data and activation rows are only byte-aligned, and the typed
// `vld1q_*` intrinsics take typed pointers.

/// The 16 bytes at `p`.
///
/// # Safety
///
/// `p .. p + 16` must be readable, in the NEON context.
#[inline(always)]
unsafe fn load_s8(p: *const u8) -> int8x16_t {
    // SAFETY: `ld1` has no alignment requirement and reads the 16 bytes at `p`, which the caller guarantees
    // readable, in the NEON context the caller provides (`# Safety`).
    unsafe { vreinterpretq_s8_u8(vld1q_u8(p)) }
}

/// The 4 floats at `p`.
///
/// # Safety
///
/// `p .. p + 16` must be readable, in the NEON context.
#[inline(always)]
unsafe fn load_f32(p: *const u8) -> float32x4_t {
    // SAFETY: `ld1` has no alignment requirement and reads the 16 bytes at `p`, which the caller guarantees
    // readable, in the NEON context the caller provides (`# Safety`).
    unsafe { vreinterpretq_f32_u8(vld1q_u8(p)) }
}

/// `acc + Σ a·b` over each group of four signed bytes: exact for any bytes. (A function with the
/// features rather than `#[inline(always)]`, so that the assembler accepts `sdot` even where it is not
/// inlined, as in debug builds; optimised builds inline it into the kernels, which have the same
/// features.)
///
/// # Safety
///
/// The CPU must have NEON and the dot product.
#[inline]
#[target_feature(enable = "neon,dotprod")]
unsafe fn sdot(acc: int32x4_t, a: int8x16_t, b: int8x16_t) -> int32x4_t {
    // SAFETY: `sdot` needs the dot-product extension, which this function is compiled with and its caller
    // guarantees the CPU has (`# Safety`); the instruction reads and writes only the three vector registers given
    // (`pure`, `nomem`, `nostack`) and leaves the flags alone.
    unsafe {
        let mut acc = acc;
        asm!(
            "sdot {acc:v}.4s, {a:v}.16b, {b:v}.16b",
            acc = inout(vreg) acc,
            a = in(vreg) a,
            b = in(vreg) b,
            options(pure, nomem, nostack, preserves_flags),
        );
        acc
    }
}

/// The f16 values in `h`'s lower four lanes, widened to f32 (exact).
///
/// # Safety
///
/// The NEON context.
#[inline(always)]
unsafe fn widen_low(h: uint16x8_t) -> float32x4_t {
    // SAFETY: `fcvtl` is base ARMv8 Advanced SIMD, in the NEON context the caller provides (`# Safety`); it reads
    // and writes only the two vector registers given (`pure`, `nomem`, `nostack`) and leaves the flags alone.
    unsafe {
        let r: float32x4_t;
        asm!(
            "fcvtl {r:v}.4s, {h:v}.4h",
            r = lateout(vreg) r,
            h = in(vreg) h,
            options(pure, nomem, nostack, preserves_flags),
        );
        r
    }
}

/// The f16 values in `h`'s upper four lanes, widened to f32 (exact).
///
/// # Safety
///
/// The NEON context.
#[inline(always)]
unsafe fn widen_high(h: uint16x8_t) -> float32x4_t {
    // SAFETY: `fcvtl2` is base ARMv8 Advanced SIMD, in the NEON context the caller provides (`# Safety`); it reads
    // and writes only the two vector registers given (`pure`, `nomem`, `nostack`) and leaves the flags alone.
    unsafe {
        let r: float32x4_t;
        asm!(
            "fcvtl2 {r:v}.4s, {h:v}.8h",
            r = lateout(vreg) r,
            h = in(vreg) h,
            options(pure, nomem, nostack, preserves_flags),
        );
        r
    }
}

/// The f16 at `p + k · stride` for `k = 0..8`, widened to f32: lanes 0..4 and 4..8.
///
/// # Safety
///
/// The 2 bytes at `p + k · stride` must be readable for each `k < 8`, in the NEON context.
#[inline(always)]
unsafe fn f16x8(p: *const u8, stride: usize) -> [float32x4_t; 2] {
    // SAFETY: each `read_unaligned` reads the 2 bytes at `p + k · stride`, `k < 8`, which the caller guarantees
    // readable (so each `add` stays inside that allocation); the rest is register work in the NEON context the
    // caller provides (`# Safety`).
    unsafe {
        // Packed by scalar loads and shifts (the blocks are `stride` bytes apart and only byte-aligned).
        let word = |k: usize| u64::from((p.add(k * stride) as *const u16).read_unaligned());
        let quad = |k: usize| word(k) | word(k + 1) << 16 | word(k + 2) << 32 | word(k + 3) << 48;
        let h = vcombine_u16(vcreate_u16(quad(0)), vcreate_u16(quad(4)));
        [widen_low(h), widen_high(h)]
    }
}

/// Stores the low (lanes 0..4) and high (4..8) accumulators and reduces them in the documented tree.
///
/// # Safety
///
/// The NEON context.
#[inline(always)]
unsafe fn lanes8([lo, hi]: [float32x4_t; 2]) -> Lanes8 {
    // SAFETY: the two `st1` store 4 floats each at `l` and `l + 4`, inside the 8-float array `l`, in the NEON
    // context the caller provides (`# Safety`).
    unsafe {
        let mut l = [0f32; 8];
        vst1q_f32(l.as_mut_ptr(), lo);
        vst1q_f32(l.as_mut_ptr().add(4), hi);
        Lanes8(l)
    }
}

// ---------------------------------------------------------------------------------------------
// Q4_0, Q5_0, Q8_0 and MXFP4 weights times Q8_0 activations in the grouped layout (`grouped.rs`): eight
// blocks at a time, block `k` in 32-bit lane `k % 4` of register `k / 4` of every pair, so each
// block's exact sum comes out in its own lane and its f32 term goes straight to lane `block % 8`.

/// Register `m` holds, in lane `k`, 32-bit word `m` of `x[k]`: a 4 × 4 transpose of words.
///
/// # Safety
///
/// The NEON context.
#[inline(always)]
unsafe fn transpose_words(x: [uint8x16_t; 4]) -> [int8x16_t; 4] {
    // SAFETY: register operations only, in the NEON context the caller provides (`# Safety`).
    unsafe {
        let x = x.map(|v| vreinterpretq_u32_u8(v));
        // t0 = (x0[0], x1[0], x0[2], x1[2]), t1 = (x0[1], x1[1], x0[3], x1[3]); t2, t3 likewise for x2, x3.
        let t0 = vreinterpretq_u64_u32(vtrn1q_u32(x[0], x[1]));
        let t1 = vreinterpretq_u64_u32(vtrn2q_u32(x[0], x[1]));
        let t2 = vreinterpretq_u64_u32(vtrn1q_u32(x[2], x[3]));
        let t3 = vreinterpretq_u64_u32(vtrn2q_u32(x[2], x[3]));
        [
            vreinterpretq_s8_u64(vtrn1q_u64(t0, t2)),
            vreinterpretq_s8_u64(vtrn1q_u64(t1, t3)),
            vreinterpretq_s8_u64(vtrn2q_u64(t0, t2)),
            vreinterpretq_s8_u64(vtrn2q_u64(t1, t3)),
        ]
    }
}

/// Register `m` of each half holds, in lane `k`, bytes `at + 4m .. at + 4m + 4` of block `k` (blocks
/// `stride` apart from `w`; half 0 is blocks 0..4, half 1 blocks 4..8).
///
/// # Safety
///
/// The 16 bytes at `w + k · stride + at` must be readable for each `k < 8`, in the NEON context.
#[inline(always)]
unsafe fn transpose_quads(w: *const u8, stride: usize, at: usize) -> [[int8x16_t; 2]; 4] {
    // SAFETY: each `ld1` reads the 16 bytes at `w + k · stride + at`, `k = 4h + k' < 8`, which the caller
    // guarantees readable (for each format `7 · BYTES + at + 16 <= 8 · BYTES`: inside its eight blocks), in the
    // NEON context the caller provides (`# Safety`).
    unsafe {
        let half = |h: usize| transpose_words(array::from_fn(|k| vld1q_u8(w.add((4 * h + k) * stride + at))));
        let (lo, hi) = (half(0), half(1));
        array::from_fn(|m| [lo[m], hi[m]])
    }
}

/// A weight format of 32-element blocks with one scale, whose quants Q8_0 activations multiply
/// (Q4_0, Q5_0, Q8_0, MXFP4).
///
/// # Safety
///
/// Both methods need the NEON context, and read the eight blocks at `w` (`8 · BYTES` bytes), which must be
/// readable.
trait Grouped {
    const BYTES: usize;
    /// The eight blocks at `w` as signed quants in the grouped register layout: register `j` of
    /// `grouped.rs`, as its halves for blocks 0..4 and 4..8.
    unsafe fn prep(w: *const u8) -> [[int8x16_t; 2]; 8];
    /// The eight blocks' scales as the scalar twin widens them to f32: lanes 0..4 and 4..8.
    unsafe fn scales(w: *const u8) -> [float32x4_t; 2];
}

struct Q4_0;

impl Grouped for Q4_0 {
    const BYTES: usize = 18;

    #[inline(always)]
    unsafe fn prep(w: *const u8) -> [[int8x16_t; 2]; 8] {
        // SAFETY: `transpose_quads(w, 18, 2)` reads up to `7 · 18 + 2 + 16 = 144`, inside the `8 · BYTES` bytes the
        // caller guarantees at `w` (`Grouped`'s `# Safety`), which also makes it provide the NEON context.
        unsafe {
            // Byte quad m holds elements 4m.. in its low nibbles (register 2m) and 16 + 4m.. in its high
            // ones (register 2m + 1); the quant is the nibble - 8.
            let quads = transpose_quads(w, Self::BYTES, 2);
            let (m4, eight) = (vdupq_n_u8(0x0F), vdupq_n_s8(8));
            array::from_fn(|j| {
                quads[j / 2].map(|q| {
                    let q = vreinterpretq_u8_s8(q);
                    let nibbles = if j % 2 == 0 {
                        vandq_u8(q, m4)
                    } else {
                        vshrq_n_u8::<4>(q)
                    };
                    vsubq_s8(vreinterpretq_s8_u8(nibbles), eight)
                })
            })
        }
    }

    #[inline(always)]
    unsafe fn scales(w: *const u8) -> [float32x4_t; 2] {
        // SAFETY: `f16x8` reads the 2-byte scale at `w + 18k`, `k < 8`, inside the eight blocks the caller
        // guarantees at `w`, in the NEON context it provides (`Grouped`'s `# Safety`).
        unsafe { f16x8(w, Self::BYTES) }
    }
}

struct Q8_0;

impl Grouped for Q8_0 {
    const BYTES: usize = q8_0::BLOCK_BYTES;

    #[inline(always)]
    unsafe fn prep(w: *const u8) -> [[int8x16_t; 2]; 8] {
        // SAFETY: `transpose_quads` at offsets 2 and 18 reads up to `7 · 34 + 18 + 16 = 272`, inside the
        // `8 · BYTES` bytes the caller guarantees at `w` (`Grouped`'s `# Safety`), which also makes it provide the
        // NEON context.
        unsafe {
            // Half h of a block (bytes 2 + 16h ..) gives registers 2m + h.
            let halves = [transpose_quads(w, Self::BYTES, 2), transpose_quads(w, Self::BYTES, 18)];
            array::from_fn(|j| halves[j % 2][j / 2])
        }
    }

    #[inline(always)]
    unsafe fn scales(w: *const u8) -> [float32x4_t; 2] {
        // SAFETY: `f16x8` reads the 2-byte scale at `w + 34k`, `k < 8`, inside the eight blocks the caller
        // guarantees at `w`, in the NEON context it provides (`Grouped`'s `# Safety`).
        unsafe { f16x8(w, Self::BYTES) }
    }
}

struct Q5_0;

impl Grouped for Q5_0 {
    const BYTES: usize = 22;

    #[inline(always)]
    unsafe fn prep(w: *const u8) -> [[int8x16_t; 2]; 8] {
        // SAFETY: `transpose_quads(w, 22, 6)` reads up to `7 · 22 + 6 + 16 = 176`, and each `read_unaligned` the 4
        // bytes at `w + 22k + 2`, `k = 4h + k' < 8`: inside the `8 · BYTES` bytes the caller guarantees at `w`
        // (`Grouped`'s `# Safety`), which also makes it provide the NEON context; the `ld1`s read the 4-word arrays
        // `v` and `[0, 0x0404_0404, ..]`.
        unsafe {
            let quads = transpose_quads(w, Self::BYTES, 6);
            // Half h: blocks 4h..4h + 4's qh, one per 32-bit lane.
            let qh: [uint8x16_t; 2] = array::from_fn(|h| {
                let v: [u32; 4] =
                    array::from_fn(|k| (w.add((4 * h + k) * Self::BYTES + 2) as *const u32).read_unaligned());
                vreinterpretq_u8_u32(vld1q_u32(v.as_ptr()))
            });
            // Offsets of each 32-bit lane's first byte, for `tbl`.
            let lane_bytes = vreinterpretq_u8_u32(vld1q_u32([0, 0x0404_0404, 0x0808_0808, 0x0C0C_0C0C].as_ptr()));
            let (m4, sixteen, ten) = (vdupq_n_u8(0x0F), vdupq_n_s8(16), vdupq_n_u8(0x10));
            array::from_fn(|j| {
                let (m, h) = (j / 2, j % 2);
                // Register j holds elements 16h + 4m + t (t = 0..4) of each block, whose fifth bits are
                // bits 4(m % 2) + t of qh's byte 2h + m / 2: that byte goes to all four bytes of the
                // lane, and byte t keeps its bit. The quant is the 5-bit value - 16.
                let pick = vaddq_u8(lane_bytes, vdupq_n_u8((2 * h + m / 2) as u8));
                let bit = vreinterpretq_u8_u32(vdupq_n_u32(0x0804_0201 << (4 * (m % 2))));
                array::from_fn(|half| {
                    let q = vreinterpretq_u8_s8(quads[m][half]);
                    let nibbles = if h == 0 { vandq_u8(q, m4) } else { vshrq_n_u8::<4>(q) };
                    let fifth = vandq_u8(vtstq_u8(vqtbl1q_u8(qh[half], pick), bit), ten);
                    vsubq_s8(vreinterpretq_s8_u8(vorrq_u8(nibbles, fifth)), sixteen)
                })
            })
        }
    }

    #[inline(always)]
    unsafe fn scales(w: *const u8) -> [float32x4_t; 2] {
        // SAFETY: `f16x8` reads the 2-byte scale at `w + 22k`, `k < 8`, inside the eight blocks the caller
        // guarantees at `w`, in the NEON context it provides (`Grouped`'s `# Safety`).
        unsafe { f16x8(w, Self::BYTES) }
    }
}

struct Mxfp4;

impl Grouped for Mxfp4 {
    const BYTES: usize = mxfp4::BLOCK_BYTES;

    #[inline(always)]
    unsafe fn prep(w: *const u8) -> [[int8x16_t; 2]; 8] {
        // SAFETY: `transpose_quads(w, 17, 1)` reads up to `7 · 17 + 1 + 16 = 136`, inside the `8 · BYTES` bytes the
        // caller guarantees at `w` (`Grouped`'s `# Safety`); the table load reads the 16 bytes of `mxfp4::KVALUES`;
        // the NEON context is the caller's.
        unsafe {
            // As Q4_0's nibbles, each looked up in the table of doubled E2M1 values (`tbl`).
            let quads = transpose_quads(w, Self::BYTES, 1);
            let (m4, table) = (vdupq_n_u8(0x0F), vld1q_s8(mxfp4::KVALUES.as_ptr()));
            array::from_fn(|j| {
                quads[j / 2].map(|q| {
                    let q = vreinterpretq_u8_s8(q);
                    let nibbles = if j % 2 == 0 {
                        vandq_u8(q, m4)
                    } else {
                        vshrq_n_u8::<4>(q)
                    };
                    vqtbl1q_s8(table, nibbles)
                })
            })
        }
    }

    #[inline(always)]
    unsafe fn scales(w: *const u8) -> [float32x4_t; 2] {
        // SAFETY: each `*w.add(17k)`, `k < 8`, reads a block's exponent byte, inside the eight blocks the caller
        // guarantees at `w` (`Grouped`'s `# Safety`), which also makes it provide the NEON context.
        unsafe {
            // The exponent bytes, 17 apart, packed by scalar loads as in `f16x8`, then `mxfp4::scale`
            // on each lane: `(e - 1) << 23`, or `0x0020_0000 << e` for the subnormals e < 2 (`ushl`
            // takes the low byte of `e` as a signed count, so lanes with larger `e` shift elsewhere and
            // are not selected).
            let e = (0..8).fold(0u64, |acc, k| acc | u64::from(*w.add(k * Self::BYTES)) << (8 * k));
            let e = vmovl_u8(vcreate_u8(e));
            let (one, two) = (vdupq_n_u32(1), vdupq_n_u32(2));
            let scale = |e: uint32x4_t| {
                let normal = vshlq_n_u32::<23>(vsubq_u32(e, one));
                let subnormal = vshlq_u32(vdupq_n_u32(0x0020_0000), vreinterpretq_s32_u32(e));
                vreinterpretq_f32_u32(vbslq_u32(vcltq_u32(e, two), subnormal, normal))
            };
            [scale(vmovl_u16(vget_low_u16(e))), scale(vmovl_high_u16(e))]
        }
    }
}

/// One group: block `k`'s term `(d_w · d_a) · f32(sumi)` is added to lane `k` of each row's
/// accumulators (groups start at multiples of 8 blocks, so lane `k` is lane `block % 8`).
///
/// # Safety
///
/// `w` must point at eight readable weight blocks (`8 · K::BYTES` bytes), and each `a[r]` at a whole readable
/// activation group ([`grouped::GROUP_BYTES`]), in the NEON context.
#[inline(always)]
unsafe fn grouped_step<K: Grouped, const R: usize>(w: *const u8, a: [*const u8; R], acc: &mut [[float32x4_t; 2]; R]) {
    // SAFETY: `K::prep` and `K::scales` read the eight blocks at `w`; the loads from `a` read its scales
    // (`a + 16h .. + 16`, `h < 2`) and quants (`a + QUANTS_AT + 32j + 16h .. + 16`, `j < 8`: ending at
    // `GROUP_BYTES`), inside the activation group at `a[r]`: all within what the caller guarantees, as is the NEON
    // context with the dot product (`sdot`).
    unsafe {
        let p = K::prep(w);
        let d_w = K::scales(w);
        for (acc, a) in acc.iter_mut().zip(a) {
            for h in 0..2 {
                // Two chains of `sdot`, for one row's latency; integer sums are exact in any order.
                let mut s = [vdupq_n_s32(0); 2];
                for (j, pj) in p.iter().enumerate() {
                    let aj = load_s8(a.add(grouped::QUANTS_AT + 32 * j + 16 * h));
                    s[j % 2] = sdot(s[j % 2], pj[h], aj);
                }
                let sumi = vaddq_s32(s[0], s[1]);
                let d = vmulq_f32(d_w[h], load_f32(a.add(16 * h)));
                acc[h] = vaddq_f32(acc[h], vmulq_f32(d, vcvtq_f32_s32(sumi)));
            }
        }
    }
}

/// Eight blocks at a time, in lanes; a row's last blocks padded to a group.
///
/// # Safety
///
/// The NEON context. Memory is read only through the slices, whose lengths it checks: `w`'s whole blocks, and
/// activation rows asserted to hold as many.
#[inline(always)]
unsafe fn grouped_rows<K: Grouped, const R: usize>(w: &[u8], acts: [&[u8]; R], out: &mut [f32]) {
    const GB: usize = grouped::GROUP_BYTES;

    // SAFETY: the caller provides the NEON context. Every pointer comes from a slice: group `g < full = nb / 8`
    // spans `w[8g · BYTES .. 8(g + 1) · BYTES]`, inside `w` as `nb = w.len() / BYTES`, and the tail's group is
    // `w_pad`, 272 bytes, at least `8 · BYTES` for every format; each activation row holds `row_bytes(nb)`,
    // `ceil(nb / 8)` whole groups (asserted above), so the group at `g · GB` is inside it for `g < full`, and for
    // `g = full` when there is a tail.
    unsafe {
        let nb = w.len() / K::BYTES;
        for a in acts {
            assert!(
                a.len() >= grouped::row_bytes(nb),
                "activation row shorter than weight row"
            );
        }
        let zero = vdupq_n_f32(0.0);
        let mut acc = [[zero; 2]; R];
        let full = nb / 8;
        for g in 0..full {
            let wg = w.as_ptr().add(g * 8 * K::BYTES);
            let a = array::from_fn(|r| acts[r].as_ptr().add(g * GB));
            grouped_step::<K, R>(wg, a, &mut acc);
        }
        let tail = nb % 8;
        if tail > 0 {
            // Pad the weights to a whole group with zero blocks, as the activations already are: the
            // activation scales are 0 (and a zero weight block's scale finite: 0, or MXFP4's 2^-128), so
            // their terms are ±0.0, and adding ±0.0 leaves a lane unchanged (lanes start at +0.0 and so
            // are never -0.0).
            let w0 = full * 8 * K::BYTES;
            let mut w_pad = [0u8; 8 * q8_0::BLOCK_BYTES];
            w_pad[..tail * K::BYTES].copy_from_slice(&w[w0..w0 + tail * K::BYTES]);
            let a = array::from_fn(|r| acts[r].as_ptr().add(full * GB));
            grouped_step::<K, R>(w_pad.as_ptr(), a, &mut acc);
        }
        for (o, acc) in out.iter_mut().zip(acc) {
            *o = lanes8(acc).sum();
        }
    }
}

/// Q4_0 weights times grouped Q8_0 activations.
///
/// # Safety
///
/// As for [`grouped_rows`]: the NEON context.
#[inline(always)]
unsafe fn q4_0_rows<const R: usize>(w: &[u8], acts: [&[u8]; R], out: &mut [f32]) {
    // SAFETY: the caller provides what `grouped_rows` needs (`# Safety`).
    unsafe { grouped_rows::<Q4_0, R>(w, acts, out) }
}

/// Q8_0 weights times grouped Q8_0 activations.
///
/// # Safety
///
/// As for [`grouped_rows`]: the NEON context.
#[inline(always)]
unsafe fn q8_0_rows<const R: usize>(w: &[u8], acts: [&[u8]; R], out: &mut [f32]) {
    // SAFETY: the caller provides what `grouped_rows` needs (`# Safety`).
    unsafe { grouped_rows::<Q8_0, R>(w, acts, out) }
}

/// Q5_0 weights times grouped Q8_0 activations.
///
/// # Safety
///
/// As for [`grouped_rows`]: the NEON context.
#[inline(always)]
unsafe fn q5_0_rows<const R: usize>(w: &[u8], acts: [&[u8]; R], out: &mut [f32]) {
    // SAFETY: the caller provides what `grouped_rows` needs (`# Safety`).
    unsafe { grouped_rows::<Q5_0, R>(w, acts, out) }
}

/// MXFP4 weights times grouped Q8_0 activations.
///
/// # Safety
///
/// As for [`grouped_rows`]: the NEON context.
#[inline(always)]
unsafe fn mxfp4_rows<const R: usize>(w: &[u8], acts: [&[u8]; R], out: &mut [f32]) {
    // SAFETY: the caller provides what `grouped_rows` needs (`# Safety`).
    unsafe { grouped_rows::<Mxfp4, R>(w, acts, out) }
}

// ---------------------------------------------------------------------------------------------
// Q4_1 and Q5_1 weights times Q8_1 activations, in their plain layouts: eight blocks at a time. Each block's
// exact integer sum is formed in its own register, the eight registers are reduced pairwise into two
// (block `k` in lane `k % 4` of register `k / 4`), and the eight f32 terms are computed side by side
// and added to lane `block % 8`.

/// A 32-element weight format with an f16 scale `d` and offset `m` first, times Q8_1 (Q4_1, Q5_1).
///
/// # Safety
///
/// `quants` reads the block at `w` (`BYTES` bytes), which must be readable, in the NEON context.
trait Offset32 {
    const BYTES: usize;
    /// The block at `w`'s quants (below 32) in element order, as two registers of 16.
    unsafe fn quants(w: *const u8) -> [int8x16_t; 2];
}

/// Sixteen bytes of nibbles as 32 bytes in element order: low nibbles, then high ones.
///
/// # Safety
///
/// The 16 bytes at `qs` must be readable, in the NEON context.
#[inline(always)]
unsafe fn nibbles(qs: *const u8) -> [uint8x16_t; 2] {
    // SAFETY: `ld1` reads the 16 bytes at `qs`, which the caller guarantees readable; the rest is register work in
    // the NEON context the caller provides (`# Safety`).
    unsafe {
        let q = vld1q_u8(qs);
        [vandq_u8(q, vdupq_n_u8(0x0F)), vshrq_n_u8::<4>(q)]
    }
}

/// Bit `i` of the u32 at `p` as 0x10 in byte `i`: the fifth bits of 32 Q5_1 elements.
///
/// # Safety
///
/// The 4 bytes at `p` must be readable, in the NEON context.
#[inline(always)]
unsafe fn fifth_bits(p: *const u8) -> [uint8x16_t; 2] {
    // SAFETY: `read_unaligned` reads the 4 bytes at `p`, which the caller guarantees readable; the rest is register
    // work in the NEON context the caller provides (`# Safety`).
    unsafe {
        let qh = vreinterpretq_u8_u32(vdupq_n_u32((p as *const u32).read_unaligned()));
        let bit = vreinterpretq_u8_u64(vdupq_n_u64(0x8040_2010_0804_0201));
        // Byte i takes byte i / 8 of `qh` (`tbl`), then tests bit i % 8.
        [(0, 1), (2, 3)].map(|(lo, hi)| {
            let spread = vqtbl1q_u8(qh, vcombine_u8(vdup_n_u8(lo), vdup_n_u8(hi)));
            vandq_u8(vtstq_u8(spread, bit), vdupq_n_u8(0x10))
        })
    }
}

struct Q4_1;

impl Offset32 for Q4_1 {
    const BYTES: usize = 20;

    #[inline(always)]
    unsafe fn quants(w: *const u8) -> [int8x16_t; 2] {
        // SAFETY: `nibbles` reads bytes `4 .. 20` of the 20-byte block the caller guarantees at `w` (`Offset32`'s
        // `# Safety`), which also makes it provide the NEON context.
        unsafe { nibbles(w.add(4)).map(|v| vreinterpretq_s8_u8(v)) }
    }
}

struct Q5_1;

impl Offset32 for Q5_1 {
    const BYTES: usize = 24;

    #[inline(always)]
    unsafe fn quants(w: *const u8) -> [int8x16_t; 2] {
        // SAFETY: `fifth_bits` reads bytes `4 .. 8` and `nibbles` bytes `8 .. 24` of the 24-byte block the caller
        // guarantees at `w` (`Offset32`'s `# Safety`), which also makes it provide the NEON context.
        unsafe {
            let (low, high) = (nibbles(w.add(8)), fifth_bits(w.add(4)));
            [0, 1].map(|h| vreinterpretq_s8_u8(vorrq_u8(low[h], high[h])))
        }
    }
}

/// Eight blocks: block `k`'s term `(d_w · d_a) · f32(sumi) + m_w · s_a` is added to lane `k` of each
/// row's accumulators (the eight start at a multiple of 8 blocks, so lane `k` is lane `block % 8`).
///
/// # Safety
///
/// `w` must point at eight readable weight blocks (`8 · K::BYTES` bytes) and each `a[r]` at eight readable Q8_1
/// blocks (`8 · 36` bytes), in the NEON context.
#[inline(always)]
unsafe fn offset32_step<K: Offset32, const R: usize>(w: *const u8, a: [*const u8; R], acc: &mut [[float32x4_t; 2]; R]) {
    const AB: usize = q8_1::BLOCK_BYTES;

    // SAFETY: `K::quants(w + k · BYTES)` reads block `k < 8`, and `f16x8(w, BYTES)` and `f16x8(w + 2, BYTES)` their
    // `d` and `m` (bytes 0..4): inside the eight weight blocks at `w`. The loads at `a + 36k + 4` and `+ 16` read
    // the 32 quants of activation block `k < 8`, and `f16x8(a, 36)` and `f16x8(a + 2, 36)` their `d` and `s`:
    // inside the eight Q8_1 blocks at `a[r]`. The caller guarantees both, and the NEON context with the dot product
    // (`sdot`).
    unsafe {
        let q: [[int8x16_t; 2]; 8] = array::from_fn(|k| K::quants(w.add(k * K::BYTES)));
        let (d_w, m_w) = (f16x8(w, K::BYTES), f16x8(w.add(2), K::BYTES));
        let zero = vdupq_n_s32(0);
        for (acc, a) in acc.iter_mut().zip(a) {
            let s: [int32x4_t; 8] = array::from_fn(|k| {
                let aq = a.add(k * AB + 4);
                sdot(sdot(zero, q[k][0], load_s8(aq)), q[k][1], load_s8(aq.add(16)))
            });
            // Lane j of `vpaddq(x, y)`: x's lanes 2j, 2j + 1 (j < 2), then y's: two rounds leave block
            // k's sum in lane k % 4.
            let sums = [0, 4].map(|h| vpaddq_s32(vpaddq_s32(s[h], s[h + 1]), vpaddq_s32(s[h + 2], s[h + 3])));
            let (d_a, s_a) = (f16x8(a, AB), f16x8(a.add(2), AB));
            for h in 0..2 {
                let scaled = vmulq_f32(vmulq_f32(d_w[h], d_a[h]), vcvtq_f32_s32(sums[h]));
                let term = vaddq_f32(scaled, vmulq_f32(m_w[h], s_a[h]));
                acc[h] = vaddq_f32(acc[h], term);
            }
        }
    }
}

/// Eight blocks at a time; a row's last blocks padded to eight.
///
/// # Safety
///
/// The NEON context. Memory is read only through the slices, whose lengths it checks: `w`'s whole blocks, and
/// activation rows asserted to hold as many.
#[inline(always)]
unsafe fn offset32_rows<K: Offset32, const R: usize>(w: &[u8], acts: [&[u8]; R], out: &mut [f32]) {
    const AB: usize = q8_1::BLOCK_BYTES;

    // SAFETY: the caller provides the NEON context. Group `g < full = nb / 8` spans `8 · BYTES` bytes of `w` from
    // `8g · BYTES` (`nb = w.len() / BYTES`) and `8 · AB` bytes of each activation row from `8g · AB`, inside it as
    // its length `>= nb · AB` is asserted above; the tail's eight blocks are the padded copies `w_pad` (`8 · 24`
    // bytes, room for Q5_1) and `a_pad` (`8 · AB` bytes each).
    unsafe {
        let nb = w.len() / K::BYTES;
        for a in acts {
            assert!(a.len() >= nb * AB, "activation row shorter than weight row");
        }
        let zero = vdupq_n_f32(0.0);
        let mut acc = [[zero; 2]; R];
        let full = nb / 8;
        for g in 0..full {
            let wg = w.as_ptr().add(g * 8 * K::BYTES);
            let a = array::from_fn(|r| acts[r].as_ptr().add(g * 8 * AB));
            offset32_step::<K, R>(wg, a, &mut acc);
        }
        let tail = nb % 8;
        if tail > 0 {
            // Pad weights and activations to eight blocks with zero blocks, whose terms are
            // (0 · 0) · 0 + 0 · 0 = +0.0 and leave the lanes as they are.
            let (w0, a0) = (full * 8 * K::BYTES, full * 8 * AB);
            let mut w_pad = [0u8; 8 * 24]; // room for the larger format, Q5_1
            w_pad[..tail * K::BYTES].copy_from_slice(&w[w0..w0 + tail * K::BYTES]);
            let mut a_pad = [[0u8; 8 * AB]; R];
            for (pad, a) in a_pad.iter_mut().zip(acts) {
                pad[..tail * AB].copy_from_slice(&a[a0..a0 + tail * AB]);
            }
            let a = array::from_fn(|r| a_pad[r].as_ptr());
            offset32_step::<K, R>(w_pad.as_ptr(), a, &mut acc);
        }
        for (o, acc) in out.iter_mut().zip(acc) {
            *o = lanes8(acc).sum();
        }
    }
}

/// Q4_1 weights times Q8_1 activations.
///
/// # Safety
///
/// As for [`offset32_rows`]: the NEON context.
#[inline(always)]
unsafe fn q4_1_rows<const R: usize>(w: &[u8], acts: [&[u8]; R], out: &mut [f32]) {
    // SAFETY: the caller provides what `offset32_rows` needs (`# Safety`).
    unsafe { offset32_rows::<Q4_1, R>(w, acts, out) }
}

/// Q5_1 weights times Q8_1 activations.
///
/// # Safety
///
/// As for [`offset32_rows`]: the NEON context.
#[inline(always)]
unsafe fn q5_1_rows<const R: usize>(w: &[u8], acts: [&[u8]; R], out: &mut [f32]) {
    // SAFETY: the caller provides what `offset32_rows` needs (`# Safety`).
    unsafe { offset32_rows::<Q5_1, R>(w, acts, out) }
}

// ---------------------------------------------------------------------------------------------
// K-quants times Q8_K: per block, exact integers reduced to scalars, then the scalar float formula.

const Q8K_QS: usize = 4;
const Q8K_BSUMS: usize = 4 + 256;

/// Q4_K/Q5_K's 12 packed bytes as (8 scales, 8 mins), unpacked 32 bits at a time as ggml's SIMD
/// kernels do; equal to [`crate::formats::q4_k::scale_min`] for each sub-block.
#[inline(always)]
fn scales_mins(packed: &[u8]) -> ([u8; 8], [u8; 8]) {
    let u = |i: usize| u32::from_le_bytes(array::from_fn(|k| packed[4 * i + k]));
    let (u0, u1, u2) = (u(0), u(1), u(2));
    let (low6, low4, top2) = (0x3F3F_3F3F, 0x0F0F_0F0F, 0x0303_0303);
    let words = [
        u0 & low6,                                      // scales 0..4
        (u2 & low4) | (((u0 >> 6) & top2) << 4),        // scales 4..8
        u1 & low6,                                      // mins 0..4
        ((u2 >> 4) & low4) | (((u1 >> 6) & top2) << 4), // mins 4..8
    ];
    let bytes: [u8; 16] = array::from_fn(|i| words[i / 4].to_le_bytes()[i % 4]);
    (array::from_fn(|s| bytes[s]), array::from_fn(|s| bytes[8 + s]))
}

/// `Σ_s min_s · (bsums_2s + bsums_2s+1)` for Q4_K/Q5_K, `mins` holding min_s in i16 lane s.
///
/// # Safety
///
/// `ab` must point at a whole readable Q8_K block (its `bsums` are read), in the NEON context.
#[inline(always)]
unsafe fn mins_dot(ab: *const u8, mins: int16x8_t) -> i32 {
    // SAFETY: the two `ld1` read the 32 bytes of `bsums`, `ab + 260 .. ab + 292`, the end of the Q8_K block the
    // caller guarantees at `ab`; the rest is register work in the NEON context the caller provides (`# Safety`).
    unsafe {
        let bsums = [
            vreinterpretq_s16_u8(vld1q_u8(ab.add(Q8K_BSUMS))),
            vreinterpretq_s16_u8(vld1q_u8(ab.add(Q8K_BSUMS + 16))),
        ];
        // |bsum| <= 16 · 128, so pair sums fit in i16.
        let pairs = vpaddq_s16(bsums[0], bsums[1]);
        let prod = vaddq_s32(
            vmull_s16(vget_low_s16(pairs), vget_low_s16(mins)),
            vmull_high_s16(pairs, mins),
        );
        vaddvq_s32(prod)
    }
}

/// Q4_K and Q5_K share scales, mins and the float formula; they differ in Q5_K's fifth bits.
///
/// # Safety
///
/// The NEON context. Memory is read only through the slices, whose lengths it checks: `w`'s whole blocks, and
/// activation rows asserted to hold as many.
#[inline(always)]
unsafe fn q45_k_rows<const R: usize, const BYTES: usize, const Q5: bool>(w: &[u8], acts: [&[u8]; R], out: &mut [f32]) {
    const AB: usize = q8_k::BLOCK_BYTES;

    // SAFETY: the caller provides the NEON context. `wb` is one whole `BYTES`-byte block: Q5_K's `qh` loads read
    // bytes `16 .. 48`, the quant loads end at `48 + 3 · 32 + 32 = 176` for Q5_K (`16 + 128 = 144` for Q4_K); the
    // mins load reads the 8-byte array `mins`. `a[r]` is block `b < nb` of an activation row of at least `nb · AB`
    // bytes (asserted above), a whole Q8_K block: its quant loads end at `4 + 64 · 3 + 64 = 260`, `mins_dot` reads
    // its `bsums` (`260 .. 292`), `read_unaligned` its f32 `d` at 0.
    unsafe {
        let nb = w.len() / BYTES;
        for a in acts {
            assert!(a.len() >= nb * AB, "activation row shorter than weight row");
        }
        let m4 = vdupq_n_u8(0x0F);
        let (one, two) = (vdupq_n_u8(1), vdupq_n_u8(2));
        let zero = vdupq_n_s32(0);
        let mut lanes = [Lanes8::default(); R];
        for (b, wb) in w.chunks_exact(BYTES).enumerate() {
            let (scales, mins) = scales_mins(&wb[4..16]);
            let mins = vreinterpretq_s16_u16(vmovl_u8(vld1_u8(mins.as_ptr())));
            let a: [*const u8; R] = array::from_fn(|r| acts[r].as_ptr().add(b * AB));
            let mut acc = [zero; R];
            let p = wb.as_ptr();
            // Q5_K's fifth bits: bit s of qh[l] for sub-block s, element l; shifted down 2 per pair of
            // sub-blocks.
            let mut qh = if Q5 {
                [vld1q_u8(p.add(16)), vld1q_u8(p.add(32))]
            } else {
                [vdupq_n_u8(0); 2]
            };
            let qs = p.add(if Q5 { 48 } else { 16 });
            for j in 0..4 {
                // Sub-blocks 2j (low nibbles) and 2j + 1 (high nibbles), elements 0..16 and 16..32.
                let q = [vld1q_u8(qs.add(32 * j)), vld1q_u8(qs.add(32 * j + 16))];
                let mut lo = q.map(|q| vandq_u8(q, m4));
                let mut hi = q.map(|q| vshrq_n_u8::<4>(q));
                if Q5 {
                    for h in 0..2 {
                        lo[h] = vorrq_u8(lo[h], vshlq_n_u8::<4>(vandq_u8(qh[h], one)));
                        hi[h] = vorrq_u8(hi[h], vshlq_n_u8::<3>(vandq_u8(qh[h], two)));
                        qh[h] = vshrq_n_u8::<2>(qh[h]);
                    }
                }
                let (lo, hi) = (lo.map(|v| vreinterpretq_s8_u8(v)), hi.map(|v| vreinterpretq_s8_u8(v)));
                let (s0, s1) = (i32::from(scales[2 * j]), i32::from(scales[2 * j + 1]));
                for r in 0..R {
                    // Quants <= 31, |a| <= 128: a lane of one sub-block <= 8 · 3968; times a 6-bit
                    // scale, far inside i32.
                    let aq = a[r].add(Q8K_QS + 64 * j);
                    let sub0 = sdot(sdot(zero, lo[0], load_s8(aq)), lo[1], load_s8(aq.add(16)));
                    let sub1 = sdot(sdot(zero, hi[0], load_s8(aq.add(32))), hi[1], load_s8(aq.add(48)));
                    acc[r] = vmlaq_n_s32(acc[r], sub0, s0);
                    acc[r] = vmlaq_n_s32(acc[r], sub1, s1);
                }
            }
            let (d, dmin) = (f16_at(wb, 0), f16_at(wb, 2));
            for r in 0..R {
                let (sumi, summ) = (vaddvq_s32(acc[r]), mins_dot(a[r], mins));
                let d_a = (a[r] as *const f32).read_unaligned();
                lanes[r].add(b, (d * d_a) * sumi as f32 - (dmin * d_a) * summ as f32);
            }
        }
        for (o, l) in out.iter_mut().zip(lanes) {
            *o = l.sum();
        }
    }
}

/// Q4_K weights times Q8_K activations.
///
/// # Safety
///
/// As for [`q45_k_rows`]: the NEON context.
#[inline(always)]
unsafe fn q4_k_rows<const R: usize>(w: &[u8], acts: [&[u8]; R], out: &mut [f32]) {
    // SAFETY: the caller provides what `q45_k_rows` needs (`# Safety`).
    unsafe { q45_k_rows::<R, 144, false>(w, acts, out) }
}

/// Q5_K weights times Q8_K activations.
///
/// # Safety
///
/// As for [`q45_k_rows`]: the NEON context.
#[inline(always)]
unsafe fn q5_k_rows<const R: usize>(w: &[u8], acts: [&[u8]; R], out: &mut [f32]) {
    // SAFETY: the caller provides what `q45_k_rows` needs (`# Safety`).
    unsafe { q45_k_rows::<R, 176, true>(w, acts, out) }
}

/// Q6_K weights times Q8_K activations.
///
/// # Safety
///
/// The NEON context. Memory is read only through the slices, whose lengths it checks: `w`'s whole blocks, and
/// activation rows asserted to hold as many.
#[inline(always)]
unsafe fn q6_k_rows<const R: usize>(w: &[u8], acts: [&[u8]; R], out: &mut [f32]) {
    const WB: usize = 210;
    const AB: usize = q8_k::BLOCK_BYTES;

    // SAFETY: the caller provides the NEON context. `p` is one whole 210-byte block `wb`: `ql` at
    // `64n + 16h .. + 16` and `64n + 32 + 16h .. + 16`, `qh` at `128 + 32n + 16h .. + 16` (`n, h < 2`: ending at
    // 192); its scales are read by indexing `wb`. `a[r]` is block `b < nb` of an activation row of at least
    // `nb · AB` bytes (asserted above), a whole Q8_K block: its quants at `4 + 128n + 32k + 16h .. + 16` (`k < 4`:
    // ending at 260), its f32 `d` at 0.
    unsafe {
        let nb = w.len() / WB;
        for a in acts {
            assert!(a.len() >= nb * AB, "activation row shorter than weight row");
        }
        let (m4, m30, off) = (vdupq_n_u8(0x0F), vdupq_n_u8(0x30), vdupq_n_s8(32));
        let zero = vdupq_n_s32(0);
        let mut lanes = [Lanes8::default(); R];
        for (b, wb) in w.chunks_exact(WB).enumerate() {
            let p = wb.as_ptr();
            let scale = |s: usize| i32::from(wb[192 + s] as i8);
            let a: [*const u8; R] = array::from_fn(|r| acts[r].as_ptr().add(b * AB));
            let mut acc = [zero; R];
            for n in 0..2 {
                for h in 0..2 {
                    // Elements 128n + 32k + 16h + (0..16): sub-block 8n + 2k + h.
                    let ql0 = vld1q_u8(p.add(64 * n + 16 * h));
                    let ql1 = vld1q_u8(p.add(64 * n + 32 + 16 * h));
                    let qh = vld1q_u8(p.add(128 + 32 * n + 16 * h));
                    let bits = [
                        vorrq_u8(vandq_u8(ql0, m4), vandq_u8(vshlq_n_u8::<4>(qh), m30)),
                        vorrq_u8(vandq_u8(ql1, m4), vandq_u8(vshlq_n_u8::<2>(qh), m30)),
                        vorrq_u8(vshrq_n_u8::<4>(ql0), vandq_u8(qh, m30)),
                        vorrq_u8(vshrq_n_u8::<4>(ql1), vandq_u8(vshrq_n_u8::<2>(qh), m30)),
                    ];
                    let q = bits.map(|v| vsubq_s8(vreinterpretq_s8_u8(v), off));
                    for (k, &qk) in q.iter().enumerate() {
                        let s = 8 * n + 2 * k + h;
                        for r in 0..R {
                            // |q| <= 32, |a| <= 128: a lane <= 4 · 4096; times an i8 scale, far inside i32.
                            let aq = load_s8(a[r].add(Q8K_QS + 128 * n + 32 * k + 16 * h));
                            acc[r] = vmlaq_n_s32(acc[r], sdot(zero, qk, aq), scale(s));
                        }
                    }
                }
            }
            let d = f16_at(wb, 208);
            for r in 0..R {
                let d_a = (a[r] as *const f32).read_unaligned();
                lanes[r].add(b, (d * d_a) * vaddvq_s32(acc[r]) as f32);
            }
        }
        for (o, l) in out.iter_mut().zip(lanes) {
            *o = l.sum();
        }
    }
}

/// Q2_K weights times Q8_K activations.
///
/// # Safety
///
/// The NEON context. Memory is read only through the slices, whose lengths it checks: `w`'s whole blocks, and
/// activation rows asserted to hold as many.
#[inline(always)]
unsafe fn q2_k_rows<const R: usize>(w: &[u8], acts: [&[u8]; R], out: &mut [f32]) {
    const WB: usize = 84;
    const AB: usize = q8_k::BLOCK_BYTES;

    // SAFETY: the caller provides the NEON context. `p` is one whole 84-byte block `wb`: its packed scales at
    // `0 .. 16`, its quants at `16 + 32n + 16h .. + 16` (`n, h < 2`: ending at 80). `a[r]` is block `b < nb` of an
    // activation row of at least `nb · AB` bytes (asserted above), a whole Q8_K block: its quants at
    // `4 + 128n + 32j + 16h .. + 16` (`j < 4`: ending at 260), its `bsums` at `260 .. 292`, its f32 `d` at 0.
    unsafe {
        let nb = w.len() / WB;
        for a in acts {
            assert!(a.len() >= nb * AB, "activation row shorter than weight row");
        }
        let m3 = vdupq_n_u8(3);
        let zero = vdupq_n_s32(0);
        let mut lanes = [Lanes8::default(); R];
        for (b, wb) in w.chunks_exact(WB).enumerate() {
            let p = wb.as_ptr();
            // Sub-block s: scale in the low nibble of byte s, min in the high one.
            let scale = |s: usize| i32::from(wb[s] & 0x0F);
            let packed = vld1q_u8(p);
            let mins = vshrq_n_u8::<4>(packed);
            let mins = [
                vreinterpretq_s16_u16(vmovl_u8(vget_low_u8(mins))),
                vreinterpretq_s16_u16(vmovl_high_u8(mins)),
            ];
            let a: [*const u8; R] = array::from_fn(|r| acts[r].as_ptr().add(b * AB));
            let mut acc = [zero; R];
            for n in 0..2 {
                for h in 0..2 {
                    // Elements 128n + 32j + 16h + (0..16): sub-block 8n + 2j + h, bits 2j.. of
                    // qs[32n + 16h + l].
                    let qs = vld1q_u8(p.add(16 + 32 * n + 16 * h));
                    let q = [
                        vandq_u8(qs, m3),
                        vandq_u8(vshrq_n_u8::<2>(qs), m3),
                        vandq_u8(vshrq_n_u8::<4>(qs), m3),
                        vshrq_n_u8::<6>(qs),
                    ];
                    for (j, &qj) in q.iter().enumerate() {
                        let (qj, s) = (vreinterpretq_s8_u8(qj), 8 * n + 2 * j + h);
                        for r in 0..R {
                            // Quants <= 3, |a| <= 128: a lane <= 4 · 384; times a 4-bit scale, far
                            // inside i32.
                            let aq = load_s8(a[r].add(Q8K_QS + 128 * n + 32 * j + 16 * h));
                            acc[r] = vmlaq_n_s32(acc[r], sdot(zero, qj, aq), scale(s));
                        }
                    }
                }
            }
            let (d, dmin) = (f16_at(wb, 80), f16_at(wb, 82));
            for r in 0..R {
                // |bsum| <= 2048 and mins <= 15: exact in i32.
                let bsums = [0, 16].map(|at| vreinterpretq_s16_u8(vld1q_u8(a[r].add(Q8K_BSUMS + at))));
                let prod = [0, 1].map(|k| {
                    vaddq_s32(
                        vmull_s16(vget_low_s16(bsums[k]), vget_low_s16(mins[k])),
                        vmull_high_s16(bsums[k], mins[k]),
                    )
                });
                let summ = vaddvq_s32(vaddq_s32(prod[0], prod[1]));
                let d_a = (a[r] as *const f32).read_unaligned();
                let sumi = vaddvq_s32(acc[r]);
                lanes[r].add(b, (d * d_a) * sumi as f32 - (dmin * d_a) * summ as f32);
            }
        }
        for (o, l) in out.iter_mut().zip(lanes) {
            *o = l.sum();
        }
    }
}

/// Q3_K weights times Q8_K activations.
///
/// # Safety
///
/// The NEON context. Memory is read only through the slices, whose lengths it checks: `w`'s whole blocks, and
/// activation rows asserted to hold as many.
#[inline(always)]
unsafe fn q3_k_rows<const R: usize>(w: &[u8], acts: [&[u8]; R], out: &mut [f32]) {
    const WB: usize = 110;
    const AB: usize = q8_k::BLOCK_BYTES;

    // SAFETY: the caller provides the NEON context. `p` is one whole 110-byte block `wb`: `hmask` at
    // `16h .. 16h + 16`, `qs` at `32 + 32n + 16h .. + 16` (`n, h < 2`: ending at 96). `a[r]` is block `b < nb` of
    // an activation row of at least `nb · AB` bytes (asserted above), a whole Q8_K block: its quants at
    // `4 + 128n + 32j + 16h .. + 16` (`j < 4`: ending at 260), its f32 `d` at 0.
    unsafe {
        let nb = w.len() / WB;
        for a in acts {
            assert!(a.len() >= nb * AB, "activation row shorter than weight row");
        }
        let (m3, four) = (vdupq_n_u8(3), vdupq_n_u8(4));
        let zero = vdupq_n_s32(0);
        let mut lanes = [Lanes8::default(); R];
        for (b, wb) in w.chunks_exact(WB).enumerate() {
            let p = wb.as_ptr();
            let scale = q3_k::scales(wb).map(i32::from);
            let a: [*const u8; R] = array::from_fn(|r| acts[r].as_ptr().add(b * AB));
            let mut acc = [zero; R];
            for n in 0..2 {
                for h in 0..2 {
                    // Elements 128n + 32j + 16h + (0..16): sub-block 8n + 2j + h. Bits 2j.. of
                    // qs[32n + 16h + l], minus 4 where bit 4n + j of hmask[16h + l] is clear.
                    let qs = vld1q_u8(p.add(32 + 32 * n + 16 * h));
                    let hmask = vld1q_u8(p.add(16 * h));
                    for j in 0..4 {
                        let low = vandq_u8(vshlq_u8(qs, vdupq_n_s8(-2 * j as i8)), m3);
                        let set = vtstq_u8(hmask, vdupq_n_u8(1 << (4 * n + j)));
                        let u = vorrq_u8(low, vandq_u8(set, four));
                        let q = vsubq_s8(vreinterpretq_s8_u8(u), vreinterpretq_s8_u8(four));
                        let s = 8 * n + 2 * j + h;
                        for r in 0..R {
                            // |q| <= 4, |a| <= 128: a lane <= 4 · 512; times an i8 scale, far inside i32.
                            let aq = load_s8(a[r].add(Q8K_QS + 128 * n + 32 * j + 16 * h));
                            acc[r] = vmlaq_n_s32(acc[r], sdot(zero, q, aq), scale[s]);
                        }
                    }
                }
            }
            let d = f16_at(wb, 108);
            for r in 0..R {
                let d_a = (a[r] as *const f32).read_unaligned();
                lanes[r].add(b, (d * d_a) * vaddvq_s32(acc[r]) as f32);
            }
        }
        for (o, l) in out.iter_mut().zip(lanes) {
            *o = l.sum();
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Float weights times F32 activations: product i goes to lane i % 8, which is lane i % 4 of the low
// accumulator (i % 8 < 4) or of the high one.

/// A float weight format, widened to f32 exactly.
///
/// # Safety
///
/// `widen8` reads elements `8i .. 8i + 8` of the row at `w` (`8 · BYTES` bytes from `w + 8i · BYTES`),
/// which must be readable, in the NEON context.
trait FloatWeights {
    const BYTES: usize;
    /// Elements `8i .. 8i + 8` of the row at `w`: lanes 0..4 and 4..8.
    unsafe fn widen8(w: *const u8, i: usize) -> [float32x4_t; 2];
    /// Element `i`, as the scalar twin widens it.
    fn at(w: &[u8], i: usize) -> f32;
}

struct F32;

impl FloatWeights for F32 {
    const BYTES: usize = 4;

    #[inline(always)]
    unsafe fn widen8(w: *const u8, i: usize) -> [float32x4_t; 2] {
        // SAFETY: the two loads read the 32 bytes of elements `8i .. 8i + 8` at `w + 32i`, which the caller
        // guarantees readable (`FloatWeights`'s `# Safety`), as it does the NEON context.
        unsafe {
            let p = w.add(32 * i);
            [load_f32(p), load_f32(p.add(16))]
        }
    }

    #[inline(always)]
    fn at(w: &[u8], i: usize) -> f32 {
        crate::formats::f32_at(w, 4 * i)
    }
}

struct F16;

impl FloatWeights for F16 {
    const BYTES: usize = 2;

    #[inline(always)]
    unsafe fn widen8(w: *const u8, i: usize) -> [float32x4_t; 2] {
        // SAFETY: `ld1` reads the 16 bytes of elements `8i .. 8i + 8` at `w + 16i`, which the caller guarantees
        // readable (`FloatWeights`'s `# Safety`), as it does the NEON context.
        unsafe {
            let h = vreinterpretq_u16_u8(vld1q_u8(w.add(16 * i)));
            [widen_low(h), widen_high(h)]
        }
    }

    #[inline(always)]
    fn at(w: &[u8], i: usize) -> f32 {
        f16_at(w, 2 * i)
    }
}

struct Bf16;

impl FloatWeights for Bf16 {
    const BYTES: usize = 2;

    #[inline(always)]
    unsafe fn widen8(w: *const u8, i: usize) -> [float32x4_t; 2] {
        // SAFETY: `ld1` reads the 16 bytes of elements `8i .. 8i + 8` at `w + 16i`, which the caller guarantees
        // readable (`FloatWeights`'s `# Safety`), as it does the NEON context.
        unsafe {
            // A bf16 is the high half of its f32: widen each to 32 bits and shift it up.
            let h = vreinterpretq_u16_u8(vld1q_u8(w.add(16 * i)));
            [
                vreinterpretq_f32_u32(vshll_n_u16::<16>(vget_low_u16(h))),
                vreinterpretq_f32_u32(vshll_high_n_u16::<16>(h)),
            ]
        }
    }

    #[inline(always)]
    fn at(w: &[u8], i: usize) -> f32 {
        crate::formats::bf16::bf16_at(w, 2 * i)
    }
}

/// Float weights times F32 activations: product `i` to lane `i % 8`.
///
/// # Safety
///
/// The NEON context. Memory is read only through the slices, whose lengths it checks.
#[inline(always)]
unsafe fn float_rows<K: FloatWeights, const R: usize>(w: &[u8], acts: [&[u8]; R], out: &mut [f32]) {
    // SAFETY: the caller provides the NEON context. For `i < full = n / 8`, `widen8` reads elements `8i .. 8i + 8`
    // of `w`, which holds `n = w.len() / BYTES` of them, and the activation loads bytes `32i .. 32i + 32` of a row
    // asserted above to hold at least `4n`.
    unsafe {
        let n = w.len() / K::BYTES;
        for a in acts {
            assert!(a.len() >= 4 * n, "activation row shorter than weight row");
        }
        let zero = vdupq_n_f32(0.0);
        let mut acc = [[zero; 2]; R];
        let full = n / 8;
        for i in 0..full {
            let wv = K::widen8(w.as_ptr(), i);
            for r in 0..R {
                let p = acts[r].as_ptr().add(32 * i);
                let av = [load_f32(p), load_f32(p.add(16))];
                for h in 0..2 {
                    acc[r][h] = vaddq_f32(acc[r][h], vmulq_f32(wv[h], av[h]));
                }
            }
        }
        for r in 0..R {
            let mut lanes = lanes8(acc[r]);
            for i in 8 * full..n {
                lanes.add(i, K::at(w, i) * crate::formats::f32_at(acts[r], 4 * i));
            }
            out[r] = lanes.sum();
        }
    }
}

/// F32 weights times F32 activations.
///
/// # Safety
///
/// As for [`float_rows`]: the NEON context.
#[inline(always)]
unsafe fn f32_rows<const R: usize>(w: &[u8], acts: [&[u8]; R], out: &mut [f32]) {
    // SAFETY: the caller provides what `float_rows` needs (`# Safety`).
    unsafe { float_rows::<F32, R>(w, acts, out) }
}

/// F16 weights times F32 activations.
///
/// # Safety
///
/// As for [`float_rows`]: the NEON context.
#[inline(always)]
unsafe fn f16_rows<const R: usize>(w: &[u8], acts: [&[u8]; R], out: &mut [f32]) {
    // SAFETY: the caller provides what `float_rows` needs (`# Safety`).
    unsafe { float_rows::<F16, R>(w, acts, out) }
}

/// BF16 weights times F32 activations.
///
/// # Safety
///
/// As for [`float_rows`]: the NEON context.
#[inline(always)]
unsafe fn bf16_rows<const R: usize>(w: &[u8], acts: [&[u8]; R], out: &mut [f32]) {
    // SAFETY: the caller provides what `float_rows` needs (`# Safety`).
    unsafe { float_rows::<Bf16, R>(w, acts, out) }
}

// ---------------------------------------------------------------------------------------------
// Activation quantisers: the same bytes as `q8_0::quantize` and `q8_k::quantize`.

/// `max(|x|)`, ignoring NaNs as the scalar `f32::max` / `>` loops do (`fmaxnm` returns the number
/// when one operand is a quiet NaN; the maximum of non-NaN values does not depend on the order).
///
/// # Safety
///
/// The NEON context.
#[inline(always)]
unsafe fn abs_max(v: &[float32x4_t]) -> f32 {
    // SAFETY: register operations only, in the NEON context the caller provides (`# Safety`).
    unsafe {
        let mut m = vdupq_n_f32(0.0);
        for &x in v {
            m = vmaxnmq_f32(m, vabsq_f32(x));
        }
        vmaxnmvq_f32(m)
    }
}

/// Sixteen rounded values, as i32 saturated by the conversion, to i8 as Rust's saturating `as`
/// does (the conversions already took NaN to 0); in element order.
///
/// # Safety
///
/// The NEON context.
#[inline(always)]
unsafe fn to_i8x16(i: [int32x4_t; 4]) -> int8x16_t {
    // SAFETY: register operations only, in the NEON context the caller provides (`# Safety`).
    unsafe {
        let lo = vcombine_s16(vqmovn_s32(i[0]), vqmovn_s32(i[1]));
        let hi = vcombine_s16(vqmovn_s32(i[2]), vqmovn_s32(i[3]));
        vcombine_s8(vqmovn_s16(lo), vqmovn_s16(hi))
    }
}

/// [`q8_0::quantize`]'s bytes, four floats at a time.
///
/// # Safety
///
/// The CPU must have NEON: `super` hands this function out only in the `QuantKernel` that `quant_kernel` builds
/// after `Isa::is_available` confirmed it (with the dot product).
#[target_feature(enable = "neon")]
unsafe fn quantize_q8_0(src: &[f32], dst: &mut [u8]) {
    // SAFETY: this function is compiled with NEON, which its caller guarantees the CPU has (`# Safety`): the
    // context the helpers need. `x` is one block of 32 floats, and the loads at `x + 4k`, `k < 8`, read 4 of them
    // each; `block` is one 34-byte Q8_0 block, and the 16-byte stores at `block + 2 + 16h`, `h < 2`, fill its
    // quants.
    unsafe {
        for (x, block) in src
            .chunks_exact(q8_0::BLOCK_LEN)
            .zip(dst.chunks_exact_mut(q8_0::BLOCK_BYTES))
        {
            let v: [float32x4_t; 8] = array::from_fn(|k| vld1q_f32(x.as_ptr().add(4 * k)));
            let amax = abs_max(&v);
            let d = amax / 127.0;
            let id = if d != 0.0 { 1.0 / d } else { 0.0 };
            block[..2].copy_from_slice(&f16_bytes(d));
            for h in 0..2 {
                // `fcvtas`: round half away from zero (`f32::round`), saturating, NaN to 0.
                let q = to_i8x16(array::from_fn(|k| vcvtaq_s32_f32(vmulq_n_f32(v[4 * h + k], id))));
                vst1q_s8(block.as_mut_ptr().add(2 + 16 * h) as *mut i8, q);
            }
        }
    }
}

/// [`q8_k::quantize`]'s bytes, four floats at a time.
///
/// # Safety
///
/// The CPU must have NEON: `super` hands this function out only in the `QuantKernel` that `quant_kernel` builds
/// after `Isa::is_available` confirmed it (with the dot product).
#[target_feature(enable = "neon")]
unsafe fn quantize_q8_k(src: &[f32], dst: &mut [u8]) {
    // SAFETY: this function is compiled with NEON, which its caller guarantees the CPU has (`# Safety`): the
    // context the helpers need. `x` is one block of 256 floats, and the loads at `x + 4k`, `k < 64`, read 4 of them
    // each; `block` is one 292-byte Q8_K block, and the 16-byte stores at `block + 4 + 16c`, `c < 16`, fill its
    // quants, ending at 260, where its `bsums` start.
    unsafe {
        for (x, block) in src
            .chunks_exact(q8_k::BLOCK_LEN)
            .zip(dst.chunks_exact_mut(q8_k::BLOCK_BYTES))
        {
            let v: [float32x4_t; 64] = array::from_fn(|k| vld1q_f32(x.as_ptr().add(4 * k)));
            let amax = abs_max(&v);
            block.fill(0);
            if amax == 0.0 {
                continue;
            }
            // The reference keeps the first element of largest magnitude, with its sign.
            let target = vdupq_n_f32(amax);
            let first = v
                .iter()
                .position(|&x| vmaxvq_u32(vceqq_f32(vabsq_f32(x), target)) != 0)
                .and_then(|k| (4 * k..4 * k + 4).find(|&i| x[i].abs() == amax))
                .unwrap_or(0);
            let iscale = -127.0 / x[first];
            for c in 0..16 {
                // `fcvtns`: round half to even (`round_ties_even`), saturating, NaN to 0.
                let q = to_i8x16(array::from_fn(|k| vcvtnq_s32_f32(vmulq_n_f32(v[4 * c + k], iscale))));
                vst1q_s8(block.as_mut_ptr().add(Q8K_QS + 16 * c) as *mut i8, q);
                // Sixteen quants sum to at most 16 · 128 in magnitude: exact in i16.
                let sum = vaddlvq_s8(q);
                let at = Q8K_BSUMS + 2 * c;
                block[at..at + 2].copy_from_slice(&sum.to_le_bytes());
            }
            block[..4].copy_from_slice(&(1.0 / iscale).to_le_bytes());
        }
    }
}
