//! One module per tensor format. Each holds the block layout (as ggml's `block_*` struct in
//! `ggml-common.h`), `dequantize`, `vec_dot` against its activation format, `quantize` for the
//! activation formats, and its tests.
//!
//! Blocks are read straight from byte slices (GGUF data is only byte-aligned and comes from an mmap),
//! little-endian, with no copies. Every function here gets whole blocks: the public entry points in
//! `lib.rs` check lengths first.

pub(crate) mod bf16;
pub(crate) mod fp16;
pub(crate) mod fp32;
pub(crate) mod mxfp4;
pub(crate) mod q2_k;
pub(crate) mod q3_k;
pub(crate) mod q4_0;
pub(crate) mod q4_1;
pub(crate) mod q4_k;
pub(crate) mod q5_0;
pub(crate) mod q5_1;
pub(crate) mod q5_k;
pub(crate) mod q6_k;
pub(crate) mod q8_0;
pub(crate) mod q8_1;
pub(crate) mod q8_k;

/// Elements per K-quant super-block (ggml's `QK_K`).
pub(crate) const QK_K: usize = 256;

/// The f16 at byte offset `at`, widened to f32 (exact).
#[inline(always)]
pub(crate) fn f16_at(b: &[u8], at: usize) -> f32 {
    half::f16::from_bits(u16::from_le_bytes([b[at], b[at + 1]])).to_f32()
}

/// The f16 bit pattern of `v`, rounded to nearest even (ggml's `GGML_FP32_TO_FP16`).
#[inline(always)]
pub(crate) fn f16_bytes(v: f32) -> [u8; 2] {
    half::f16::from_f32(v).to_bits().to_le_bytes()
}

/// The f32 at byte offset `at`.
#[inline(always)]
pub(crate) fn f32_at(b: &[u8], at: usize) -> f32 {
    f32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

/// The i16 at byte offset `at`.
#[inline(always)]
pub(crate) fn i16_at(b: &[u8], at: usize) -> i16 {
    i16::from_le_bytes([b[at], b[at + 1]])
}

/// Integer dot product of unpacked weight quants with activation quants stored as raw i8 bytes.
/// Exact (every caller's value ranges keep it far from i32 overflow), so its order is free: a SIMD
/// twin may sum in any order and get the same integer.
#[inline(always)]
pub(crate) fn dot_i8(w: &[i8], act: &[u8]) -> i32 {
    w.iter()
        .zip(act)
        .map(|(&x, &y)| i32::from(x) * i32::from(y as i8))
        .sum()
}
