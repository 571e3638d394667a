//! x86-64 kernels: AVX2 (+F16C), and AVX-512 VL + VNNI.
//!
//! Both ISAs share one body per format, generic over [`IntDot`] (how 8-bit products are summed), and
//! work on 256-bit registers: the gain AVX-512 brings to these kernels is VNNI's fused
//! multiply-accumulate and 32 registers, not width (blocks are 32 elements, or 256 split into
//! sub-blocks of 16 and 32). Each body reproduces its scalar twin in `formats/` bit for bit:
//!
//! - integer sums are exact, so they are formed in whatever order the registers allow, with care that
//!   no intermediate saturates (each use of `maddubs` below states its bound);
//! - each block's f32 term uses the scalar formula with separate `mul` and `add` (never FMA), and is
//!   added to lane `block % 8` — for Q4_0, Q5_0, Q8_0 and MXFP4 by handling 8 blocks at once, one
//!   per lane, with the activations in the grouped layout of `grouped.rs`; for Q4_1 and Q5_1 by
//!   handling 8 blocks at once after transposing their sums into lanes; for K-quants by reducing the
//!   block's integers to scalars and using [`Lanes8`] directly;
//! - the lanes are reduced by [`Lanes8::sum`].
//!
//! Every kernel takes one weight row and `R` (1..=its `max_rows`) activation rows, unpacks each weight
//! block once and multiplies it with all `R` rows: the prefill path. Each row's arithmetic is exactly
//! what it would be alone.
//!
//! Activation quants are assumed to be in `-127..=127`, which the quantisers produce (`|x · id|`
//! never exceeds 127 by more than rounding) except in a block whose scale underflows (largest
//! magnitude below ~1e-37: `1 / d` overflows to infinity); such a block's scale is stored as 0, so
//! its term is ±0 whatever its integer sum. The AVX2 Q8_0 kernel relies on it (`sign_epi8`). The
//! Q3_K and Q6_K kernels take their offsets (`-4`, `-32`) from Q8_K's `bsums`, which the quantiser
//! makes the exact sums of the quants (the scalar twins subtract the offset per element instead).
//! Rows that break either property can only be hand-made, and would make the twins disagree.
//!
//! # Safety
//!
//! Every `unsafe fn` here executes AVX2 instructions (and F16C's `vcvtph2ps`; with [`VnniDot`], AVX-512
//! VL + VNNI ones), which are undefined behaviour on a CPU without them. Only the entry points carry
//! `#[target_feature]`: the `entry!` kernels, the quantisers, and the element-wise and float-cache kernels.
//! `super` hands them out only inside a `DotKernel`, `QuantKernel`, `ElementwiseKernel` or `FloatKernel`,
//! which it builds only after `Isa::is_available` confirmed the ISA on this CPU. The `#[inline(always)]`
//! helpers have no features of their own: they are called only from those entry points, and inlined into
//! them. Their `# Safety` sections call that obligation *the AVX2 context*: running on a CPU with AVX2 and
//! F16C, inside an entry point compiled with them (plus `D`'s features for helpers generic over an
//! [`IntDot`] `D`). They also name the bytes a helper reads or writes through raw pointers; each `SAFETY:`
//! comment says why both hold where it stands. The row kernels derive every pointer from slices whose
//! lengths they check: `nb` whole weight blocks in `w`, and an `assert!` that each activation row holds as
//! many.

use std::arch::x86_64::*;
use std::array;

use super::{ActLayout, DotFn, DotKernel, Isa, QuantFn, MAX_ROWS};
use crate::accum::Lanes8;
use crate::formats::{f16_at, f16_bytes, mxfp4, q3_k, q8_0, q8_1, q8_k};
use crate::WeightLayout;
use crate::{grouped, GgmlType};

/// The dot-product kernel for `ty` on `isa`, if there is a SIMD one. The caller checks the CPU.
pub(super) fn dot_kernel(isa: Isa, ty: GgmlType, layout: WeightLayout) -> Option<DotKernel> {
    use ActLayout::{Grouped, Plain};
    if layout == WeightLayout::Regrouped {
        let f: DotFn = match (isa, ty) {
            (Isa::Avx2, GgmlType::Q4_0) => avx2::q4_0g,
            (Isa::Avx2, GgmlType::Q8_0) => avx2::q8_0g,
            (Isa::Avx512, GgmlType::Q4_0) => avx512::q4_0g,
            (Isa::Avx512, GgmlType::Q8_0) => avx512::q8_0g,
            (Isa::Avx2, GgmlType::MXFP4) => avx2::mxfp4g,
            (Isa::Avx512, GgmlType::MXFP4) => avx512::mxfp4g,
            _ => return None,
        };
        return Some(DotKernel {
            f,
            isa,
            layout: Grouped,
            max_rows: 8,
        });
    }
    // Grouped kernels keep a row's state in one register, so they take the most rows; the others
    // keep four rows' accumulators and the unpacked weights in AVX2's 16 registers.
    let (f, layout, max_rows): (DotFn, _, _) = match (isa, ty) {
        (Isa::Avx2, GgmlType::Q4_0) => (avx2::q4_0, Grouped, 8),
        (Isa::Avx2, GgmlType::Q5_0) => (avx2::q5_0, Grouped, 8),
        (Isa::Avx2, GgmlType::Q8_0) => (avx2::q8_0, Grouped, 8),
        (Isa::Avx2, GgmlType::MXFP4) => (avx2::mxfp4, Grouped, 8),
        (Isa::Avx2, GgmlType::Q4_1) => (avx2::q4_1, Plain, 4),
        (Isa::Avx2, GgmlType::Q5_1) => (avx2::q5_1, Plain, 4),
        (Isa::Avx2, GgmlType::Q2_K) => (avx2::q2_k, Plain, 4),
        (Isa::Avx2, GgmlType::Q3_K) => (avx2::q3_k, Plain, 4),
        (Isa::Avx2, GgmlType::Q4_K) => (avx2::q4_k, Plain, 4),
        (Isa::Avx2, GgmlType::Q5_K) => (avx2::q5_k, Plain, 4),
        (Isa::Avx2, GgmlType::Q6_K) => (avx2::q6_k, Plain, 4),
        (Isa::Avx512, GgmlType::Q4_0) => (avx512::q4_0, Grouped, 8),
        (Isa::Avx512, GgmlType::Q5_0) => (avx512::q5_0, Grouped, 8),
        (Isa::Avx512, GgmlType::Q8_0) => (avx512::q8_0, Grouped, 8),
        (Isa::Avx512, GgmlType::MXFP4) => (avx512::mxfp4, Grouped, 8),
        (Isa::Avx512, GgmlType::Q4_1) => (avx512::q4_1, Plain, 4),
        (Isa::Avx512, GgmlType::Q5_1) => (avx512::q5_1, Plain, 4),
        (Isa::Avx512, GgmlType::Q2_K) => (avx512::q2_k, Plain, 4),
        (Isa::Avx512, GgmlType::Q3_K) => (avx512::q3_k, Plain, 4),
        (Isa::Avx512, GgmlType::Q4_K) => (avx512::q4_k, Plain, 4),
        (Isa::Avx512, GgmlType::Q5_K) => (avx512::q5_k, Plain, 4),
        (Isa::Avx512, GgmlType::Q6_K) => (avx512::q6_k, Plain, 4),
        // Float weights have no integer products: both ISAs run the same AVX2 code.
        (Isa::Avx2 | Isa::Avx512, GgmlType::F32) => (avx2::f32, Plain, 4),
        (Isa::Avx2 | Isa::Avx512, GgmlType::F16) => (avx2::f16, Plain, 4),
        (Isa::Avx2 | Isa::Avx512, GgmlType::BF16) => (avx2::bf16, Plain, 4),
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

/// The activation quantiser for `act_ty` on `isa`, if there is a SIMD one. The caller checks the CPU.
/// Quantisation is float work only, so both ISAs run the AVX2 code.
pub(super) fn quant_fn(isa: Isa, act_ty: GgmlType) -> Option<QuantFn> {
    let f: QuantFn = match (isa, act_ty) {
        (Isa::Avx2 | Isa::Avx512, GgmlType::Q8_0) => quantize_q8_0,
        (Isa::Avx2 | Isa::Avx512, GgmlType::Q8_K) => quantize_q8_k,
        _ => return None,
    };
    Some(f)
}

/// How groups of 8-bit products are summed into 32-bit lanes.
///
/// # Safety
///
/// The methods run the implementation's instructions, registers only: the caller must run on a CPU with
/// AVX2 for [`Avx2Dot`], and with AVX2 and AVX-512 VL + VNNI for [`VnniDot`], which only the `avx512` entry
/// points (compiled with those features, handed out after `Isa::Avx512` was confirmed) use.
trait IntDot {
    /// Whether [`IntDot::dot`] is exact for any bytes (no pair bound).
    const WIDE_PRODUCTS: bool;
    /// `acc + Σ u·s` over each group of 4 bytes (`u` unsigned, `s` signed). Exact when every adjacent
    /// pair `u0·s0 + u1·s1` fits in i16 (AVX2's `maddubs` saturates there; VNNI never does).
    unsafe fn dot(acc: __m256i, u: __m256i, s: __m256i) -> __m256i;
    /// `acc + Σ (u0·s0 + u1·s1) · scale` over each pair of i16 lanes of `scale`. Exact under the same
    /// pair bound (both go through `maddubs`).
    unsafe fn dot_scaled(acc: __m256i, u: __m256i, s: __m256i, scale: __m256i) -> __m256i;
    /// `acc + Σ_j Σ u_j·s_j` over each group of 4 bytes of eight register pairs, when the adjacent-pair
    /// sums `u0·s0 + u1·s1` of any `RUN` consecutive registers, added up, still fit in i16 (the caller's
    /// bound). Exact, as `dot` on each pair is.
    unsafe fn dot_runs<const RUN: usize>(acc: __m256i, u: &[__m256i; 8], s: &[__m256i; 8]) -> __m256i;
}

/// AVX2: `maddubs` (u8·i8 pairs to i16) then `madd` (i16 pairs to i32).
struct Avx2Dot;

impl IntDot for Avx2Dot {
    const WIDE_PRODUCTS: bool = false;

    #[inline(always)]
    unsafe fn dot(acc: __m256i, u: __m256i, s: __m256i) -> __m256i {
        // SAFETY: register operations only (`vpmaddubsw`, `vpmaddwd`, `vpaddd`: AVX2), which `IntDot`'s `# Safety`
        // makes the caller provide.
        unsafe {
            let pairs = _mm256_maddubs_epi16(u, s);
            _mm256_add_epi32(acc, _mm256_madd_epi16(pairs, _mm256_set1_epi16(1)))
        }
    }

    #[inline(always)]
    unsafe fn dot_scaled(acc: __m256i, u: __m256i, s: __m256i, scale: __m256i) -> __m256i {
        // SAFETY: register operations only (`vpmaddubsw`, `vpmaddwd`, `vpaddd`: AVX2), which `IntDot`'s `# Safety`
        // makes the caller provide.
        unsafe {
            let pairs = _mm256_maddubs_epi16(u, s);
            _mm256_add_epi32(acc, _mm256_madd_epi16(pairs, scale))
        }
    }

    /// The pairs of each run are added as i16 and widened once per run, not once per register: a third
    /// fewer instructions per Q4_0 group. Measured on the AVX2 EPYC (`prefill_cpu`): Q4_0 at 8 activation
    /// rows 74 -> 89 GFLOP/s per CPU second; one row, which waits on memory, unchanged.
    #[inline(always)]
    unsafe fn dot_runs<const RUN: usize>(mut acc: __m256i, u: &[__m256i; 8], s: &[__m256i; 8]) -> __m256i {
        // SAFETY: register operations only (AVX2, as in `dot`), which `IntDot`'s `# Safety` makes the caller
        // provide; `u[j]` and `s[j]` are bounds-checked indices below 8.
        unsafe {
            for run in 0..8 / RUN {
                let at = run * RUN;
                let mut pairs = _mm256_maddubs_epi16(u[at], s[at]);
                for j in at + 1..at + RUN {
                    pairs = _mm256_add_epi16(pairs, _mm256_maddubs_epi16(u[j], s[j]));
                }
                acc = _mm256_add_epi32(acc, _mm256_madd_epi16(pairs, _mm256_set1_epi16(1)));
            }
            acc
        }
    }
}

/// AVX-512 VNNI on 256-bit registers: `vpdpbusd` and `vpdpwssd` multiply and accumulate in one step.
struct VnniDot;

impl IntDot for VnniDot {
    const WIDE_PRODUCTS: bool = true;

    #[inline(always)]
    unsafe fn dot(acc: __m256i, u: __m256i, s: __m256i) -> __m256i {
        // SAFETY: `vpdpbusd` on 256-bit registers needs AVX-512 VNNI and VL, which `IntDot`'s `# Safety` makes the
        // caller provide for `VnniDot` (only the `avx512` entry points, compiled with them, use it); registers
        // only.
        unsafe { _mm256_dpbusd_epi32(acc, u, s) }
    }

    #[inline(always)]
    unsafe fn dot_scaled(acc: __m256i, u: __m256i, s: __m256i, scale: __m256i) -> __m256i {
        // SAFETY: `vpmaddubsw` (AVX2) and `vpdpwssd` (AVX-512 VNNI and VL), which `IntDot`'s `# Safety` makes the
        // caller provide for `VnniDot`; registers only.
        unsafe { _mm256_dpwssd_epi32(acc, _mm256_maddubs_epi16(u, s), scale) }
    }

    #[inline(always)]
    unsafe fn dot_runs<const RUN: usize>(mut acc: __m256i, u: &[__m256i; 8], s: &[__m256i; 8]) -> __m256i {
        // SAFETY: `vpdpbusd` as in `dot` (AVX-512 VNNI and VL, which the caller provides for `VnniDot`); `u[j]` and
        // `s[j]` are bounds-checked indices below 8.
        unsafe {
            for j in 0..8 {
                acc = _mm256_dpbusd_epi32(acc, u[j], s[j]);
            }
            acc
        }
    }
}

/// One entry point per (ISA, format): enables the ISA's features, picks the row count (up to the
/// `max_rows` that `dot_kernel` declares for it; `DotKernel::run` has checked the count) and runs every
/// weight row of the call.
macro_rules! entry {
    ($features:literal, $dot:ty: $name:ident, $body:ident, $($r:literal)+) => {
        /// # Safety
        ///
        /// The CPU must have the features this function enables: `super` hands it out only in the `DotKernel` that
        /// `dot_kernel` builds after `Isa::is_available` confirmed them.
        #[target_feature(enable = $features)]
        pub(super) unsafe fn $name(w: &[u8], row_bytes: usize, acts: &[&[u8]], out: &mut [f32]) {
            // SAFETY: this function is compiled with `$features`, and its caller guarantees the CPU has them
            // (`# Safety`): that is the context `$body` and `$dot` need (`$dot` is `VnniDot` only in `avx512`,
            // whose features include VNNI and VL). `$body` reads memory only through the slices `w` (one row of
            // whole blocks) and `a`, whose lengths it asserts against `w`, and writes `out` as a slice.
            unsafe {
                match acts.len() {
                    $($r => {
                        let a = rows::<$r>(acts);
                        for (w, out) in w.chunks_exact(row_bytes).zip(out.chunks_exact_mut($r)) {
                            $body::<$dot, $r>(w, a, out);
                        }
                    })+
                    n => unreachable!("{n} rows"),
                }
            }
        }
    };
}

mod avx2 {
    use super::*;

    entry!("avx2,f16c", Avx2Dot: q4_0, q4_0_rows, 1 2 3 4 5 6 7 8);
    entry!("avx2,f16c", Avx2Dot: q5_0, q5_0_rows, 1 2 3 4 5 6 7 8);
    entry!("avx2,f16c", Avx2Dot: q8_0, q8_0_rows, 1 2 3 4 5 6 7 8);
    entry!("avx2,f16c", Avx2Dot: mxfp4, mxfp4_rows, 1 2 3 4 5 6 7 8);
    entry!("avx2,f16c", Avx2Dot: q4_0g, q4_0g_rows, 1 2 3 4 5 6 7 8);
    entry!("avx2,f16c", Avx2Dot: q8_0g, q8_0g_rows, 1 2 3 4 5 6 7 8);
    entry!("avx2,f16c", Avx2Dot: mxfp4g, mxfp4g_rows, 1 2 3 4 5 6 7 8);
    entry!("avx2,f16c", Avx2Dot: q4_1, q4_1_rows, 1 2 3 4);
    entry!("avx2,f16c", Avx2Dot: q5_1, q5_1_rows, 1 2 3 4);
    entry!("avx2,f16c", Avx2Dot: q2_k, q2_k_rows, 1 2 3 4);
    entry!("avx2,f16c", Avx2Dot: q3_k, q3_k_rows, 1 2 3 4);
    entry!("avx2,f16c", Avx2Dot: q4_k, q4_k_rows, 1 2 3 4);
    entry!("avx2,f16c", Avx2Dot: q5_k, q5_k_rows, 1 2 3 4);
    entry!("avx2,f16c", Avx2Dot: q6_k, q6_k_rows, 1 2 3 4);
    // Float weights have no integer products: AVX-512 runs these too.
    entry!("avx2,f16c", Avx2Dot: f32, f32_rows, 1 2 3 4);
    entry!("avx2,f16c", Avx2Dot: f16, f16_rows, 1 2 3 4);
    entry!("avx2,f16c", Avx2Dot: bf16, bf16_rows, 1 2 3 4);
}

mod avx512 {
    use super::*;

    entry!("avx2,f16c,avx512f,avx512bw,avx512vl,avx512vnni", VnniDot: q4_0, q4_0_rows, 1 2 3 4 5 6 7 8);
    entry!("avx2,f16c,avx512f,avx512bw,avx512vl,avx512vnni", VnniDot: q5_0, q5_0_rows, 1 2 3 4 5 6 7 8);
    entry!("avx2,f16c,avx512f,avx512bw,avx512vl,avx512vnni", VnniDot: q8_0, q8_0_rows, 1 2 3 4 5 6 7 8);
    entry!("avx2,f16c,avx512f,avx512bw,avx512vl,avx512vnni", VnniDot: mxfp4, mxfp4_rows, 1 2 3 4 5 6 7 8);
    entry!("avx2,f16c,avx512f,avx512bw,avx512vl,avx512vnni", VnniDot: q4_0g, q4_0g_rows, 1 2 3 4 5 6 7 8);
    entry!("avx2,f16c,avx512f,avx512bw,avx512vl,avx512vnni", VnniDot: q8_0g, q8_0g_rows, 1 2 3 4 5 6 7 8);
    entry!("avx2,f16c,avx512f,avx512bw,avx512vl,avx512vnni", VnniDot: mxfp4g, mxfp4g_rows, 1 2 3 4 5 6 7 8);
    entry!("avx2,f16c,avx512f,avx512bw,avx512vl,avx512vnni", VnniDot: q4_1, q4_1_rows, 1 2 3 4);
    entry!("avx2,f16c,avx512f,avx512bw,avx512vl,avx512vnni", VnniDot: q5_1, q5_1_rows, 1 2 3 4);
    entry!("avx2,f16c,avx512f,avx512bw,avx512vl,avx512vnni", VnniDot: q2_k, q2_k_rows, 1 2 3 4);
    entry!("avx2,f16c,avx512f,avx512bw,avx512vl,avx512vnni", VnniDot: q3_k, q3_k_rows, 1 2 3 4);
    entry!("avx2,f16c,avx512f,avx512bw,avx512vl,avx512vnni", VnniDot: q4_k, q4_k_rows, 1 2 3 4);
    entry!("avx2,f16c,avx512f,avx512bw,avx512vl,avx512vnni", VnniDot: q5_k, q5_k_rows, 1 2 3 4);
    entry!("avx2,f16c,avx512f,avx512bw,avx512vl,avx512vnni", VnniDot: q6_k, q6_k_rows, 1 2 3 4);
}

/// The first `R` activation rows as an array (the entry points pass exactly `R`).
#[inline(always)]
fn rows<'a, const R: usize>(acts: &[&'a [u8]]) -> [&'a [u8]; R] {
    array::from_fn(|i| acts[i])
}

