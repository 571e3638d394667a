//! Q2_K: 256 weights in 16 sub-blocks of 16, 2-bit quants, a 4-bit scale and a 4-bit min per
//! sub-block, and f16 super-scales `d` and `dmin`. Multiplied with Q8_K activations.
//!
//! Layout (84 bytes, ggml `block_q2_K`): `scales: [u8; 16] | qs: [u8; 64] | d: f16 | dmin: f16`.
//! Sub-block `s` (elements `16s .. 16s + 16`) has scale `scales[s] & 0xF` and min `scales[s] >> 4`.
//! Element `e = 128n + 32j + l` (`n < 2, j < 4, l < 32`) is bits `2j .. 2j + 2` of `qs[32n + l]`.
//! Element value `(d · scale) · q - dmin · min`.

use crate::accum::Lanes8;
use crate::formats::{dot_i8, f16_at, q8_k, QK_K};

pub(crate) const BLOCK_LEN: usize = QK_K;
pub(crate) const BLOCK_BYTES: usize = QK_K / 16 + QK_K / 4 + 4;

const QS: usize = QK_K / 16;
const D: usize = QS + QK_K / 4;
const DMIN: usize = D + 2;

/// The block's quants (0..=3) in element order.
#[inline(always)]
fn unpack(block: &[u8]) -> [i8; QK_K] {
    std::array::from_fn(|e| {
        let (n, j, l) = (e / 128, e % 128 / 32, e % 32);
        ((block[QS + 32 * n + l] >> (2 * j)) & 3) as i8
    })
}

pub(crate) fn dequantize(src: &[u8], dst: &mut [f32]) {
    for (block, out) in src.chunks_exact(BLOCK_BYTES).zip(dst.chunks_exact_mut(BLOCK_LEN)) {
        let (d, dmin) = (f16_at(block, D), f16_at(block, DMIN));
        let q = unpack(block);
        for (s, (ys, qs)) in out.chunks_exact_mut(16).zip(q.chunks_exact(16)).enumerate() {
            let dl = d * f32::from(block[s] & 0x0F);
            let ml = dmin * f32::from(block[s] >> 4);
            for (y, &q) in ys.iter_mut().zip(qs) {
                *y = dl * f32::from(q) - ml;
            }
        }
    }
}

/// Q2_K · Q8_K. Per block `b`, two exact integers: `sumi = Σ_s scale_s · (q · a)_s` and
/// `summ = Σ_s min_s · bsums_s`; then the term `(d_w · d_a) · f32(sumi) - (dmin_w · d_a) · f32(summ)`,
/// added to lane `b % 8` (see [`Lanes8`]).
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
        for (s, &sc) in wb[..QK_K / 16].iter().enumerate() {
            let sub = 16 * s..16 * (s + 1);
            sumi += i32::from(sc & 0x0F) * dot_i8(&q[sub.clone()], &a[sub]);
            summ += i32::from(sc >> 4) * q8_k::bsum(ab, s);
        }
        let d_a = q8_k::scale(ab);
        acc.add(
            b,
            (f16_at(wb, D) * d_a) * sumi as f32 - (f16_at(wb, DMIN) * d_a) * summ as f32,
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
        testutil::assert_dequantize_matches_gguf_py(GgmlType::Q2_K);
    }

    #[test]
    fn vec_dot_matches_f64() {
        testutil::assert_vec_dot_matches_f64(GgmlType::Q2_K);
    }
}
