//! Q8_0: 32 elements, one f16 scale, signed 8-bit quants. A weight format, and the activation format
//! for Q4_0, Q5_0 and Q8_0 weights.
//!
//! Layout (34 bytes, ggml `block_q8_0`): `d: f16 | qs: [i8; 32]`; element `i` is `d · qs[i]`.

use crate::accum::Lanes8;
use crate::formats::{dot_i8, f16_at, f16_bytes};

pub(crate) const BLOCK_LEN: usize = 32;
pub(crate) const BLOCK_BYTES: usize = 34;

/// The block's scale.
#[inline(always)]
pub(crate) fn scale(block: &[u8]) -> f32 {
    f16_at(block, 0)
}

/// The block's quants as raw bytes (two's-complement i8).
#[inline(always)]
pub(crate) fn quants(block: &[u8]) -> &[u8] {
    &block[2..BLOCK_BYTES]
}

pub(crate) fn dequantize(src: &[u8], dst: &mut [f32]) {
    for (block, out) in src.chunks_exact(BLOCK_BYTES).zip(dst.chunks_exact_mut(BLOCK_LEN)) {
        let d = scale(block);
        for (y, &q) in out.iter_mut().zip(quants(block)) {
            *y = f32::from(q as i8) * d;
        }
    }
}

/// llama.cpp's `quantize_row_q8_0_ref`: `d = amax / 127` (f32), `q = round(x · (1/d))` with
/// `roundf`'s rounding (half away from zero, Rust's `f32::round`); `d` is stored rounded to f16 (nearest
/// even) while the quants were computed with the unrounded `d`, exactly as the reference does.
pub(crate) fn quantize(src: &[f32], dst: &mut [u8]) {
    for (x, block) in src.chunks_exact(BLOCK_LEN).zip(dst.chunks_exact_mut(BLOCK_BYTES)) {
        let amax = x.iter().fold(0f32, |m, v| m.max(v.abs()));
        let d = amax / 127.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        block[..2].copy_from_slice(&f16_bytes(d));
        for (q, &v) in block[2..].iter_mut().zip(x) {
            *q = (v * id).round() as i8 as u8;
        }
    }
}

/// Q8_0 · Q8_0. Per block `b`: exact integer `sumi`, then the term `(d_w · d_a) · f32(sumi)`, added to
/// lane `b % 8` (see [`Lanes8`]).
pub(crate) fn vec_dot(w: &[u8], act: &[u8]) -> f32 {
    let mut acc = Lanes8::default();
    for (b, (wb, ab)) in w
        .chunks_exact(BLOCK_BYTES)
        .zip(act.chunks_exact(BLOCK_BYTES))
        .enumerate()
    {
        let w_q: [i8; BLOCK_LEN] = std::array::from_fn(|i| quants(wb)[i] as i8);
        let sumi = dot_i8(&w_q, quants(ab));
        acc.add(b, (scale(wb) * scale(ab)) * sumi as f32);
    }
    acc.sum()
}

#[cfg(test)]
mod tests {
    use crate::testutil;
    use crate::GgmlType;

    #[test]
    fn dequantize_matches_gguf_py() {
        testutil::assert_dequantize_matches_gguf_py(GgmlType::Q8_0);
    }

    #[test]
    fn quantize_matches_gguf_py() {
        testutil::assert_quantize_matches_gguf_py(GgmlType::Q8_0);
    }

    #[test]
    fn vec_dot_matches_f64() {
        testutil::assert_vec_dot_matches_f64(GgmlType::Q8_0);
    }

    #[test]
    fn quantize_round_trip_is_within_half_a_step() {
        testutil::assert_quantize_round_trip(GgmlType::Q8_0);
    }

    #[test]
    fn quantize_rounds_half_away_from_zero() {
        // amax 127 gives d = 1 exactly, so x · id is x itself.
        let mut x = [0f32; 32];
        x[0] = 127.0;
        x[1] = 2.5;
        x[2] = -2.5;
        x[3] = 0.5;
        let mut block = [0u8; 34];
        super::quantize(&x, &mut block);
        assert_eq!(&block[2..6], &[127, 3, (-3i8) as u8, 1]);
    }
}
