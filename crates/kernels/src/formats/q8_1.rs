//! Q8_1: Q8_0 plus a precomputed block sum. The activation format for Q4_1 and Q5_1 weights, whose
//! offset `m` multiplies the sum of the activations.
//!
//! Layout (36 bytes, ggml `block_q8_1`): `d: f16 | s: f16 | qs: [i8; 32]`; element `i` is `d · qs[i]`
//! and `s` is `d · Σ qs[i]` (rounded to f16).

use crate::accum::Lanes8;
use crate::formats::{dot_i8, f16_at, f16_bytes};

pub(crate) const BLOCK_LEN: usize = 32;
pub(crate) const BLOCK_BYTES: usize = 36;

/// The block's scale `d`.
#[inline(always)]
pub(crate) fn scale(block: &[u8]) -> f32 {
    f16_at(block, 0)
}

/// The block's `s = d · Σ qs`.
#[inline(always)]
pub(crate) fn sum(block: &[u8]) -> f32 {
    f16_at(block, 2)
}

/// The block's quants as raw bytes (two's-complement i8).
#[inline(always)]
pub(crate) fn quants(block: &[u8]) -> &[u8] {
    &block[4..BLOCK_BYTES]
}

pub(crate) fn dequantize(src: &[u8], dst: &mut [f32]) {
    for (block, out) in src.chunks_exact(BLOCK_BYTES).zip(dst.chunks_exact_mut(BLOCK_LEN)) {
        let d = scale(block);
        for (y, &q) in out.iter_mut().zip(quants(block)) {
            *y = f32::from(q as i8) * d;
        }
    }
}

/// llama.cpp's `quantize_row_q8_1_ref`: quants as Q8_0 (`d = amax / 127`, `roundf`, half away from
/// zero), and `s = f16(f32(Σ qs) · d)` with the unrounded f32 `d`.
pub(crate) fn quantize(src: &[f32], dst: &mut [u8]) {
    for (x, block) in src.chunks_exact(BLOCK_LEN).zip(dst.chunks_exact_mut(BLOCK_BYTES)) {
        let amax = x.iter().fold(0f32, |m, v| m.max(v.abs()));
        let d = amax / 127.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        let mut sum = 0i32;
        for (q, &v) in block[4..].iter_mut().zip(x) {
            let qi = (v * id).round() as i8;
            sum += i32::from(qi);
            *q = qi as u8;
        }
        block[..2].copy_from_slice(&f16_bytes(d));
        block[2..4].copy_from_slice(&f16_bytes(sum as f32 * d));
    }
}

/// Q8_1 · Q8_1 (Q8_1 as a weight has no offset, so `s` is not used). Per block `b`: the term
/// `(d_w · d_a) · f32(sumi)`, added to lane `b % 8` (see [`Lanes8`]).
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
    use crate::formats::q8_0;
    use crate::testutil;
    use crate::GgmlType;

    #[test]
    fn vec_dot_matches_f64() {
        testutil::assert_vec_dot_matches_f64(GgmlType::Q8_1);
    }

    #[test]
    fn quantize_round_trip_is_within_half_a_step() {
        testutil::assert_quantize_round_trip(GgmlType::Q8_1);
    }

    #[test]
    fn quants_equal_q8_0_and_s_is_the_scaled_sum() {
        let mut rng = testutil::Rng::new(3);
        let x: Vec<f32> = (0..96).map(|_| rng.normal()).collect();
        let mut q81 = vec![0u8; 3 * super::BLOCK_BYTES];
        let mut q80 = vec![0u8; 3 * q8_0::BLOCK_BYTES];
        super::quantize(&x, &mut q81);
        q8_0::quantize(&x, &mut q80);
        let blocks = q81
            .chunks_exact(super::BLOCK_BYTES)
            .zip(q80.chunks_exact(q8_0::BLOCK_BYTES));
        for ((b81, b80), xb) in blocks.zip(x.chunks_exact(32)) {
            assert_eq!(&b81[..2], &b80[..2]);
            assert_eq!(super::quants(b81), q8_0::quants(b80));
            let d = xb.iter().fold(0f32, |m, v| m.max(v.abs())) / 127.0;
            let sum: i32 = super::quants(b81).iter().map(|&q| i32::from(q as i8)).sum();
            assert_eq!(&b81[2..4], &crate::formats::f16_bytes(sum as f32 * d));
        }
    }
}