/// The 32 bytes at `p`, unaligned.
///
/// # Safety
///
/// `p .. p + 32` must be readable, in the AVX2 context.
#[inline(always)]
unsafe fn load(p: *const u8) -> __m256i {
    // SAFETY: `vmovdqu` has no alignment requirement and reads the 32 bytes at `p`, which the caller guarantees
    // readable; AVX is part of the AVX2 context the caller provides (`# Safety`).
    unsafe { _mm256_loadu_si256(p as *const __m256i) }
}

/// Sum of the eight i32 lanes (exact; any order).
///
/// # Safety
///
/// The AVX2 context.
#[inline(always)]
unsafe fn hsum_i32(v: __m256i) -> i32 {
    // SAFETY: register operations only (AVX2's `vextracti128`, SSE2), in the AVX2 context the caller provides
    // (`# Safety`).
    unsafe {
        let s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256::<1>(v));
        let s = _mm_add_epi32(s, _mm_shuffle_epi32::<0b01_00_11_10>(s));
        let s = _mm_add_epi32(s, _mm_shuffle_epi32::<0b10_11_00_01>(s));
        _mm_cvtsi128_si32(s)
    }
}

/// The f16 at `p + k · stride` for `k = 0..8`, widened to f32 (exact, as the scalar `f16_at`).
///
/// # Safety
///
/// The 2 bytes at `p + k · stride` must be readable for each `k < 8`, in the AVX2 context (F16C).
#[inline(always)]
unsafe fn f16x8(p: *const u8, stride: usize) -> __m256 {
    // SAFETY: what `f16_lanes` needs for 8 lanes, which the caller guarantees (`# Safety`).
    unsafe { f16_lanes(p, stride, 8) }
}

/// [`f16x8`] of the first `lanes` f16s only, the other lanes zero.
///
/// # Safety
///
/// The 2 bytes at `p + k · stride` must be readable for each `k < lanes`, in the AVX2 context (F16C).
#[inline(always)]
unsafe fn f16_lanes(p: *const u8, stride: usize, lanes: usize) -> __m256 {
    // SAFETY: each `read_unaligned` reads the 2 bytes at `p + k · stride`, `k < lanes`, which the caller
    // guarantees readable (so each `add` stays inside that allocation); `vcvtph2ps` needs F16C, part of the AVX2
    // context the caller provides (`# Safety`).
    unsafe {
        // Packed into two 64-bit integers by scalar loads and shifts, which run beside the vector work:
        // `vpgatherdd` (several times slower under the gather-data-sampling mitigation) and a 512-bit
        // word permute (which idles half the 256-bit vector units) both measured slower.
        let word = |k: usize| {
            if k < lanes {
                u64::from((p.add(k * stride) as *const u16).read_unaligned())
            } else {
                0
            }
        };
        let quad = |k: usize| word(k) | word(k + 1) << 16 | word(k + 2) << 32 | word(k + 3) << 48;
        _mm256_cvtph_ps(_mm_set_epi64x(quad(4) as i64, quad(0) as i64))
    }
}

/// The bytes at `p + k · stride` for `k < lanes` packed into a u64, byte `k` at bits `8k`, the rest zero.
///
/// # Safety
///
/// The byte at `p + k · stride` must be readable for each `k < lanes` (at most 8).
#[inline(always)]
unsafe fn bytes_u64(p: *const u8, stride: usize, lanes: usize) -> u64 {
    // SAFETY: each read is of a byte the caller guarantees readable (`# Safety`).
    (0..lanes).fold(0u64, |acc, k| acc | u64::from(unsafe { *p.add(k * stride) }) << (8 * k))
}

/// Asks for the weights `PREFETCH_DISTANCE` bytes past `[p, p + len)` to be brought into L2. Decode
/// streams weights from memory and the hardware prefetcher alone leaves the core waiting on part of each
/// row. Tuned twice: on a 2-core Xeon, 4 KiB ahead into L1 took one thread's cold Q4_0 matvec from 5.5
/// to 7.9 GB/s (1, 2, 8 and 16 KiB into L1 were slower); on a 2-core Zen 4 EPYC, with the variants
/// interleaved in one process, 8 KiB into L2 beat 4 KiB into L1 by 15–30% for Q4_0 experts and
/// attention on one and two threads (6 and 12 KiB into L2 within a few percent of 8; no prefetch, or a
/// non-temporal one, as slow as 4 KiB into L1). Prefetches never fault, so running past the end of the
/// matrix is harmless.
///
/// # Safety
///
/// The AVX2 context (its SSE `prefetcht1`). Any `p` will do: nothing is dereferenced.
#[inline(always)]
unsafe fn prefetch_ahead(p: *const u8, len: usize) {
    const PREFETCH_DISTANCE: usize = 8192;

    // SAFETY: `prefetch` is a hint that never faults and dereferences nothing, so any address will do
    // (`wrapping_add` forms it without `add`'s in-bounds requirement); SSE is part of the AVX2 context the caller
    // provides (`# Safety`).
    unsafe {
        let mut off = 0;
        while off < len {
            _mm_prefetch::<_MM_HINT_T1>(p.wrapping_add(PREFETCH_DISTANCE + off) as *const i8);
            off += 64;
        }
    }
}

/// Reduces eight f32 lanes in the documented tree.
///
/// # Safety
///
/// The AVX2 context.
#[inline(always)]
unsafe fn lanes_sum(v: __m256) -> f32 {
    // SAFETY: `vmovups` stores 8 floats into the 8-float array `l`; AVX is part of the AVX2 context the caller
    // provides (`# Safety`).
    unsafe {
        let mut l = [0f32; 8];
        _mm256_storeu_ps(l.as_mut_ptr(), v);
        Lanes8(l).sum()
    }
}

// ---------------------------------------------------------------------------------------------
// Q4_0, Q5_0, Q8_0 and MXFP4 weights times Q8_0 activations in the grouped layout (`grouped.rs`):
// eight blocks at a time, block `k` in lane `k` of every register, so each block's exact sum comes out
// in its own lane and its f32 term goes straight to lane `block % 8` — no horizontal reduction.

/// A weight format of 32-element blocks with one scale, whose quants Q8_0 activations multiply
/// (Q4_0, Q5_0, Q8_0, MXFP4).
///
/// # Safety
///
/// Every method needs the AVX2 context, and `D`'s features where it takes a `D`. `prep` and `scales` read
/// the eight blocks at `w` (`8 · BYTES` bytes: plain blocks, or for `prep::<_, true>` a regrouped run of
/// `lanes` blocks, `lanes · BYTES` bytes; `regrouped_scales` the same run), and `sums` the whole activation
/// group at `a` ([`grouped::GROUP_BYTES`] bytes): those bytes must be readable.
trait Grouped {
    const BYTES: usize;
    /// What every activation row reuses of eight weight blocks.
    type Prep;
    /// The eight blocks at `w`, quants in the grouped register layout: transposed here from plain
    /// blocks, or (`REGROUPED`) loaded as `grouped::regroup_weights` stored them — a group (`lanes` = 8)
    /// or a row's last `lanes < 8` blocks, the other lanes zero (plain blocks ignore `lanes`).
    unsafe fn prep<D: IntDot, const REGROUPED: bool>(w: *const u8, lanes: usize) -> Self::Prep;
    /// Lane `k`: the scale of plain block `k` at `w`, as the scalar twin widens it to f32.
    unsafe fn scales(w: *const u8) -> __m256;
    /// [`Grouped::scales`] of a regrouped run of `lanes` blocks at `w`: its f16 scales first (lanes past
    /// `lanes` zero).
    #[inline(always)]
    unsafe fn regrouped_scales(w: *const u8, lanes: usize) -> __m256 {
        // SAFETY: the first `2 · lanes` bytes of the regrouped run at `w`, readable by the caller's guarantee, in
        // the AVX2 context (F16C) it provides (`Grouped`'s `# Safety`).
        unsafe {
            if lanes == grouped::GROUP_BLOCKS {
                _mm256_cvtph_ps(_mm_loadu_si128(w as *const __m128i))
            } else {
                f16_lanes(w, 2, lanes)
            }
        }
    }
    /// Lane `k`: block `k`'s exact `Σ w·a` with the activation group at `a`.
    unsafe fn sums<D: IntDot>(p: &Self::Prep, a: *const u8) -> __m256i;
}

/// Register `j` of a regrouped run of `lanes` blocks at `w` whose scales take `scales` bytes: the 32 bytes
/// of a group's register, or (a row's last `lanes < 8` blocks) its `lanes` 32-bit lanes, the rest zero —
/// as the zero blocks that pad a plain row's tail would give.
///
/// # Safety
///
/// The `lanes · 4` bytes at `w + scales + 4 · lanes · j` must be readable (a masked load touches no
/// other), in the AVX2 context.
#[inline(always)]
unsafe fn regrouped_register(w: *const u8, scales: usize, lanes: usize, j: usize) -> __m256i {
    // SAFETY: a full group's 32 bytes, or the masked load's first `lanes` dwords (`vpmaskmovd` reads and faults
    // on enabled lanes only), are the bytes the caller guarantees readable; AVX2 context is the caller's.
    unsafe {
        let p = w.add(scales + 4 * lanes * j);
        if lanes == grouped::GROUP_BLOCKS {
            load(p)
        } else {
            let mask = _mm256_cmpgt_epi32(
                _mm256_set1_epi32(lanes as i32),
                _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7),
            );
            _mm256_maskload_epi32(p as *const i32, mask)
        }
    }
}

