//! Q8_K: 256 elements, one f32 scale, signed 8-bit quants and their sums per 16. The activation
//! format for every K-quant; the sums let the K-quants' offsets (`dmin · m`) be applied once per
//! sub-block instead of once per element.
//!
//! Layout (292 bytes, ggml `block_q8_K`): `d: f32 | qs: [i8; 256] | bsums: [i16; 16]`; element `i` is
//! `d · qs[i]` and `bsums[j] = Σ qs[16j .. 16j + 16]`.

use crate::accum::Lanes8;
use crate::formats::{dot_i8, f32_at, i16_at, QK_K};

pub(crate) const BLOCK_LEN: usize = QK_K;
pub(crate) const BLOCK_BYTES: usize = 4 + QK_K + 2 * QK_K / 16;

/// The block's scale.
#[inline(always)]
pub(crate) fn scale(block: &[u8]) -> f32 {
    f32_at(block, 0)
}

/// The block's quants as raw bytes (two's-complement i8).
#[inline(always)]
pub(crate) fn quants(block: &[u8]) -> &[u8] {
    &block[4..4 + QK_K]
}

/// `Σ qs[16j .. 16j + 16]`.
#[inline(always)]
pub(crate) fn bsum(block: &[u8], j: usize) -> i32 {
    i32::from(i16_at(block, 4 + QK_K + 2 * j))
}

pub(crate) fn dequantize(src: &[u8], dst: &mut [f32]) {
    for (block, out) in src.chunks_exact(BLOCK_BYTES).zip(dst.chunks_exact_mut(BLOCK_LEN)) {
        let d = scale(block);
        for (y, &q) in out.iter_mut().zip(quants(block)) {
            *y = d * f32::from(q as i8);
        }
    }
}

/// llama.cpp's `quantize_row_q8_K_ref`: `max` is the first element of largest magnitude (sign kept),
/// `iscale = -127 / max`, `q = min(127, nearest_int(iscale · x))` where `nearest_int` rounds half to
/// even (ggml's magic-number trick, Rust's `round_ties_even`), `d = 1 / iscale` stored as f32. An
/// all-zero block gets `d = 0` and zero quants.
pub(crate) fn quantize(src: &[f32], dst: &mut [u8]) {
    for (x, block) in src.chunks_exact(BLOCK_LEN).zip(dst.chunks_exact_mut(BLOCK_BYTES)) {
        let (mut amax, mut max) = (0f32, 0f32);
        for &v in x {
            if v.abs() > amax {
                amax = v.abs();
                max = v;
            }
        }
        block.fill(0);
        if amax == 0.0 {
            continue;
        }
        let iscale = -127.0 / max;
        // |iscale · x| <= 127 up to rounding, so the clamp's lower bound never binds; the upper one is
        // the reference's `MIN(127, v)`.
        for (q, &v) in block[4..4 + QK_K].iter_mut().zip(x) {
            *q = ((iscale * v).round_ties_even() as i32).clamp(-128, 127) as i8 as u8;
        }
        for j in 0..QK_K / 16 {
            let s: i16 = block[4 + 16 * j..4 + 16 * (j + 1)]
                .iter()
                .map(|&q| i16::from(q as i8))
                .sum();
            block[4 + QK_K + 2 * j..4 + QK_K + 2 * j + 2].copy_from_slice(&s.to_le_bytes());
        }
        block[..4].copy_from_slice(&(1.0 / iscale).to_le_bytes());
    }
}

/// Q8_K · Q8_K. Per block `b`: the term `(d_w · d_a) · f32(sumi)`, added to lane `b % 8` (see [`Lanes8`]).
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
    use super::*;
    use crate::testutil;
    use crate::GgmlType;

    #[test]
    fn vec_dot_matches_f64() {
        testutil::assert_vec_dot_matches_f64(GgmlType::Q8_K);
    }

    #[test]
    fn quantize_round_trip_is_within_half_a_step() {
        testutil::assert_quantize_round_trip(GgmlType::Q8_K);
    }

    #[test]
    fn quantize_follows_the_reference() {
        // max = -127/64 (first of largest magnitude, sign kept) -> iscale = 64, d = 1/64, all exact.
        let mut x = [0f32; QK_K];
        x[0] = 1.0;
        x[1] = -127.0 / 64.0;
        x[2] = 127.0 / 64.0;
        x[3] = 0.5 / 64.0; // 0.5 -> ties to even: 0
        x[4] = 1.5 / 64.0; // 1.5 -> 2
        x[5] = 2.5 / 64.0; // 2.5 -> 2
        x[17] = 0.5; // 32, in the second group of 16
        let mut block = [0u8; BLOCK_BYTES];
        quantize(&x, &mut block);
        assert_eq!(scale(&block), 1.0 / 64.0);
        let q = |i: usize| quants(&block)[i] as i8;
        assert_eq!(
            [q(0), q(1), q(2), q(3), q(4), q(5), q(17)],
            [64, -127, 127, 0, 2, 2, 32]
        );
        assert_eq!(bsum(&block, 0), 64 - 127 + 127 + 2 + 2);
        assert_eq!(bsum(&block, 1), 32);
    }

    #[test]
    fn zero_block_has_zero_scale_and_sums() {
        let mut block = [0xAAu8; BLOCK_BYTES];
        quantize(&[0f32; QK_K], &mut block);
        assert!(block.iter().all(|&b| b == 0));
    }

    #[test]
    fn dequantize_is_scale_times_quant() {
        let mut block = [0u8; BLOCK_BYTES];
        block[..4].copy_from_slice(&0.25f32.to_le_bytes());
        block[4] = (-3i8) as u8;
        block[5] = 7;
        let mut y = [1f32; QK_K];
        dequantize(&block, &mut y);
        assert_eq!(&y[..3], &[-0.75, 1.75, 0.0]);
    }
}
