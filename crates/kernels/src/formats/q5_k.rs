//! Q5_K: Q4_K with a fifth bit per quant. 256 weights in 8 sub-blocks of 32, 6-bit scales and mins,
//! f16 super-scales `d` and `dmin`. Multiplied with Q8_K activations.
//!
//! Layout (176 bytes, ggml `block_q5_K`): `d: f16 | dmin: f16 | scales: [u8; 12] | qh: [u8; 32] |
//! qs: [u8; 128]`. Element `e` of sub-block `s = e / 32` (`l = e % 32`): low 4 bits as in Q4_K, fifth bit
//! is bit `s` of `qh[l]`. Scales and mins packed as in Q4_K ([`q4_k::scale_min`]). Element value
//! `(d · scale) · q - dmin · min`.

use crate::accum::Lanes8;
use crate::formats::{dot_i8, f16_at, q4_k, q8_k, QK_K};

pub(crate) const BLOCK_LEN: usize = QK_K;
pub(crate) const BLOCK_BYTES: usize = 4 + 12 + QK_K / 8 + QK_K / 2;

const SCALES: usize = 4;
const QH: usize = SCALES + 12;
const QS: usize = QH + QK_K / 8;

/// The block's quants (0..=31) in element order.
#[inline(always)]
fn unpack(block: &[u8]) -> [i8; QK_K] {
    std::array::from_fn(|e| {
        let (s, l) = (e / 32, e % 32);
        let byte = block[QS + 32 * (s / 2) + l];
        let low = if s % 2 == 0 { byte & 0x0F } else { byte >> 4 };
        let high = (block[QH + l] >> s) & 1;
        (low | high << 4) as i8
    })
}

pub(crate) fn dequantize(src: &[u8], dst: &mut [f32]) {
    for (block, out) in src.chunks_exact(BLOCK_BYTES).zip(dst.chunks_exact_mut(BLOCK_LEN)) {
        let (d, dmin) = (f16_at(block, 0), f16_at(block, 2));
        let q = unpack(block);
        for (s, (ys, qs)) in out.chunks_exact_mut(32).zip(q.chunks_exact(32)).enumerate() {
            let (scale, min) = q4_k::scale_min(&block[SCALES..QH], s);
            let (dl, ml) = (d * f32::from(scale), dmin * f32::from(min));
            for (y, &q) in ys.iter_mut().zip(qs) {
                *y = dl * f32::from(q) - ml;
            }
        }
    }
}

/// Q5_K · Q8_K, in the same order as [`q4_k::vec_dot`]: per block `b`, exact `sumi` and `summ`, then
/// `(d_w · d_a) · f32(sumi) - (dmin_w · d_a) · f32(summ)` added to lane `b % 8` (see [`Lanes8`]).
pub(crate) fn vec_dot(w: &[u8], act: &[u8]) -> f32 {
    let mut acc = Lanes8::default();
    for (b, (wb, ab)) in w
        .chunks_exact(BLOCK_BYTES)
        .zip(act.chunks_exact(q8_k::BLOCK_BYTES))
        .enumerate()
    {
        let q = unpack(wb);
        let a = q8_k::quants(ab);
        let (mut sumi, mut summ) = (0i32, 0i32);
        for s in 0..QK_K / 32 {
            let (scale, min) = q4_k::scale_min(&wb[SCALES..QH], s);
            let sub = 32 * s..32 * (s + 1);
            sumi += i32::from(scale) * dot_i8(&q[sub.clone()], &a[sub]);
            summ += i32::from(min) * (q8_k::bsum(ab, 2 * s) + q8_k::bsum(ab, 2 * s + 1));
        }
        let d_a = q8_k::scale(ab);
        acc.add(
            b,
            (f16_at(wb, 0) * d_a) * sumi as f32 - (f16_at(wb, 2) * d_a) * summ as f32,
        );
    }
    acc.sum()
}

#[cfg(test)]
mod tests {
    use crate::testutil;
    use crate::GgmlType;

    #[test]
    fn dequantize_matches_gguf_py() {
        testutil::assert_dequantize_matches_gguf_py(GgmlType::Q5_K);
    }

    #[test]
    fn vec_dot_matches_f64() {
        testutil::assert_vec_dot_matches_f64(GgmlType::Q5_K);
    }
}