/// Register `m` holds, in lane `k`, bytes `at + 4m .. at + 4m + 4` of block `k` (blocks `stride`
/// apart from `w`): a 4 × 4 transpose of 32-bit words in each 128-bit half, blocks 0..4 in the low
/// half and 4..8 in the high one.
///
/// # Safety
///
/// The 16 bytes at `w + k · stride + at` must be readable for each `k < 8`, in the AVX2 context.
#[inline(always)]
unsafe fn transpose_quads(w: *const u8, stride: usize, at: usize) -> [__m256i; 4] {
    // SAFETY: each `vmovdqu` reads the 16 bytes at `w + k · stride + at`, `k < 8`, which the caller guarantees
    // readable (for each format `7 · BYTES + at + 16 <= 8 · BYTES`: inside its eight blocks); the unpacks need
    // AVX2, part of the AVX2 context the caller provides (`# Safety`).
    unsafe {
        let piece = |k: usize| _mm_loadu_si128(w.add(k * stride + at) as *const __m128i);
        let y: [__m256i; 4] = array::from_fn(|k| _mm256_setr_m128i(piece(k), piece(k + 4)));
        let t0 = _mm256_unpacklo_epi32(y[0], y[1]);
        let t1 = _mm256_unpackhi_epi32(y[0], y[1]);
        let t2 = _mm256_unpacklo_epi32(y[2], y[3]);
        let t3 = _mm256_unpackhi_epi32(y[2], y[3]);
        [
            _mm256_unpacklo_epi64(t0, t2),
            _mm256_unpackhi_epi64(t0, t2),
            _mm256_unpacklo_epi64(t1, t3),
            _mm256_unpackhi_epi64(t1, t3),
        ]
    }
}

/// Lane `k`: block `k`'s exact `Σ q·a`, from the unsigned weight encoding `u = q + 2^SHIFT` in the
/// eight grouped registers: `Σ u·a - 2^SHIFT · Σa`, with the activations' block sums `Σa`. The pairs of
/// `RUN` registers must fit in i16 together (`IntDot::dot_runs`): with `u <= U` and `|a| <= 128`, that
/// is `RUN · 2 · U · 128 <= 32767`.
///
/// # Safety
///
/// `a` must point at a whole readable activation group ([`grouped::GROUP_BYTES`]), in the AVX2 context with `D`'s
/// features.
#[inline(always)]
unsafe fn offset_dot<D: IntDot, const SHIFT: i32, const RUN: usize>(u: &[__m256i; 8], a: *const u8) -> __m256i {
    // SAFETY: the loads read `a + 32 .. a + 64` (the block sums) and `a + QUANTS_AT .. a + QUANTS_AT + 256` (the
    // eight quant registers), all inside the `GROUP_BYTES = QUANTS_AT + 256` bytes the caller guarantees at `a`;
    // the intrinsics and `D::dot_runs` need the AVX2 context and `D`'s features the caller provides (`# Safety`).
    unsafe {
        // |Σa| <= 32 · 128, so even 128 · Σa is far inside i32.
        let acc = _mm256_sub_epi32(_mm256_setzero_si256(), _mm256_slli_epi32::<SHIFT>(load(a.add(32))));
        let mut s = [_mm256_setzero_si256(); 8];
        for (j, s) in s.iter_mut().enumerate() {
            *s = load(a.add(grouped::QUANTS_AT + 32 * j));
        }
        D::dot_runs::<RUN>(acc, u, &s)
    }
}

struct Q4_0;

impl Grouped for Q4_0 {
    const BYTES: usize = 18;
    /// Nibbles 0..=15 (the quants + 8), register `2m + h` as in `grouped.rs`.
    type Prep = [__m256i; 8];

    #[inline(always)]
    unsafe fn prep<D: IntDot, const REGROUPED: bool>(w: *const u8, lanes: usize) -> Self::Prep {
        // SAFETY: regrouped, the loads read `w + 2 · lanes ..` up to `lanes · 18`, the regrouped run; plain,
        // `transpose_quads(w, 18, 2)` reads up to `7 · 18 + 2 + 16 = 144`: both inside the bytes the caller
        // guarantees at `w` (`Grouped`'s `# Safety`), which also makes it provide the AVX2 context.
        unsafe {
            let quads = if REGROUPED {
                array::from_fn(|m| regrouped_register(w, 2 * lanes, lanes, m))
            } else {
                transpose_quads(w, Self::BYTES, 2)
            };
            let m4 = _mm256_set1_epi8(0x0F);
            array::from_fn(|j| {
                let q = quads[j / 2];
                if j % 2 == 0 {
                    _mm256_and_si256(q, m4)
                } else {
                    _mm256_and_si256(_mm256_srli_epi16::<4>(q), m4)
                }
            })
        }
    }

    #[inline(always)]
    unsafe fn scales(w: *const u8) -> __m256 {
        // SAFETY: `f16x8` reads the 2-byte scale at `w + 18k`, `k < 8`, inside the eight blocks the caller
        // guarantees at `w`, and needs the AVX2 context (F16C), which the caller provides (`Grouped`'s `# Safety`).
        unsafe { f16x8(w, Self::BYTES) }
    }

    #[inline(always)]
    unsafe fn sums<D: IntDot>(p: &Self::Prep, a: *const u8) -> __m256i {
        // SAFETY: `offset_dot` needs a whole activation group at `a`, the AVX2 context and `D`'s features, all of
        // which the caller guarantees (`Grouped`'s `# Safety`).
        unsafe {
            // The nibbles are the quants + 8: eight registers' pairs add up to at most 8 · 2 · 15 · 128.
            offset_dot::<D, 3, 8>(p, a)
        }
    }
}

struct Q8_0;

impl Grouped for Q8_0 {
    const BYTES: usize = q8_0::BLOCK_BYTES;
    /// With VNNI: the quants + 128 as unsigned bytes. Without: the quants as they are; each row takes
    /// their absolute values again (one cheap instruction per register), because keeping both the
    /// quants and their absolute values would fill all 16 AVX2 registers with weights and spill the
    /// rows' accumulators.
    type Prep = [__m256i; 8];

    #[inline(always)]
    unsafe fn prep<D: IntDot, const REGROUPED: bool>(w: *const u8, lanes: usize) -> Self::Prep {
        // SAFETY: regrouped, the loads read `w + 2 · lanes ..` up to `lanes · 34`, the regrouped run; plain,
        // `transpose_quads` at offsets 2 and 18 reads up to `7 · 34 + 18 + 16 = 272`: both inside the `8 · BYTES`
        // bytes the caller guarantees at `w` (`Grouped`'s `# Safety`), which also makes it provide the AVX2
        // context.
        unsafe {
            let mut q: [__m256i; 8] = if REGROUPED {
                array::from_fn(|j| regrouped_register(w, 2 * lanes, lanes, j))
            } else {
                let halves = [transpose_quads(w, Self::BYTES, 2), transpose_quads(w, Self::BYTES, 18)];
                array::from_fn(|j| halves[j % 2][j / 2])
            };
            // A loop, not `array::map`: its closure is not always inlined, and an intrinsic left in a
            // separate function is a call per register.
            if D::WIDE_PRODUCTS {
                for v in &mut q {
                    *v = _mm256_xor_si256(*v, _mm256_set1_epi8(-128));
                }
            }
            q
        }
    }

    #[inline(always)]
    unsafe fn scales(w: *const u8) -> __m256 {
        // SAFETY: `f16x8` reads the 2-byte scale at `w + 34k`, `k < 8`, inside the eight blocks the caller
        // guarantees at `w`, and needs the AVX2 context (F16C), which the caller provides (`Grouped`'s `# Safety`).
        unsafe { f16x8(w, Self::BYTES) }
    }

    #[inline(always)]
    unsafe fn sums<D: IntDot>(w: &Self::Prep, a: *const u8) -> __m256i {
        // SAFETY: the loads read `a + QUANTS_AT + 32j`, `j < 8`, and `offset_dot` the same group: inside the whole
        // activation group the caller guarantees at `a` (`Grouped`'s `# Safety`), which also makes it provide the
        // AVX2 context and `D`'s features.
        unsafe {
            let act = |j: usize| load(a.add(grouped::QUANTS_AT + 32 * j));
            if D::WIDE_PRODUCTS {
                // The quants + 128 (VNNI has no pair bound).
                offset_dot::<D, 7, 1>(w, a)
            } else {
                // |w| · (a · sign w) = w · a; |w| <= 128 and |a| <= 127 keep pairs <= 32512 (`sign_epi8`
                // would wrap an activation of -128, which no quantiser produces).
                let mut acc = _mm256_setzero_si256();
                for (j, &wj) in w.iter().enumerate() {
                    acc = D::dot(acc, _mm256_abs_epi8(wj), _mm256_sign_epi8(act(j), wj));
                }
                acc
            }
        }
    }
}

struct Q5_0;

impl Grouped for Q5_0 {
    const BYTES: usize = 22;
    /// The quants + 16 (0..=31, unsigned), register `2m + h` as for Q4_0.
    type Prep = [__m256i; 8];

    #[inline(always)]
    unsafe fn prep<D: IntDot, const REGROUPED: bool>(w: *const u8, _lanes: usize) -> Self::Prep {
        // SAFETY: `transpose_quads(w, 22, 6)` reads up to `7 · 22 + 6 + 16 = 176`, and `qh_of(k)` the 4 bytes at
        // `w + 22k + 2`, `k < 8`: inside the `8 · BYTES` bytes the caller guarantees at `w` (`Grouped`'s
        // `# Safety`), which also makes it provide the AVX2 context.
        unsafe {
            // Always plain blocks: Q5_0 rows are never regrouped (`grouped::weights_regroupable`).
            let quads = transpose_quads(w, Self::BYTES, 6);
            let qh_of = |k: usize| (w.add(k * Self::BYTES + 2) as *const i32).read_unaligned();
            let qh = _mm256_setr_epi32(
                qh_of(0),
                qh_of(1),
                qh_of(2),
                qh_of(3),
                qh_of(4),
                qh_of(5),
                qh_of(6),
                qh_of(7),
            );
            // Offsets of each 32-bit lane's first byte within its 128-bit half, for `shuffle_epi8`.
            let lane_bytes = _mm256_broadcastsi128_si256(_mm_setr_epi32(0, 0x0404_0404, 0x0808_0808, 0x0C0C_0C0C));
            let m4 = _mm256_set1_epi8(0x0F);
            // A loop, not `array::from_fn`: a closure this size is not inlined, and its intrinsics would
            // then be calls (measured: decode as slow as scalar).
            let mut u = [_mm256_setzero_si256(); 8];
            for (j, u) in u.iter_mut().enumerate() {
                let (m, h) = (j / 2, j % 2);
                let q = quads[m];
                let nibbles = if h == 0 {
                    _mm256_and_si256(q, m4)
                } else {
                    _mm256_and_si256(_mm256_srli_epi16::<4>(q), m4)
                };
                // Register j holds elements 16h + 4m + t (t = 0..4) of each block, whose fifth bits are
                // bits 4(m % 2) + t of qh's byte 2h + m / 2: that byte goes to all four bytes of the
                // lane, and byte t keeps its bit.
                let spread =
                    _mm256_shuffle_epi8(qh, _mm256_add_epi8(lane_bytes, _mm256_set1_epi8((2 * h + m / 2) as i8)));
                let bit = _mm256_set1_epi32(0x0804_0201 << (4 * (m % 2)));
                let set = _mm256_cmpeq_epi8(_mm256_and_si256(spread, bit), bit);
                *u = _mm256_or_si256(nibbles, _mm256_and_si256(set, _mm256_set1_epi8(0x10)));
            }
            u
        }
    }

    #[inline(always)]
    unsafe fn scales(w: *const u8) -> __m256 {
        // SAFETY: `f16x8` reads the 2-byte scale at `w + 22k`, `k < 8`, inside the eight blocks the caller
        // guarantees at `w`, and needs the AVX2 context (F16C), which the caller provides (`Grouped`'s `# Safety`).
        unsafe { f16x8(w, Self::BYTES) }
    }

    #[inline(always)]
    unsafe fn sums<D: IntDot>(p: &Self::Prep, a: *const u8) -> __m256i {
        // SAFETY: `offset_dot` needs a whole activation group at `a`, the AVX2 context and `D`'s features, all of
        // which the caller guarantees (`Grouped`'s `# Safety`).
        unsafe {
            // The quants + 16 <= 31: four registers' pairs add up to at most 4 · 2 · 31 · 128.
            offset_dot::<D, 4, 4>(p, a)
        }
    }
}

/// `mxfp4::KVALUES` + 16, the unsigned bytes `maddubs` and `vpdpbusd` need, by nibble.
const MXFP4_UNSIGNED: [u8; 16] = {
    let mut t = [0u8; 16];
    let mut n = 0;
    while n < 16 {
        t[n] = (mxfp4::KVALUES[n] + 16) as u8;
        n += 1;
    }
    t
};

struct Mxfp4;

impl Grouped for Mxfp4 {
    const BYTES: usize = mxfp4::BLOCK_BYTES;
    /// The doubled E2M1 values + 16 (4..=28, unsigned), register `2m + h` as for Q4_0.
    type Prep = [__m256i; 8];

    #[inline(always)]
    unsafe fn prep<D: IntDot, const REGROUPED: bool>(w: *const u8, lanes: usize) -> Self::Prep {
        // SAFETY: regrouped, the loads read `w + lanes ..` up to `lanes · 17`, the regrouped run; plain,
        // `transpose_quads(w, 17, 1)` reads up to `7 · 17 + 1 + 16 = 136`: both inside the `8 · BYTES` bytes the
        // caller guarantees at `w` (`Grouped`'s `# Safety`); the table load reads the 16 bytes of `MXFP4_UNSIGNED`;
        // the AVX2 context is the caller's.
        unsafe {
            let quads = if REGROUPED {
                array::from_fn(|m| regrouped_register(w, lanes, lanes, m))
            } else {
                transpose_quads(w, Self::BYTES, 1)
            };
            let table = _mm256_broadcastsi128_si256(_mm_loadu_si128(MXFP4_UNSIGNED.as_ptr() as *const __m128i));
            let m4 = _mm256_set1_epi8(0x0F);
            array::from_fn(|j| {
                let q = quads[j / 2];
                let nibbles = if j % 2 == 0 {
                    _mm256_and_si256(q, m4)
                } else {
                    _mm256_and_si256(_mm256_srli_epi16::<4>(q), m4)
                };
                _mm256_shuffle_epi8(table, nibbles)
            })
        }
    }

    #[inline(always)]
    unsafe fn scales(w: *const u8) -> __m256 {
        // SAFETY: each `*w.add(17k)`, `k < 8`, reads a block's exponent byte, inside the eight blocks the caller
        // guarantees at `w` (`Grouped`'s `# Safety`), which also makes it provide the AVX2 context.
        unsafe {
            // The exponent bytes, 17 apart, packed by scalar loads as in `f16x8`.
            e8m0_scales(bytes_u64(w, Self::BYTES, 8))
        }
    }

    #[inline(always)]
    unsafe fn regrouped_scales(w: *const u8, lanes: usize) -> __m256 {
        // SAFETY: the first `lanes` bytes of the regrouped run at `w` (its exponents), readable by the caller's
        // guarantee, in the AVX2 context it provides (`Grouped`'s `# Safety`).
        unsafe {
            if lanes == grouped::GROUP_BLOCKS {
                e8m0_scales((w as *const u64).read_unaligned())
            } else {
                e8m0_scales(bytes_u64(w, 1, lanes))
            }
        }
    }

    #[inline(always)]
    unsafe fn sums<D: IntDot>(p: &Self::Prep, a: *const u8) -> __m256i {
        // SAFETY: `offset_dot` needs a whole activation group at `a`, the AVX2 context and `D`'s features, all of
        // which the caller guarantees (`Grouped`'s `# Safety`).
        unsafe {
            // Values <= 28: four registers' pairs add up to at most 4 · 2 · 28 · 128.
            offset_dot::<D, 4, 4>(p, a)
        }
    }
}

/// Lane `k`: `mxfp4::scale` of exponent byte `k` of `e`: `(e - 1) << 23`, or `0x0020_0000 << e` for the
/// subnormals e < 2.
///
/// # Safety
///
/// The AVX2 context.
#[inline(always)]
unsafe fn e8m0_scales(e: u64) -> __m256 {
    // SAFETY: register operations only (AVX2), in the context the caller provides (`# Safety`).
    unsafe {
        let e = _mm256_cvtepu8_epi32(_mm_cvtsi64_si128(e as i64));
        let normal = _mm256_slli_epi32::<23>(_mm256_sub_epi32(e, _mm256_set1_epi32(1)));
        let subnormal = _mm256_sllv_epi32(_mm256_set1_epi32(0x0020_0000), e);
        let small = _mm256_cmpgt_epi32(_mm256_set1_epi32(2), e);
        _mm256_castsi256_ps(_mm256_blendv_epi8(normal, subnormal, small))
    }
}

/// Runs `$body` with `$r` bound to each of `0..$rows` (a const generic, at most 8), unrolled whatever
/// the compiler's heuristics decide: a loop over the activation rows left rolled keeps each row's
/// accumulator in memory, stored and reloaded per group. LLVM left the 8-row loop rolled (7 rows and
/// fewer it unrolled), so on the AVX2 EPYC an 8-row Q4_0 call did 0.75–0.99× the work per CPU second
/// of a 7-row one; unrolled, 1.00–1.09× (`prefill_cpu --per-row`, three runs each). (A macro, not a
/// closure: a closure does not inherit the `target_feature`s of the function it is in, and its
/// intrinsics would not be inlined.)
macro_rules! unrolled_rows {
    ($rows:ident, $r:ident, $body:block) => {
        unrolled_rows!(@ $rows, $r, $body, 0 1 2 3 4 5 6 7)
    };
    (@ $rows:ident, $r:ident, $body:block, $($n:literal)+) => {
        const { assert!($rows <= 8) };
        $(if $n < $rows {
            let $r = $n;
            $body
        })+
    };
}

/// One group: block `k`'s term `(d_w · d_a) · f32(sumi)` is added to lane `k` of each row's
/// accumulator (groups start at multiples of 8 blocks, so lane `k` is lane `block % 8`).
///
/// # Safety
///
/// `w` must point at eight readable weight blocks (`8 · K::BYTES` bytes; when `REGROUPED`, a regrouped run of
/// `lanes` blocks, `lanes · K::BYTES` bytes), and
/// each `a[r]` at a whole readable activation group ([`grouped::GROUP_BYTES`]), in the AVX2 context with `D`'s
/// features.
#[inline(always)]
unsafe fn grouped_step<D: IntDot, K: Grouped, const R: usize, const REGROUPED: bool>(
    w: *const u8,
    a: [*const u8; R],
    acc: &mut [__m256; R],
    lanes: usize,
) {
    // SAFETY: `K::prep` and `K::scales` read the eight blocks at `w` (the regrouped scale load its first 16 bytes),
    // `K::sums` and the scale load `a[r] .. a[r] + 32` the activation group at `a[r]`: all within what the caller
    // guarantees, as are the AVX2 context and `D`'s features.
    unsafe {
        let p = K::prep::<D, REGROUPED>(w, lanes);
        let d_w = if REGROUPED {
            K::regrouped_scales(w, lanes)
        } else {
            K::scales(w)
        };
        unrolled_rows!(R, r, {
            let sumi = K::sums::<D>(&p, a[r]);
            let d = _mm256_mul_ps(d_w, _mm256_loadu_ps(a[r] as *const f32));
            acc[r] = _mm256_add_ps(acc[r], _mm256_mul_ps(d, _mm256_cvtepi32_ps(sumi)));
        });
    }
}

/// Eight blocks at a time, in lanes; a row's last blocks padded to a group.
///
/// # Safety
///
/// The AVX2 context, with `D`'s features. Memory is read only through the slices, whose lengths it checks: `w`'s
/// whole blocks, and activation rows asserted to hold as many.
#[inline(always)]
unsafe fn grouped_rows<D: IntDot, K: Grouped, const R: usize, const REGROUPED: bool>(
    w: &[u8],
    acts: [&[u8]; R],
    out: &mut [f32],
) {
    const GB: usize = grouped::GROUP_BYTES;

    // SAFETY: the caller provides the AVX2 context and `D`'s features. Every pointer comes from a slice: group
    // `g < full = nb / 8` spans `w[8g · BYTES .. 8(g + 1) · BYTES]`, inside `w` as `nb = w.len() / BYTES`, and the
    // tail's group is `w_pad`, 272 bytes, at least `8 · BYTES` for every format; each activation row holds
    // `row_bytes(nb)`, `ceil(nb / 8)` whole groups (asserted above), so the group at `g · GB` is inside it for
    // `g < full`, and for `g = full` when there is a tail. `prefetch_ahead` takes any address.
    unsafe {
        let nb = w.len() / K::BYTES;
        for a in acts {
            assert!(
                a.len() >= grouped::row_bytes(nb),
                "activation row shorter than weight row"
            );
        }
        let mut acc = [_mm256_setzero_ps(); R];
        let full = nb / 8;
        for g in 0..full {
            let wg = w.as_ptr().add(g * 8 * K::BYTES);
            prefetch_ahead(wg, 8 * K::BYTES);
            let a = array::from_fn(|r| acts[r].as_ptr().add(g * GB));
            grouped_step::<D, K, R, REGROUPED>(wg, a, &mut acc, grouped::GROUP_BLOCKS);
        }
        let tail = nb % 8;
        if tail > 0 {
            // The blocks after the last whole group: in a regrouped row a run of `tail` lanes, loaded masked;
            // in a plain row padded to a whole group with zero blocks, as the activations already are. Either
            // way the lanes past the tail see zero weights against zero activation blocks (scale 0), so their
            // terms are ±0.0, and adding ±0.0 leaves a lane unchanged (lanes start at +0.0 and so are never
            // -0.0; a zero weight block's scale is finite: 0, or MXFP4's 2^-128).
            let w0 = full * 8 * K::BYTES;
            let a = array::from_fn(|r| acts[r].as_ptr().add(full * GB));
            if REGROUPED {
                grouped_step::<D, K, R, true>(w.as_ptr().add(w0), a, &mut acc, tail);
            } else {
                let mut w_pad = [0u8; 8 * q8_0::BLOCK_BYTES];
                w_pad[..tail * K::BYTES].copy_from_slice(&w[w0..w0 + tail * K::BYTES]);
                grouped_step::<D, K, R, false>(w_pad.as_ptr(), a, &mut acc, grouped::GROUP_BLOCKS);
            }
        }
        for (o, acc) in out.iter_mut().zip(acc) {
            *o = lanes_sum(acc);
        }
    }
}

/// Q4_0 weights times grouped Q8_0 activations.
///
/// # Safety
///
/// As for [`grouped_rows`]: the AVX2 context, with `D`'s features.
#[inline(always)]
unsafe fn q4_0_rows<D: IntDot, const R: usize>(w: &[u8], acts: [&[u8]; R], out: &mut [f32]) {
    // SAFETY: the caller provides what `grouped_rows` needs (`# Safety`).
    unsafe { grouped_rows::<D, Q4_0, R, false>(w, acts, out) }
}

/// Q8_0 weights times grouped Q8_0 activations.
///
/// # Safety
///
/// As for [`grouped_rows`]: the AVX2 context, with `D`'s features.
#[inline(always)]
unsafe fn q8_0_rows<D: IntDot, const R: usize>(w: &[u8], acts: [&[u8]; R], out: &mut [f32]) {
    // SAFETY: the caller provides what `grouped_rows` needs (`# Safety`).
    unsafe { grouped_rows::<D, Q8_0, R, false>(w, acts, out) }
}

/// Q5_0 weights times grouped Q8_0 activations.
///
/// # Safety
///
/// As for [`grouped_rows`]: the AVX2 context, with `D`'s features.
#[inline(always)]
unsafe fn q5_0_rows<D: IntDot, const R: usize>(w: &[u8], acts: [&[u8]; R], out: &mut [f32]) {
    // SAFETY: the caller provides what `grouped_rows` needs (`# Safety`).
    unsafe { grouped_rows::<D, Q5_0, R, false>(w, acts, out) }
}

/// MXFP4 weights times grouped Q8_0 activations.
///
/// # Safety
///
/// As for [`grouped_rows`]: the AVX2 context, with `D`'s features.
#[inline(always)]
unsafe fn mxfp4_rows<D: IntDot, const R: usize>(w: &[u8], acts: [&[u8]; R], out: &mut [f32]) {
    // SAFETY: the caller provides what `grouped_rows` needs (`# Safety`).
    unsafe { grouped_rows::<D, Mxfp4, R, false>(w, acts, out) }
}

/// Regrouped Q4_0 weights times grouped Q8_0 activations.
///
/// # Safety
///
/// As for [`grouped_rows`]: the AVX2 context, with `D`'s features.
#[inline(always)]
unsafe fn q4_0g_rows<D: IntDot, const R: usize>(w: &[u8], acts: [&[u8]; R], out: &mut [f32]) {
    // SAFETY: the caller provides what `grouped_rows` needs (`# Safety`).
    unsafe { grouped_rows::<D, Q4_0, R, true>(w, acts, out) }
}

/// Regrouped Q8_0 weights times grouped Q8_0 activations.
///
/// # Safety
///
/// As for [`grouped_rows`]: the AVX2 context, with `D`'s features.
#[inline(always)]
unsafe fn q8_0g_rows<D: IntDot, const R: usize>(w: &[u8], acts: [&[u8]; R], out: &mut [f32]) {
    // SAFETY: the caller provides what `grouped_rows` needs (`# Safety`).
    unsafe { grouped_rows::<D, Q8_0, R, true>(w, acts, out) }
}

/// Regrouped MXFP4 weights times grouped Q8_0 activations.
///
/// # Safety
///
/// As for [`grouped_rows`]: the AVX2 context, with `D`'s features.
#[inline(always)]
unsafe fn mxfp4g_rows<D: IntDot, const R: usize>(w: &[u8], acts: [&[u8]; R], out: &mut [f32]) {
    // SAFETY: the caller provides what `grouped_rows` needs (`# Safety`).
    unsafe { grouped_rows::<D, Mxfp4, R, true>(w, acts, out) }
}

// ---------------------------------------------------------------------------------------------
// Q4_1 and Q5_1 weights times Q8_1 activations, in their plain layouts: eight blocks at a time. Each block's
// exact integer sum is formed in its own register, the eight registers are reduced into one (block
// `k` in lane `k`), and the eight f32 terms are computed side by side and added to lane `block % 8`.

/// A 32-element weight format with an f16 scale `d` and offset `m` first, times Q8_1 (Q4_1, Q5_1).
///
/// # Safety
///
/// `quants` reads the block at `w` (`BYTES` bytes), which must be readable, in the AVX2 context.
trait Offset32 {
    const BYTES: usize;
    /// The block at `w`'s quants (unsigned, below 32) in element order.
    unsafe fn quants(w: *const u8) -> __m256i;
}

/// Sixteen bytes of nibbles as 32 bytes in element order: low nibbles, then high ones.
///
/// # Safety
///
/// The 16 bytes at `qs` must be readable, in the AVX2 context.
#[inline(always)]
unsafe fn nibbles(qs: *const u8) -> __m256i {
    // SAFETY: `vmovdqu` reads the 16 bytes at `qs`, which the caller guarantees readable; the rest is register work
    // in the AVX2 context the caller provides (`# Safety`).
    unsafe {
        let q = _mm_loadu_si128(qs as *const __m128i);
        let m4 = _mm_set1_epi8(0x0F);
        _mm256_setr_m128i(_mm_and_si128(q, m4), _mm_and_si128(_mm_srli_epi16::<4>(q), m4))
    }
}

/// Bit `i` of the u32 at `p` as 0x10 in byte `i`: the fifth bits of 32 Q5_1 elements.
///
/// # Safety
///
/// The 4 bytes at `p` must be readable, in the AVX2 context.
#[inline(always)]
unsafe fn fifth_bits(p: *const u8) -> __m256i {
    // SAFETY: `read_unaligned` reads the 4 bytes at `p`, which the caller guarantees readable; the rest is register
    // work in the AVX2 context the caller provides (`# Safety`).
    unsafe {
        let qh = _mm256_set1_epi32((p as *const i32).read_unaligned());
        // Byte i takes byte i / 8 of `qh` (every 32-bit lane holds all four), then tests bit i % 8.
        let spread = _mm256_shuffle_epi8(
            qh,
            _mm256_set_epi64x(0x0303_0303_0303_0303, 0x0202_0202_0202_0202, 0x0101_0101_0101_0101, 0),
        );
        let bit = _mm256_set1_epi64x(0x8040_2010_0804_0201u64 as i64);
        let set = _mm256_cmpeq_epi8(_mm256_and_si256(spread, bit), bit);
        _mm256_and_si256(set, _mm256_set1_epi8(0x10))
    }
}

struct Q4_1;

impl Offset32 for Q4_1 {
    const BYTES: usize = 20;

    #[inline(always)]
    unsafe fn quants(w: *const u8) -> __m256i {
        // SAFETY: `nibbles` reads bytes `4 .. 20` of the 20-byte block the caller guarantees at `w` (`Offset32`'s
        // `# Safety`), which also makes it provide the AVX2 context.
        unsafe { nibbles(w.add(4)) }
    }
}

struct Q5_1;

impl Offset32 for Q5_1 {
    const BYTES: usize = 24;

    #[inline(always)]
    unsafe fn quants(w: *const u8) -> __m256i {
        // SAFETY: `fifth_bits` reads bytes `4 .. 8` and `nibbles` bytes `8 .. 24` of the 24-byte block the caller
        // guarantees at `w` (`Offset32`'s `# Safety`), which also makes it provide the AVX2 context.
        unsafe { _mm256_or_si256(nibbles(w.add(8)), fifth_bits(w.add(4))) }
    }
}

/// Lane `k`: the sum of the eight i32 lanes of `s[k]` (exact). Pairwise adds within 128-bit halves
/// transpose as they reduce; the halves' partial sums are then added.
///
/// # Safety
///
/// The AVX2 context.
#[inline(always)]
unsafe fn sums8(s: [__m256i; 8]) -> __m256i {
    // SAFETY: register operations only (AVX2), in the AVX2 context the caller provides (`# Safety`).
    unsafe {
        let h01 = _mm256_hadd_epi32(s[0], s[1]);
        let h23 = _mm256_hadd_epi32(s[2], s[3]);
        let h45 = _mm256_hadd_epi32(s[4], s[5]);
        let h67 = _mm256_hadd_epi32(s[6], s[7]);
        // Lane k of the low half: block k's (or k + 4's) lanes 0..4; of the high half: its lanes 4..8.
        let h0123 = _mm256_hadd_epi32(h01, h23);
        let h4567 = _mm256_hadd_epi32(h45, h67);
        _mm256_add_epi32(
            _mm256_permute2x128_si256::<0x20>(h0123, h4567),
            _mm256_permute2x128_si256::<0x31>(h0123, h4567),
        )
    }
}

/// Eight blocks: block `k`'s term `(d_w · d_a) · f32(sumi) + m_w · s_a` is added to lane `k` of each
/// row's accumulator (the eight start at a multiple of 8 blocks, so lane `k` is lane `block % 8`).
///
/// # Safety
///
/// `w` must point at eight readable weight blocks (`8 · K::BYTES` bytes) and each `a[r]` at eight readable Q8_1
/// blocks (`8 · 36` bytes), in the AVX2 context with `D`'s features.
#[inline(always)]
unsafe fn offset32_step<D: IntDot, K: Offset32, const R: usize>(
    w: *const u8,
    a: [*const u8; R],
    acc: &mut [__m256; R],
) {
    const AB: usize = q8_1::BLOCK_BYTES;

    // SAFETY: `K::quants(w + k · BYTES)` reads block `k < 8`, and `f16x8(w, BYTES)` and `f16x8(w + 2, BYTES)` their
    // `d` and `m` (bytes 0..4): inside the eight weight blocks at `w`. `load(a + 36k + 4)` reads the 32 quants of
    // activation block `k < 8`, and `f16x8(a, 36)` and `f16x8(a + 2, 36)` their `d` and `s`: inside the eight Q8_1
    // blocks at `a[r]`. The caller guarantees both, and the AVX2 context with `D`'s features.
    unsafe {
        let q: [__m256i; 8] = array::from_fn(|k| K::quants(w.add(k * K::BYTES)));
        let (d_w, m_w) = (f16x8(w, K::BYTES), f16x8(w.add(2), K::BYTES));
        for (acc, a) in acc.iter_mut().zip(a) {
            let mut s = [_mm256_setzero_si256(); 8];
            for k in 0..8 {
                // Quants below 32, |a| <= 128: pairs <= 8192 suit `maddubs`.
                s[k] = D::dot(s[k], q[k], load(a.add(k * AB + 4)));
            }
            let d = _mm256_mul_ps(d_w, f16x8(a, AB));
            let scaled = _mm256_mul_ps(d, _mm256_cvtepi32_ps(sums8(s)));
            let term = _mm256_add_ps(scaled, _mm256_mul_ps(m_w, f16x8(a.add(2), AB)));
            *acc = _mm256_add_ps(*acc, term);
        }
    }
}

/// Eight blocks at a time; a row's last blocks padded to eight.
///
/// # Safety
///
/// The AVX2 context, with `D`'s features. Memory is read only through the slices, whose lengths it checks: `w`'s
/// whole blocks, and activation rows asserted to hold as many.
#[inline(always)]
unsafe fn offset32_rows<D: IntDot, K: Offset32, const R: usize>(w: &[u8], acts: [&[u8]; R], out: &mut [f32]) {
    const AB: usize = q8_1::BLOCK_BYTES;

    // SAFETY: the caller provides the AVX2 context and `D`'s features. Group `g < full = nb / 8` spans `8 · BYTES`
    // bytes of `w` from `8g · BYTES` (`nb = w.len() / BYTES`) and `8 · AB` bytes of each activation row from
    // `8g · AB`, inside it as its length `>= nb · AB` is asserted above; the tail's eight blocks are the padded
    // copies `w_pad` (`8 · 24` bytes, room for Q5_1) and `a_pad` (`8 · AB` bytes each). `prefetch_ahead` takes any
    // address.
    unsafe {
        let nb = w.len() / K::BYTES;
        for a in acts {
            assert!(a.len() >= nb * AB, "activation row shorter than weight row");
        }
        let mut acc = [_mm256_setzero_ps(); R];
        let full = nb / 8;
        for g in 0..full {
            let wg = w.as_ptr().add(g * 8 * K::BYTES);
            prefetch_ahead(wg, 8 * K::BYTES);
            let a = array::from_fn(|r| acts[r].as_ptr().add(g * 8 * AB));
            offset32_step::<D, K, R>(wg, a, &mut acc);
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
            offset32_step::<D, K, R>(w_pad.as_ptr(), a, &mut acc);
        }
        for (o, acc) in out.iter_mut().zip(acc) {
            *o = lanes_sum(acc);
        }
    }
}

/// Q4_1 weights times Q8_1 activations.
///
/// # Safety
///
/// As for [`offset32_rows`]: the AVX2 context, with `D`'s features.
#[inline(always)]
unsafe fn q4_1_rows<D: IntDot, const R: usize>(w: &[u8], acts: [&[u8]; R], out: &mut [f32]) {
    // SAFETY: the caller provides what `offset32_rows` needs (`# Safety`).
    unsafe { offset32_rows::<D, Q4_1, R>(w, acts, out) }
}

/// Q5_1 weights times Q8_1 activations.
///
/// # Safety
///
/// As for [`offset32_rows`]: the AVX2 context, with `D`'s features.
#[inline(always)]
unsafe fn q5_1_rows<D: IntDot, const R: usize>(w: &[u8], acts: [&[u8]; R], out: &mut [f32]) {
    // SAFETY: the caller provides what `offset32_rows` needs (`# Safety`).
    unsafe { offset32_rows::<D, Q5_1, R>(w, acts, out) }
}

// ---------------------------------------------------------------------------------------------
// K-quants times Q8_K: per block, exact integers reduced to scalars, then the scalar float formula.

const Q8K_QS: usize = 4;
const Q8K_BSUMS: usize = 4 + 256;

/// `Σ_s min_s · (bsums_2s + bsums_2s+1)` for Q4_K/Q5_K: `mins` holds min_s in i16 lane s.
///
/// # Safety
///
/// `ab` must point at a whole readable Q8_K block (its `bsums` are read), in the AVX2 context.
#[inline(always)]
unsafe fn mins_dot(ab: *const u8, mins: __m128i) -> i32 {
    // SAFETY: `load` reads the 32 bytes of `bsums`, `ab + 260 .. ab + 292`, the end of the Q8_K block the caller
    // guarantees at `ab`; the rest is register work in the AVX2 context the caller provides (`# Safety`).
    unsafe {
        let bsums = load(ab.add(Q8K_BSUMS));
        // |bsum| <= 16 · 128, so pair sums fit in i16.
        let pairs = _mm_hadd_epi16(_mm256_castsi256_si128(bsums), _mm256_extracti128_si256::<1>(bsums));
        let s = _mm_madd_epi16(pairs, mins);
        let s = _mm_add_epi32(s, _mm_shuffle_epi32::<0b01_00_11_10>(s));
        let s = _mm_add_epi32(s, _mm_shuffle_epi32::<0b10_11_00_01>(s));
        _mm_cvtsi128_si32(s)
    }
}

/// In every i16 lane of the low half, i16 lane `lo` of a 128-bit source; of the high half, lane
/// `hi`: a `shuffle_epi8` control that broadcasts sub-block scales without leaving the registers.
///
/// # Safety
///
/// The AVX2 context.
#[inline(always)]
unsafe fn lane_pick(lo: usize, hi: usize) -> __m256i {
    // SAFETY: register operations only (AVX's `vinsertf128`, SSE2's `set1`), in the AVX2 context the caller
    // provides (`# Safety`).
    unsafe {
        let pick = |l: usize| (((2 * l + 1) << 8) | (2 * l)) as i16;
        _mm256_setr_m128i(_mm_set1_epi16(pick(lo)), _mm_set1_epi16(pick(hi)))
    }
}

/// Q4_K/Q5_K's 12 packed bytes as (8 scales, 8 mins) in i16 lanes, unpacked 32 bits at a time as
/// ggml's x86 kernels do; equal to [`crate::formats::q4_k::scale_min`] for each sub-block.
///
/// # Safety
///
/// The AVX2 context.
#[inline(always)]
unsafe fn scales_mins(packed: &[u8]) -> (__m128i, __m128i) {
    // SAFETY: `packed` is read by bounds-checked indexing; the intrinsics are SSE2 and SSE4.1 (`pmovzxbw`), part of
    // the AVX2 context the caller provides (`# Safety`).
    unsafe {
        let u = |i: usize| u32::from_le_bytes([packed[4 * i], packed[4 * i + 1], packed[4 * i + 2], packed[4 * i + 3]]);
        let (u0, u1, u2) = (u(0), u(1), u(2));
        let (low6, low4, top2) = (0x3F3F_3F3F, 0x0F0F_0F0F, 0x0303_0303);
        let bytes = _mm_setr_epi32(
            (u0 & low6) as i32,                                      // scales 0..4
            ((u2 & low4) | (((u0 >> 6) & top2) << 4)) as i32,        // scales 4..8
            (u1 & low6) as i32,                                      // mins 0..4
            (((u2 >> 4) & low4) | (((u1 >> 6) & top2) << 4)) as i32, // mins 4..8
        );
        (
            _mm_cvtepu8_epi16(bytes),
            _mm_cvtepu8_epi16(_mm_unpackhi_epi64(bytes, bytes)),
        )
    }
}

/// Q4_K and Q5_K share scales, mins and the float formula; `quants(j, hi)` yields the 32 quants of
/// sub-block `2j + hi` of the current block.
///
/// # Safety
///
/// The AVX2 context, with `D`'s features. Memory is read only through the slices, whose lengths it checks: `w`'s
/// whole blocks, and activation rows asserted to hold as many.
#[inline(always)]
unsafe fn q45_k_rows<D: IntDot, const R: usize, const BYTES: usize, const Q5: bool>(
    w: &[u8],
    acts: [&[u8]; R],
    out: &mut [f32],
) {
    const AB: usize = q8_k::BLOCK_BYTES;

    // SAFETY: the caller provides the AVX2 context and `D`'s features. `wb` is one whole `BYTES`-byte block: Q5_K's
    // `qh` load reads bytes `16 .. 48`, the quant loads end at `48 + 4 · 32 = 176` for Q5_K (`16 + 128 = 144` for
    // Q4_K). `a[r]` is block `b < nb` of an activation row of at least `nb · AB` bytes (asserted above), a whole
    // Q8_K block: its quant loads end at `4 + 64 · 3 + 64 = 260`, `mins_dot` reads its `bsums` (`260 .. 292`),
    // `read_unaligned` its f32 `d` at 0. `prefetch_ahead` takes any address.
    unsafe {
        let nb = w.len() / BYTES;
        for a in acts {
            assert!(a.len() >= nb * AB, "activation row shorter than weight row");
        }
        let m4 = _mm256_set1_epi8(0x0F);
        let one = _mm256_set1_epi8(1);
        let mut lanes = [Lanes8::default(); R];
        for (b, wb) in w.chunks_exact(BYTES).enumerate() {
            prefetch_ahead(wb.as_ptr(), BYTES);
            let (scales, mins) = scales_mins(&wb[4..16]);
            let scales = _mm256_broadcastsi128_si256(scales);
            let a: [*const u8; R] = array::from_fn(|r| acts[r].as_ptr().add(b * AB));
            let mut acc = [_mm256_setzero_si256(); R];
            // Q5_K's fifth bits: bit s of qh[l] for sub-block s; shifted down 2 per pair of sub-blocks.
            let mut qh = if Q5 {
                load(wb.as_ptr().add(16))
            } else {
                _mm256_setzero_si256()
            };
            let qs = wb.as_ptr().add(if Q5 { 48 } else { 16 });
            for j in 0..4 {
                let q = load(qs.add(32 * j));
                let mut lo = _mm256_and_si256(q, m4);
                let mut hi = _mm256_and_si256(_mm256_srli_epi16::<4>(q), m4);
                if Q5 {
                    // Shifts are per 16-bit lane; masking with 1 keeps each byte's own bit.
                    let b0 = _mm256_and_si256(qh, one);
                    let b1 = _mm256_and_si256(_mm256_srli_epi16::<1>(qh), one);
                    lo = _mm256_or_si256(lo, _mm256_slli_epi16::<4>(b0));
                    hi = _mm256_or_si256(hi, _mm256_slli_epi16::<4>(b1));
                    qh = _mm256_srli_epi16::<2>(qh);
                }
                let s0 = _mm256_shuffle_epi8(scales, lane_pick(2 * j, 2 * j));
                let s1 = _mm256_shuffle_epi8(scales, lane_pick(2 * j + 1, 2 * j + 1));
                for r in 0..R {
                    // Quants <= 31, |a| <= 128: pairs <= 7936; times a 6-bit scale, far inside i32.
                    let aq = a[r].add(Q8K_QS + 64 * j);
                    acc[r] = D::dot_scaled(acc[r], lo, load(aq), s0);
                    acc[r] = D::dot_scaled(acc[r], hi, load(aq.add(32)), s1);
                }
            }
            let (d, dmin) = (f16_at(wb, 0), f16_at(wb, 2));
            for r in 0..R {
                let (sumi, summ) = (hsum_i32(acc[r]), mins_dot(a[r], mins));
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
/// As for [`q45_k_rows`]: the AVX2 context, with `D`'s features.
#[inline(always)]
unsafe fn q4_k_rows<D: IntDot, const R: usize>(w: &[u8], acts: [&[u8]; R], out: &mut [f32]) {
    // SAFETY: the caller provides what `q45_k_rows` needs (`# Safety`).
    unsafe { q45_k_rows::<D, R, 144, false>(w, acts, out) }
}

/// Q5_K weights times Q8_K activations.
///
/// # Safety
///
/// As for [`q45_k_rows`]: the AVX2 context, with `D`'s features.
#[inline(always)]
unsafe fn q5_k_rows<D: IntDot, const R: usize>(w: &[u8], acts: [&[u8]; R], out: &mut [f32]) {
    // SAFETY: the caller provides what `q45_k_rows` needs (`# Safety`).
    unsafe { q45_k_rows::<D, R, 176, true>(w, acts, out) }
}

/// Q6_K weights times Q8_K activations.
///
/// # Safety
///
/// The AVX2 context, with `D`'s features. Memory is read only through the slices, whose lengths it checks: `w`'s
/// whole blocks, and activation rows asserted to hold as many.
#[inline(always)]
unsafe fn q6_k_rows<D: IntDot, const R: usize>(w: &[u8], acts: [&[u8]; R], out: &mut [f32]) {
    const WB: usize = 210;
    const AB: usize = q8_k::BLOCK_BYTES;

    // SAFETY: the caller provides the AVX2 context and `D`'s features. `p` is one whole 210-byte block `wb`: its
    // scales at `192 .. 208`, `ql` at `64n .. 64n + 64` and `qh` at `128 + 32n .. 160 + 32n` for `n < 2`. `a[r]` is
    // block `b < nb` of an activation row of at least `nb · AB` bytes (asserted above), a whole Q8_K block: its
    // `bsums` at `260 .. 292`, its quants at `4 + 128n + 32k .. + 32` (`n < 2`, `k < 4`: ending at 260), its f32
    // `d` at 0. `prefetch_ahead` takes any address.
    unsafe {
        let nb = w.len() / WB;
        for a in acts {
            assert!(a.len() >= nb * AB, "activation row shorter than weight row");
        }
        let m4 = _mm256_set1_epi8(0x0F);
        let m30 = _mm256_set1_epi8(0x30);
        let mut lanes = [Lanes8::default(); R];
        for (b, wb) in w.chunks_exact(WB).enumerate() {
            prefetch_ahead(wb.as_ptr(), WB);
            let p = wb.as_ptr();
            let sc = _mm256_cvtepi8_epi16(_mm_loadu_si128(p.add(192) as *const __m128i));
            // Scales 0..8 and 8..16 in both halves, for `lane_pick`.
            let sc_halves = [
                _mm256_permute2x128_si256::<0x00>(sc, sc),
                _mm256_permute2x128_si256::<0x11>(sc, sc),
            ];
            let a: [*const u8; R] = array::from_fn(|r| acts[r].as_ptr().add(b * AB));
            // Quants are stored +32: Σ_s scale_s · Σ (q + 32) · a needs 32 · Σ_s scale_s · bsums_s taken
            // off, so each row starts there (|32 · scale| <= 4096, |bsum| <= 2048: exact in i32).
            let sc32 = _mm256_slli_epi16::<5>(sc);
            let mut acc: [__m256i; R] = array::from_fn(|r| {
                let offset = _mm256_madd_epi16(load(a[r].add(Q8K_BSUMS)), sc32);
                _mm256_sub_epi32(_mm256_setzero_si256(), offset)
            });
            for (n, &sc_half) in sc_halves.iter().enumerate() {
                let ql0 = load(p.add(64 * n));
                let ql1 = load(p.add(64 * n + 32));
                let qh = load(p.add(128 + 32 * n));
                // Element 128n + 32k + l; shifts are per 16-bit lane, the masks keep each byte's own bits.
                let q = [
                    _mm256_or_si256(
                        _mm256_and_si256(ql0, m4),
                        _mm256_and_si256(_mm256_slli_epi16::<4>(qh), m30),
                    ),
                    _mm256_or_si256(
                        _mm256_and_si256(ql1, m4),
                        _mm256_and_si256(_mm256_slli_epi16::<2>(qh), m30),
                    ),
                    _mm256_or_si256(
                        _mm256_and_si256(_mm256_srli_epi16::<4>(ql0), m4),
                        _mm256_and_si256(qh, m30),
                    ),
                    _mm256_or_si256(
                        _mm256_and_si256(_mm256_srli_epi16::<4>(ql1), m4),
                        _mm256_and_si256(_mm256_srli_epi16::<2>(qh), m30),
                    ),
                ];
                for (k, &qk) in q.iter().enumerate() {
                    // 32 elements = sub-blocks 8n + 2k and the next: pairs 0..8 of `maddubs` are the
                    // first (the low half of `scale`), pairs 8..16 the second.
                    let scale = _mm256_shuffle_epi8(sc_half, lane_pick(2 * k, 2 * k + 1));
                    for r in 0..R {
                        // Quants <= 63, |a| <= 128: pairs <= 16128; times an i8 scale, far inside i32.
                        let aq = load(a[r].add(Q8K_QS + 128 * n + 32 * k));
                        acc[r] = D::dot_scaled(acc[r], qk, aq, scale);
                    }
                }
            }
            let d = f16_at(wb, 208);
            for r in 0..R {
                let d_a = (a[r] as *const f32).read_unaligned();
                lanes[r].add(b, (d * d_a) * hsum_i32(acc[r]) as f32);
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
/// The AVX2 context, with `D`'s features. Memory is read only through the slices, whose lengths it checks: `w`'s
/// whole blocks, and activation rows asserted to hold as many.
#[inline(always)]
unsafe fn q2_k_rows<D: IntDot, const R: usize>(w: &[u8], acts: [&[u8]; R], out: &mut [f32]) {
    const WB: usize = 84;
    const AB: usize = q8_k::BLOCK_BYTES;

    // SAFETY: the caller provides the AVX2 context and `D`'s features. `p` is one whole 84-byte block `wb`: its
    // packed scales at `0 .. 16`, its quants at `16 + 32n .. 48 + 32n` for `n < 2`. `a[r]` is block `b < nb` of an
    // activation row of at least `nb · AB` bytes (asserted above), a whole Q8_K block: its quants at
    // `4 + 128n + 32j .. + 32` (`n < 2`, `j < 4`: ending at 260), its `bsums` at `260 .. 292`, its f32 `d` at 0.
    // `prefetch_ahead` takes any address.
    unsafe {
        let nb = w.len() / WB;
        for a in acts {
            assert!(a.len() >= nb * AB, "activation row shorter than weight row");
        }
        let m3 = _mm256_set1_epi8(3);
        let m4 = _mm_set1_epi8(0x0F);
        let mut lanes = [Lanes8::default(); R];
        for (b, wb) in w.chunks_exact(WB).enumerate() {
            prefetch_ahead(wb.as_ptr(), WB);
            let p = wb.as_ptr();
            // Sub-block s: scale in the low nibble of byte s, min in the high one.
            let packed = _mm_loadu_si128(p as *const __m128i);
            let sc = _mm256_cvtepu8_epi16(_mm_and_si128(packed, m4));
            let mins = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16::<4>(packed), m4));
            // Scales 0..8 and 8..16 in both halves, for `lane_pick`.
            let sc_halves = [
                _mm256_permute2x128_si256::<0x00>(sc, sc),
                _mm256_permute2x128_si256::<0x11>(sc, sc),
            ];
            let a: [*const u8; R] = array::from_fn(|r| acts[r].as_ptr().add(b * AB));
            let mut acc = [_mm256_setzero_si256(); R];
            for (n, &sc_half) in sc_halves.iter().enumerate() {
                let qs = load(p.add(16 + 32 * n));
                // Element 128n + 32j + l is bits 2j.. of qs[32n + l] (shifts are per 16-bit lane; the
                // mask keeps each byte's bits).
                let q = [
                    _mm256_and_si256(qs, m3),
                    _mm256_and_si256(_mm256_srli_epi16::<2>(qs), m3),
                    _mm256_and_si256(_mm256_srli_epi16::<4>(qs), m3),
                    _mm256_and_si256(_mm256_srli_epi16::<6>(qs), m3),
                ];
                for (j, &qj) in q.iter().enumerate() {
                    // Sub-blocks 8n + 2j and the next: pairs 0..8 of `maddubs`, then 8..16.
                    let scale = _mm256_shuffle_epi8(sc_half, lane_pick(2 * j, 2 * j + 1));
                    for r in 0..R {
                        // Quants <= 3, |a| <= 128: pairs <= 768; times a 4-bit scale, far inside i32.
                        let aq = load(a[r].add(Q8K_QS + 128 * n + 32 * j));
                        acc[r] = D::dot_scaled(acc[r], qj, aq, scale);
                    }
                }
            }
            let (d, dmin) = (f16_at(wb, 80), f16_at(wb, 82));
            for r in 0..R {
                // |bsum| <= 2048 and mins <= 15: exact in i32.
                let summ = hsum_i32(_mm256_madd_epi16(load(a[r].add(Q8K_BSUMS)), mins));
                let d_a = (a[r] as *const f32).read_unaligned();
                let sumi = hsum_i32(acc[r]);
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
/// The AVX2 context, with `D`'s features. Memory is read only through the slices, whose lengths it checks: `w`'s
/// whole blocks, and activation rows asserted to hold as many.
#[inline(always)]
unsafe fn q3_k_rows<D: IntDot, const R: usize>(w: &[u8], acts: [&[u8]; R], out: &mut [f32]) {
    const WB: usize = 110;
    const AB: usize = q8_k::BLOCK_BYTES;

    // SAFETY: the caller provides the AVX2 context and `D`'s features. `p` is one whole 110-byte block `wb`:
    // `hmask` at `0 .. 32`, `qs` at `32 + 32n .. 64 + 32n` for `n < 2`; the scales are loaded from the 16-byte
    // array `q3_k::scales` returns. `a[r]` is block `b < nb` of an activation row of at least `nb · AB` bytes
    // (asserted above), a whole Q8_K block: its `bsums` at `260 .. 292`, its quants at `4 + 128n + 32j .. + 32`
    // (`n < 2`, `j < 4`: ending at 260), its f32 `d` at 0. `prefetch_ahead` takes any address.
    unsafe {
        let nb = w.len() / WB;
        for a in acts {
            assert!(a.len() >= nb * AB, "activation row shorter than weight row");
        }
        let (m3, four) = (_mm256_set1_epi8(3), _mm256_set1_epi8(4));
        let mut lanes = [Lanes8::default(); R];
        for (b, wb) in w.chunks_exact(WB).enumerate() {
            prefetch_ahead(wb.as_ptr(), WB);
            let p = wb.as_ptr();
            let sc = q3_k::scales(wb);
            let sc = _mm256_cvtepi8_epi16(_mm_loadu_si128(sc.as_ptr() as *const __m128i));
            // Scales 0..8 and 8..16 in both halves, for `lane_pick`.
            let sc_halves = [
                _mm256_permute2x128_si256::<0x00>(sc, sc),
                _mm256_permute2x128_si256::<0x11>(sc, sc),
            ];
            let a: [*const u8; R] = array::from_fn(|r| acts[r].as_ptr().add(b * AB));
            // The kernel multiplies q + 4 (0..=7, unsigned): Σ_s scale_s · Σ (q + 4) · a needs
            // 4 · Σ_s scale_s · bsums_s taken off, so each row starts there (|4 · scale| <= 128,
            // |bsum| <= 2048: exact in i32).
            let sc4 = _mm256_slli_epi16::<2>(sc);
            let mut acc: [__m256i; R] = array::from_fn(|r| {
                let offset = _mm256_madd_epi16(load(a[r].add(Q8K_BSUMS)), sc4);
                _mm256_sub_epi32(_mm256_setzero_si256(), offset)
            });
            let hmask = load(p);
            for (n, &sc_half) in sc_halves.iter().enumerate() {
                let qs = load(p.add(32 + 32 * n));
                for j in 0..4 {
                    // Element 128n + 32j + l: bits 2j.. of qs[32n + l], plus 4 where bit 4n + j of
                    // hmask[l] is set (shifts are per 16-bit lane; the masks keep each byte's bits).
                    let low = _mm256_and_si256(_mm256_srl_epi16(qs, _mm_cvtsi32_si128(2 * j as i32)), m3);
                    let bit = _mm256_set1_epi8(1 << (4 * n + j));
                    let high = _mm256_cmpeq_epi8(_mm256_and_si256(hmask, bit), bit);
                    let u = _mm256_or_si256(low, _mm256_and_si256(high, four));
                    // Sub-blocks 8n + 2j and the next: pairs 0..8 of `maddubs`, then 8..16.
                    let scale = _mm256_shuffle_epi8(sc_half, lane_pick(2 * j, 2 * j + 1));
                    for r in 0..R {
                        // u <= 7, |a| <= 128: pairs <= 1792; times an i8 scale, far inside i32.
                        let aq = load(a[r].add(Q8K_QS + 128 * n + 32 * j));
                        acc[r] = D::dot_scaled(acc[r], u, aq, scale);
                    }
                }
            }
            let d = f16_at(wb, 108);
            for r in 0..R {
                let d_a = (a[r] as *const f32).read_unaligned();
                lanes[r].add(b, (d * d_a) * hsum_i32(acc[r]) as f32);
            }
        }
        for (o, l) in out.iter_mut().zip(lanes) {
            *o = l.sum();
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Float weights times F32 activations: product i goes to lane i % 8, which is exactly lane i % 8 of
// one `__m256` accumulator per row.

/// A float weight format, widened to f32 exactly.
///
/// # Safety
///
/// `widen8` reads elements `8i .. 8i + 8` of the row at `w` (`8 · BYTES` bytes from `w + 8i · BYTES`),
/// which must be readable, in the AVX2 context.
trait FloatWeights {
    const BYTES: usize;
    /// Elements `8i .. 8i + 8` of the row at `w`.
    unsafe fn widen8(w: *const u8, i: usize) -> __m256;
    /// Element `i`, as the scalar twin widens it.
    fn at(w: &[u8], i: usize) -> f32;
}

struct F32;

impl FloatWeights for F32 {
    const BYTES: usize = 4;

    #[inline(always)]
    unsafe fn widen8(w: *const u8, i: usize) -> __m256 {
        // SAFETY: `vmovups` reads the 32 bytes of elements `8i .. 8i + 8` at `w + 32i`, which the caller guarantees
        // readable (`FloatWeights`'s `# Safety`), as it does the AVX2 context.
        unsafe { _mm256_loadu_ps(w.add(32 * i) as *const f32) }
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
    unsafe fn widen8(w: *const u8, i: usize) -> __m256 {
        // SAFETY: `vmovdqu` reads the 16 bytes of elements `8i .. 8i + 8` at `w + 16i`, which the caller guarantees
        // readable (`FloatWeights`'s `# Safety`), as it does the AVX2 context (F16C's `vcvtph2ps`).
        unsafe { _mm256_cvtph_ps(_mm_loadu_si128(w.add(16 * i) as *const __m128i)) }
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
    unsafe fn widen8(w: *const u8, i: usize) -> __m256 {
        // SAFETY: `vmovdqu` reads the 16 bytes of elements `8i .. 8i + 8` at `w + 16i`, which the caller guarantees
        // readable (`FloatWeights`'s `# Safety`), as it does the AVX2 context (`vpmovzxwd`, `vpslld`).
        unsafe {
            // A bf16 is the high half of its f32: zero-extend each to 32 bits and shift it up.
            let h = _mm256_cvtepu16_epi32(_mm_loadu_si128(w.add(16 * i) as *const __m128i));
            _mm256_castsi256_ps(_mm256_slli_epi32::<16>(h))
        }
    }

    #[inline(always)]
    fn at(w: &[u8], i: usize) -> f32 {
        crate::formats::bf16::bf16_at(w, 2 * i)
    }
}

/// F32 weights times F32 activations (`D` unused: no integer products).
///
/// # Safety
///
/// As for [`float_rows`]: the AVX2 context.
#[inline(always)]
unsafe fn f32_rows<D: IntDot, const R: usize>(w: &[u8], acts: [&[u8]; R], out: &mut [f32]) {
    // SAFETY: the caller provides what `float_rows` needs (`# Safety`).
    unsafe { float_rows::<F32, R>(w, acts, out) }
}

/// F16 weights times F32 activations (`D` unused: no integer products).
///
/// # Safety
///
/// As for [`float_rows`]: the AVX2 context.
#[inline(always)]
unsafe fn f16_rows<D: IntDot, const R: usize>(w: &[u8], acts: [&[u8]; R], out: &mut [f32]) {
    // SAFETY: the caller provides what `float_rows` needs (`# Safety`).
    unsafe { float_rows::<F16, R>(w, acts, out) }
}

/// BF16 weights times F32 activations (`D` unused: no integer products).
///
/// # Safety
///
/// As for [`float_rows`]: the AVX2 context.
#[inline(always)]
unsafe fn bf16_rows<D: IntDot, const R: usize>(w: &[u8], acts: [&[u8]; R], out: &mut [f32]) {
    // SAFETY: the caller provides what `float_rows` needs (`# Safety`).
    unsafe { float_rows::<Bf16, R>(w, acts, out) }
}

/// Float weights times F32 activations: product `i` to lane `i % 8`.
///
/// # Safety
///
/// The AVX2 context. Memory is read only through the slices, whose lengths it checks.
#[inline(always)]
unsafe fn float_rows<K: FloatWeights, const R: usize>(w: &[u8], acts: [&[u8]; R], out: &mut [f32]) {
    // SAFETY: the caller provides the AVX2 context. For `i < full = n / 8`, `widen8` reads elements `8i .. 8i + 8`
    // of `w`, which holds `n = w.len() / BYTES` of them, and the activation load bytes `32i .. 32i + 32` of a row
    // asserted above to hold at least `4n`; `vmovups` stores into the 8-float array `l`.
    unsafe {
        let n = w.len() / K::BYTES;
        for a in acts {
            assert!(a.len() >= 4 * n, "activation row shorter than weight row");
        }
        let mut acc = [_mm256_setzero_ps(); R];
        let full = n / 8;
        for i in 0..full {
            let wv = K::widen8(w.as_ptr(), i);
            for r in 0..R {
                let av = _mm256_loadu_ps(acts[r].as_ptr().add(32 * i) as *const f32);
                acc[r] = _mm256_add_ps(acc[r], _mm256_mul_ps(wv, av));
            }
        }
        for r in 0..R {
            let mut l = [0f32; 8];
            _mm256_storeu_ps(l.as_mut_ptr(), acc[r]);
            let mut lanes = Lanes8(l);
            for i in 8 * full..n {
                lanes.add(i, K::at(w, i) * crate::formats::f32_at(acts[r], 4 * i));
            }
            out[r] = lanes.sum();
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Activation quantisers: the same bytes as `q8_0::quantize` and `q8_k::quantize`.

/// `max(|x|)` over 8k floats, ignoring NaNs as the scalar `f32::max` / `>` loops do (`max_ps`
/// returns its second operand when either is NaN).
///
/// # Safety
///
/// The AVX2 context.
#[inline(always)]
unsafe fn abs_max(v: &[__m256]) -> f32 {
    // SAFETY: register operations, and `vmovups` into the 8-float array `l`; AVX is part of the AVX2 context the
    // caller provides (`# Safety`).
    unsafe {
        let abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFF_FFFF));
        let mut m = _mm256_setzero_ps();
        for &x in v {
            m = _mm256_max_ps(_mm256_and_ps(x, abs_mask), m);
        }
        let mut l = [0f32; 8];
        _mm256_storeu_ps(l.as_mut_ptr(), m);
        l.into_iter().fold(0f32, f32::max)
    }
}

/// Rounded values (integral f32 or NaN) to i8 as Rust's saturating `as` does: NaN to 0, clamped to
/// -128..=127; 32 values in element order.
///
/// # Safety
///
/// The AVX2 context.
#[inline(always)]
unsafe fn to_i8x32(r: [__m256; 4]) -> __m256i {
    // SAFETY: register operations only (AVX, AVX2), in the AVX2 context the caller provides (`# Safety`).
    unsafe {
        let i: [__m256i; 4] = array::from_fn(|k| {
            let x = _mm256_and_ps(r[k], _mm256_cmp_ps::<_CMP_ORD_Q>(r[k], r[k]));
            let x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-128.0)), _mm256_set1_ps(127.0));
            _mm256_cvttps_epi32(x)
        });
        let packed = _mm256_packs_epi16(_mm256_packs_epi32(i[0], i[1]), _mm256_packs_epi32(i[2], i[3]));
        // packs works within 128-bit halves; this restores element order.
        _mm256_permutevar8x32_epi32(packed, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7))
    }
}

/// `f32::round`: half away from zero. `x - trunc(x)` is exact, so the tie test is too.
///
/// # Safety
///
/// The AVX2 context.
#[inline(always)]
unsafe fn round_half_away(x: __m256) -> __m256 {
    // SAFETY: register operations only (AVX), in the AVX2 context the caller provides (`# Safety`).
    unsafe {
        let t = _mm256_round_ps::<{ _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC }>(x);
        let abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFF_FFFF));
        let frac = _mm256_and_ps(_mm256_sub_ps(x, t), abs_mask);
        let tie_or_more = _mm256_cmp_ps::<_CMP_GE_OQ>(frac, _mm256_set1_ps(0.5));
        let one_signed = _mm256_or_ps(
            _mm256_set1_ps(1.0),
            _mm256_andnot_ps(abs_mask, x), // the sign bit of x
        );
        _mm256_add_ps(t, _mm256_and_ps(tie_or_more, one_signed))
    }
}

/// [`q8_0::quantize`]'s bytes, eight floats at a time.
///
/// # Safety
///
/// The CPU must have AVX2 and F16C: `super` hands this function out only in the `QuantKernel` that `quant_kernel`
/// builds after `Isa::is_available` confirmed them.
#[target_feature(enable = "avx2,f16c")]
unsafe fn quantize_q8_0(src: &[f32], dst: &mut [u8]) {
    // SAFETY: this function is compiled with AVX2 and F16C, which its caller guarantees the CPU has (`# Safety`):
    // the context the helpers need. `x` is one block of 32 floats, and the loads at `x + 8k`, `k < 4`, read 8 of
    // them each; `block` is one 34-byte Q8_0 block, and the 32-byte store at `block + 2` fills its quants.
    unsafe {
        for (x, block) in src
            .chunks_exact(q8_0::BLOCK_LEN)
            .zip(dst.chunks_exact_mut(q8_0::BLOCK_BYTES))
        {
            let v: [__m256; 4] = array::from_fn(|k| _mm256_loadu_ps(x.as_ptr().add(8 * k)));
            let amax = abs_max(&v);
            let d = amax / 127.0;
            let id = _mm256_set1_ps(if d != 0.0 { 1.0 / d } else { 0.0 });
            block[..2].copy_from_slice(&f16_bytes(d));
            let q = to_i8x32(array::from_fn(|k| round_half_away(_mm256_mul_ps(v[k], id))));
            _mm256_storeu_si256(block.as_mut_ptr().add(2) as *mut __m256i, q);
        }
    }
}

/// [`q8_k::quantize`]'s bytes, eight floats at a time.
///
/// # Safety
///
/// The CPU must have AVX2 and F16C: `super` hands this function out only in the `QuantKernel` that `quant_kernel`
/// builds after `Isa::is_available` confirmed them.
#[target_feature(enable = "avx2,f16c")]
unsafe fn quantize_q8_k(src: &[f32], dst: &mut [u8]) {
    // SAFETY: this function is compiled with AVX2 and F16C, which its caller guarantees the CPU has (`# Safety`):
    // the context the helpers need. `x` is one block of 256 floats, and the loads at `x + 8k`, `k < 32`, read 8 of
    // them each; `block` is one 292-byte Q8_K block, and the 32-byte stores at `block + 4 + 32c`, `c < 8`, fill its
    // quants, ending at 260, where its `bsums` start.
    unsafe {
        for (x, block) in src
            .chunks_exact(q8_k::BLOCK_LEN)
            .zip(dst.chunks_exact_mut(q8_k::BLOCK_BYTES))
        {
            let v: [__m256; 32] = array::from_fn(|k| _mm256_loadu_ps(x.as_ptr().add(8 * k)));
            let amax = abs_max(&v);
            block.fill(0);
            if amax == 0.0 {
                continue;
            }
            // The reference keeps the first element of largest magnitude, with its sign.
            let abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFF_FFFF));
            let target = _mm256_set1_ps(amax);
            let first = v
                .iter()
                .enumerate()
                .find_map(|(k, &x)| {
                    let hit = _mm256_cmp_ps::<_CMP_EQ_OQ>(_mm256_and_ps(x, abs_mask), target);
                    let mask = _mm256_movemask_ps(hit);
                    (mask != 0).then(|| 8 * k + mask.trailing_zeros() as usize)
                })
                .unwrap_or(0);
            let iscale = -127.0 / x[first];
            let is = _mm256_set1_ps(iscale);
            for c in 0..8 {
                let r = array::from_fn(|k| {
                    _mm256_round_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(_mm256_mul_ps(
                        is,
                        v[4 * c + k],
                    ))
                });
                let q = to_i8x32(r);
                _mm256_storeu_si256(block.as_mut_ptr().add(4 + 32 * c) as *mut __m256i, q);
            }
            for j in 0..16 {
                let s: i16 = block[4 + 16 * j..4 + 16 * (j + 1)]
                    .iter()
                    .map(|&q| i16::from(q as i8))
                    .sum();
                block[4 + 256 + 2 * j..4 + 256 + 2 * j + 2].copy_from_slice(&s.to_le_bytes());
            }
            block[..4].copy_from_slice(&(1.0 / iscale).to_le_bytes());
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Element-wise activations: `libm::expf` (FreeBSD's `e_expf.c`) eight lanes at a time, every branch of
// the scalar code evaluated in every lane and the lane's own branch selected, each step the same IEEE
// operation as the scalar one (no FMA), so each lane gets the scalar bits.

/// The element-wise kernels. Float work only, so AVX-512 runs them too.
pub(super) fn elementwise_kernel() -> super::ElementwiseKernel {
    super::ElementwiseKernel {
        silu_mul: silu_mul_avx2,
        exp: exp_avx2,
    }
}

/// `x[i] = e^x[i]`, with `libm::expf`'s bits.
///
/// # Safety
///
/// The CPU must have AVX2: `super` hands this function out only in the `ElementwiseKernel` that
/// `elementwise_kernel` builds after `Isa::is_available` confirmed it.
#[target_feature(enable = "avx2")]
unsafe fn exp_avx2(x: &mut [f32]) {
    // SAFETY: this function is compiled with AVX2, which its caller guarantees the CPU has (`# Safety`): the
    // context `exp8` needs. Each load and store covers exactly the 8 floats of one `chunks_exact_mut(8)` chunk.
    unsafe {
        let mut chunks = x.chunks_exact_mut(8);
        for c in &mut chunks {
            _mm256_storeu_ps(c.as_mut_ptr(), exp8(_mm256_loadu_ps(c.as_ptr())));
        }
        crate::activation::exp_scalar(chunks.into_remainder());
    }
}

/// `gate[i] = silu(gate[i]) · up[i]`, with the scalar twin's bits.
///
/// # Safety
///
/// The CPU must have AVX2: `super` hands this function out only in the `ElementwiseKernel` that
/// `elementwise_kernel` builds after `Isa::is_available` confirmed it.
#[target_feature(enable = "avx2")]
unsafe fn silu_mul_avx2(gate: &mut [f32], up: &[f32]) {
    // SAFETY: this function is compiled with AVX2, which its caller guarantees the CPU has (`# Safety`): the
    // context `exp8` needs. Each load and store covers exactly the 8 floats of one chunk of `gate` or `up`.
    unsafe {
        let one = _mm256_set1_ps(1.0);
        let sign = _mm256_set1_ps(-0.0);
        let mut g = gate.chunks_exact_mut(8);
        let mut u = up.chunks_exact(8);
        for (g, u) in (&mut g).zip(&mut u) {
            let x = _mm256_loadu_ps(g.as_ptr());
            // x / (1 + e^-x), then · up
            let e = exp8(_mm256_xor_ps(x, sign));
            let y = _mm256_mul_ps(_mm256_div_ps(x, _mm256_add_ps(one, e)), _mm256_loadu_ps(u.as_ptr()));
            _mm256_storeu_ps(g.as_mut_ptr(), y);
        }
        crate::activation::silu_mul_scalar(g.into_remainder(), u.remainder());
    }
}

/// The f32 cache loops of attention (`float_dot.rs`): float work only, so AVX-512 runs them too.
pub(super) fn float_kernel() -> super::FloatKernel {
    super::FloatKernel {
        dot: dot_f32_avx2,
        dot_rows: dot_rows_avx2,
        add_weighted_rows: add_weighted_rows_avx2,
        delta_rule_rows: delta_rule_rows_avx2,
    }
}

/// Lane `k` of the register is lane `k` of the scalar twin's `Lanes8` (element `i` to lane `i % 8`,
/// a multiply then an add), the tail goes to the first lanes as there, and `lanes_sum` reduces in its
/// tree.
///
/// # Safety
///
/// The CPU must have AVX2: `super` hands this function out only in the `FloatKernel` that `float_kernel` builds
/// after `Isa::is_available` confirmed it.
#[target_feature(enable = "avx2")]
unsafe fn dot_f32_avx2(a: &[f32], b: &[f32]) -> f32 {
    // SAFETY: this function is compiled with AVX2, which its caller guarantees the CPU has (`# Safety`). Each load
    // reads exactly one 8-float chunk of `a` or `b`, and the store writes the 8-float array `l`.
    unsafe {
        let n = a.len().min(b.len());
        let (a, b) = (&a[..n], &b[..n]);
        let mut acc = _mm256_setzero_ps();
        let (ac, bc) = (a.chunks_exact(8), b.chunks_exact(8));
        let (ar, br) = (ac.remainder(), bc.remainder());
        for (x, y) in ac.zip(bc) {
            acc = _mm256_add_ps(
                acc,
                _mm256_mul_ps(_mm256_loadu_ps(x.as_ptr()), _mm256_loadu_ps(y.as_ptr())),
            );
        }
        let mut l = [0f32; 8];
        _mm256_storeu_ps(l.as_mut_ptr(), acc);
        for (i, (x, y)) in ar.iter().zip(br).enumerate() {
            l[i] += x * y;
        }
        Lanes8(l).sum()
    }
}

/// `out[t] = dot(q, row t) · scale` four rows at a time: each row's dot product has its own register, in the
/// lanes of [`dot_f32_avx2`] (a multiply then an add, the tail into the first lanes, `Lanes8`'s tree), so its
/// bits are that function's; four chains of additions are in flight instead of one, and `q` is loaded once
/// for four rows.
///
/// # Safety
///
/// The CPU must have AVX2: `super` hands this function out only in the `FloatKernel` that `float_kernel` builds
/// after `Isa::is_available` confirmed it.
#[target_feature(enable = "avx2")]
unsafe fn dot_rows_avx2(q: &[f32], rows: &[f32], stride: usize, scale: f32, out: &mut [f32]) {
    // SAFETY: this function is compiled with AVX2, which its caller guarantees the CPU has (`# Safety`). Each load
    // reads one 8-float chunk given by `chunks_exact(8)` of `q` or of a row (each row sliced with bounds checks to
    // `q`'s length), and each store writes the 8-float array `l`.
    unsafe {
        let (len, n_out) = (q.len(), out.len());
        let mut quads = out.chunks_exact_mut(4);
        for (n, o) in (&mut quads).enumerate() {
            let row = |j: usize| &rows[(4 * n + j) * stride..][..len];
            let r = [row(0), row(1), row(2), row(3)];
            let mut acc = [_mm256_setzero_ps(); 4];
            let qc = q.chunks_exact(8);
            let tail = qc.remainder().len();
            for (i, x) in qc.enumerate() {
                let x = _mm256_loadu_ps(x.as_ptr());
                for (a, r) in acc.iter_mut().zip(&r) {
                    *a = _mm256_add_ps(*a, _mm256_mul_ps(x, _mm256_loadu_ps(r[8 * i..][..8].as_ptr())));
                }
            }
            for ((o, a), r) in o.iter_mut().zip(acc).zip(&r) {
                let mut l = [0f32; 8];
                _mm256_storeu_ps(l.as_mut_ptr(), a);
                for (i, (x, y)) in q[len - tail..].iter().zip(&r[len - tail..]).enumerate() {
                    l[i] += x * y;
                }
                *o = Lanes8(l).sum() * scale;
            }
        }
        let done = n_out - quads.into_remainder().len();
        for (t, o) in out.iter_mut().enumerate().skip(done) {
            *o = dot_f32_avx2(q, &rows[t * stride..][..len]) * scale;
        }
    }
}

/// `out[j] += Σ_t w[t] · row_t[j]`, row after row as the scalar twin, but 32 elements of `out` at a time held
/// in registers through all the rows: each element still takes the rows' products in order, a multiply then
/// an add, so the bits are those of [`add_scaled_avx2`] row by row; `out` is loaded and stored once, not once
/// per row.
///
/// # Safety
///
/// The CPU must have AVX2: `super` hands this function out only in the `FloatKernel` that `float_kernel` builds
/// after `Isa::is_available` confirmed it.
#[target_feature(enable = "avx2")]
unsafe fn add_weighted_rows_avx2(out: &mut [f32], w: &[f32], rows: &[f32], stride: usize) {
    // SAFETY: this function is compiled with AVX2, which its caller guarantees the CPU has (`# Safety`). Each load
    // and store covers one 8-float chunk of a 32-float block of `out` (`chunks_exact_mut(32)`) or of the same
    // block of a row, sliced with bounds checks.
    unsafe {
        let n = out.len();
        let mut blocks = out.chunks_exact_mut(32);
        for (b, block) in (&mut blocks).enumerate() {
            let mut o = [0, 1, 2, 3].map(|k| _mm256_loadu_ps(block[8 * k..][..8].as_ptr()));
            for (t, &p) in w.iter().enumerate() {
                let (pv, r) = (_mm256_set1_ps(p), &rows[t * stride + 32 * b..][..32]);
                for (k, o) in o.iter_mut().enumerate() {
                    *o = _mm256_add_ps(*o, _mm256_mul_ps(pv, _mm256_loadu_ps(r[8 * k..][..8].as_ptr())));
                }
            }
            for (k, o) in o.into_iter().enumerate() {
                _mm256_storeu_ps(block[8 * k..][..8].as_mut_ptr(), o);
            }
        }
        let rest = blocks.into_remainder();
        if !rest.is_empty() {
            let from = n - rest.len();
            for (t, &p) in w.iter().enumerate() {
                add_scaled_avx2(rest, p, &rows[t * stride + from..][..rest.len()]);
            }
        }
    }
}

/// `out[j] += p · row[j]` over the shorter length, a multiply then an add as the scalar twin.
///
/// # Safety
///
/// The CPU must have AVX2: `super` hands this function out only in the `FloatKernel` that `float_kernel` builds
/// after `Isa::is_available` confirmed it.
#[target_feature(enable = "avx2")]
unsafe fn add_scaled_avx2(out: &mut [f32], p: f32, row: &[f32]) {
    // SAFETY: this function is compiled with AVX2, which its caller guarantees the CPU has (`# Safety`). Each load
    // reads exactly one 8-float chunk of `out` or `row`, and each store writes back that chunk of `out`.
    unsafe {
        let n = out.len().min(row.len());
        let (out, row) = (&mut out[..n], &row[..n]);
        let pv = _mm256_set1_ps(p);
        let mut o = out.chunks_exact_mut(8);
        let mut r = row.chunks_exact(8);
        for (o, r) in (&mut o).zip(&mut r) {
            let y = _mm256_add_ps(
                _mm256_loadu_ps(o.as_ptr()),
                _mm256_mul_ps(pv, _mm256_loadu_ps(r.as_ptr())),
            );
            _mm256_storeu_ps(o.as_mut_ptr(), y);
        }
        crate::float_dot::add_scaled_scalar(o.into_remainder(), p, r.remainder());
    }
}

/// The scalar twin's passes fused two by two: the decay with the first dot product, the update with
/// the second. Each element sees the same multiplies and adds in the same order, and each dot product
/// the lanes of `dot_f32_avx2`.
///
/// # Safety
///
/// The CPU must have AVX2: `super` hands this function out only in the `FloatKernel` that `float_kernel` builds
/// after `Isa::is_available` confirmed it.
#[target_feature(enable = "avx2")]
unsafe fn delta_rule_rows_avx2(rows: &mut [f32], step: &crate::DeltaStep, out: &mut [f32]) {
    // SAFETY: this function is compiled with AVX2, which its caller guarantees the CPU has (`# Safety`). Every load
    // and store covers exactly one 8-float chunk of a row of `rows`, of `k` or of `q`, and the stores into `l` its
    // 8 floats.
    unsafe {
        let crate::DeltaStep {
            decay,
            beta,
            k,
            q,
            v,
            scale,
        } = *step;
        let d = k.len();
        assert_eq!(q.len(), d, "delta_rule_rows: q and k differ in length");
        let (decay8, zero) = (_mm256_set1_ps(decay), _mm256_setzero_ps());
        for ((m, &vj), o) in rows.chunks_exact_mut(d).zip(v).zip(out.iter_mut()) {
            // m ← decay · m, and Σ m · k.
            let mut acc = zero;
            let (mut mc, mut kc) = (m.chunks_exact_mut(8), k.chunks_exact(8));
            for (x, y) in (&mut mc).zip(&mut kc) {
                let mx = _mm256_mul_ps(_mm256_loadu_ps(x.as_ptr()), decay8);
                _mm256_storeu_ps(x.as_mut_ptr(), mx);
                acc = _mm256_add_ps(acc, _mm256_mul_ps(mx, _mm256_loadu_ps(y.as_ptr())));
            }
            let mut l = [0f32; 8];
            _mm256_storeu_ps(l.as_mut_ptr(), acc);
            for (i, (x, y)) in mc.into_remainder().iter_mut().zip(kc.remainder()).enumerate() {
                *x *= decay;
                l[i] += *x * y;
            }
            let delta = (vj - Lanes8(l).sum()) * beta;
            // m ← m + k · δ, and Σ q · m.
            let (delta8, mut acc) = (_mm256_set1_ps(delta), zero);
            let (mut mc, mut kc, mut qc) = (m.chunks_exact_mut(8), k.chunks_exact(8), q.chunks_exact(8));
            for ((x, y), z) in (&mut mc).zip(&mut kc).zip(&mut qc) {
                let mx = _mm256_add_ps(
                    _mm256_loadu_ps(x.as_ptr()),
                    _mm256_mul_ps(_mm256_loadu_ps(y.as_ptr()), delta8),
                );
                _mm256_storeu_ps(x.as_mut_ptr(), mx);
                acc = _mm256_add_ps(acc, _mm256_mul_ps(_mm256_loadu_ps(z.as_ptr()), mx));
            }
            let mut l = [0f32; 8];
            _mm256_storeu_ps(l.as_mut_ptr(), acc);
            for (i, ((x, y), z)) in mc
                .into_remainder()
                .iter_mut()
                .zip(kc.remainder())
                .zip(qc.remainder())
                .enumerate()
            {
                *x += y * delta;
                l[i] += z * *x;
            }
            *o = Lanes8(l).sum() * scale;
        }
    }
}

/// `libm::expf` of each lane. The constants and thresholds are the scalar code's, named as there.
///
/// # Safety
///
/// The AVX2 context.
#[inline(always)]
unsafe fn exp8(x: __m256) -> __m256 {
    const LN2_HI: f32 = f32::from_bits(0x3f31_7200);
    const LN2_LO: f32 = f32::from_bits(0x35bf_be8e);
    const INV_LN2: f32 = f32::from_bits(0x3fb8_aa3b);
    const P1: f32 = f32::from_bits(0x3e2a_aa8f); // 0xaaaa8f.0p-26
    const P2: f32 = f32::from_bits(0xbb35_5215); // -0xb55215.0p-32

    // SAFETY: register operations only (AVX, AVX2), in the AVX2 context the caller provides (`# Safety`).
    unsafe {
        let f = _mm256_set1_ps;
        let i = _mm256_set1_epi32;
        let bits = _mm256_castps_si256(x);
        let hx = _mm256_and_si256(bits, i(0x7fff_ffff)); // |x| as bits: below 2^31, so signed compares work
        let negative = _mm256_srai_epi32::<31>(bits); // all ones where x < 0
        let above = |t: i32| _mm256_cmpgt_epi32(hx, i(t));
        let pick = |mask: __m256i, yes: __m256i, no: __m256i| _mm256_blendv_epi8(no, yes, mask);
        let pick_ps = |mask: __m256i, yes: __m256, no: __m256| _mm256_blendv_ps(no, yes, _mm256_castsi256_ps(mask));

        // Argument reduction: k = round(x / ln2) where |x| > 1.5 ln2 (truncating x/ln2 ± 0.5, as `as i32`
        // does), ±1 where 0.5 ln2 < |x| <= 1.5 ln2, 0 below; then x - k·ln2 in two parts. With k = 0 the
        // parts are x and +0 exactly, as the scalar code's `hi = x; lo = 0`.
        let half = pick_ps(negative, f(-0.5), f(0.5));
        let k_far = _mm256_cvttps_epi32(_mm256_add_ps(_mm256_mul_ps(f(INV_LN2), x), half));
        let k_near = _mm256_sub_epi32(i(1), _mm256_and_si256(negative, i(2)));
        let k = pick(above(0x3f85_1592), k_far, _mm256_and_si256(above(0x3eb1_7218), k_near));
        let kf = _mm256_cvtepi32_ps(k);
        let hi = _mm256_sub_ps(x, _mm256_mul_ps(kf, f(LN2_HI)));
        let lo = _mm256_mul_ps(kf, f(LN2_LO));
        let r = _mm256_sub_ps(hi, lo);

        // e^r on the primary range: y = 1 + (r·c / (2 - c) - lo + hi), c = r - r²·(P1 + r²·P2).
        let rr = _mm256_mul_ps(r, r);
        let c = _mm256_sub_ps(r, _mm256_mul_ps(rr, _mm256_add_ps(f(P1), _mm256_mul_ps(rr, f(P2)))));
        let q = _mm256_div_ps(_mm256_mul_ps(r, c), _mm256_sub_ps(f(2.0), c));
        let y = _mm256_add_ps(f(1.0), _mm256_add_ps(_mm256_sub_ps(q, lo), hi));

        // y · 2^k as `scalbnf` does it: k here lies in -150..=128, so at most one prescaling step, by 2^127
        // above 127 or by 2^-102 below -126, then one multiply by a normal power of two.
        let big = _mm256_cmpgt_epi32(k, i(127));
        let small = _mm256_cmpgt_epi32(i(-126), k);
        let y = pick_ps(big, _mm256_mul_ps(y, f(f32::from_bits(0x7f00_0000))), y);
        let y = pick_ps(small, _mm256_mul_ps(y, f(f32::from_bits(0x0c80_0000))), y);
        let n = _mm256_add_epi32(
            k,
            _mm256_add_epi32(_mm256_and_si256(big, i(-127)), _mm256_and_si256(small, i(102))),
        );
        let scaled = _mm256_mul_ps(
            y,
            _mm256_castsi256_ps(_mm256_slli_epi32::<23>(_mm256_add_epi32(n, i(127)))),
        );

        // The scalar code's early returns, last-checked first: |x| <= 2^-14 gives 1 + x; x <= -103.97 gives
        // +0; x >= 88.72 overflows as x · 2^127 (+inf); NaN returns itself.
        let tiny = _mm256_cmpgt_epi32(i(0x3900_0001), hx);
        let out = pick_ps(tiny, _mm256_add_ps(f(1.0), x), scaled);
        let zero = _mm256_and_si256(negative, above(0x42cf_f1b4));
        let out = pick_ps(zero, _mm256_setzero_ps(), out);
        let overflow = _mm256_andnot_si256(negative, above(0x42b1_7217));
        let out = pick_ps(overflow, _mm256_mul_ps(x, f(f32::from_bits(0x7f00_0000))), out);
        pick_ps(above(0x7f80_0000), x, out)
    }
}
