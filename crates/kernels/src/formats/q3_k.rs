//! Q3_K: 256 weights in 16 sub-blocks of 16, 3-bit quants, a 6-bit signed scale per sub-block and an
//! f16 super-scale `d`. Multiplied with Q8_K activations.
//!
//! Layout (110 bytes, ggml `block_q3_K`): `hmask: [u8; 32] | qs: [u8; 64] | scales: [u8; 12] | d: f16`.
//! Element `e = 128n + 32j + l` (`n < 2, j < 4, l < 32`): its low two bits are bits `2j .. 2j + 2` of
//! `qs[32n + l]`, and bit `4n + j` of `hmask[l]` is set when it is *not* offset by -4, so
//! `q = low - (hbit ? 0 : 4)` in -4..=3. The scale of sub-block `s` is 6 bits minus 32: the low 4 are
//! the low nibble of `scales[s]` for `s < 8` and the high nibble of `scales[s - 8]` after; the high 2
//! are bits `2(s / 4) .. 2(s / 4) + 2` of `scales[8 + s % 4]`. Element value `(d · scale) · q`.

use crate::accum::Lanes8;
use crate::formats::{dot_i8, f16_at, q8_k, QK_K};

pub(crate) const BLOCK_LEN: usize = QK_K;
pub(crate) const BLOCK_BYTES: usize = QK_K / 8 + QK_K / 4 + 12 + 2;

const QS: usize = QK_K / 8;
const SCALES: usize = QS + QK_K / 4;
const D: usize = SCALES + 12;

/// The block's quants (-4..=3) in element order.
#[inline(always)]
fn unpack(block: &[u8]) -> [i8; QK_K] {
    std::array::from_fn(|e| {
        let (n, j, l) = (e / 128, e % 128 / 32, e % 32);
        let low = ((block[QS + 32 * n + l] >> (2 * j)) & 3) as i8;
        let high_set = (block[l] >> (4 * n + j)) & 1 == 1;
        if high_set {
            low
        } else {
            low - 4
        }
    })
}

/// The 16 sub-block scales (-32..=31); the SIMD kernels use it too.
#[inline(always)]
pub(crate) fn scales(block: &[u8]) -> [i8; 16] {
    let sc = &block[SCALES..D];
    std::array::from_fn(|s| {
        let low = if s < 8 { sc[s] & 0x0F } else { sc[s - 8] >> 4 };
        let high = (sc[8 + s % 4] >> (2 * (s / 4))) & 3;
        (low | high << 4) as i8 - 32
    })
}

pub(crate) fn dequantize(src: &[u8], dst: &mut [f32]) {
    for (block, out) in src.chunks_exact(BLOCK_BYTES).zip(dst.chunks_exact_mut(BLOCK_LEN)) {
        let d = f16_at(block, D);
        let q = unpack(block);
        for ((ys, qs), sc) in out.chunks_exact_mut(16).zip(q.chunks_exact(16)).zip(scales(block)) {
            let dl = d * f32::from(sc);
            for (y, &q) in ys.iter_mut().zip(qs) {
                *y = dl * f32::from(q);
            }
        }
    }
}

/// Q3_K · Q8_K. Per block `b`: exact integer `sumi = Σ_s scale_s · (q · a)_s`, then the term
/// `(d_w · d_a) · f32(sumi)`, added to lane `b % 8` (see [`Lanes8`]).
pub(crate) fn vec_dot(w: &[u8], act: &[u8]) -> f32 {
    let mut acc = Lanes8::default();
    for (b, (wb, ab)) in w
        .chunks_exact(BLOCK_BYTES)
        .zip(act.chunks_exact(q8_k::BLOCK_BYTES))
        .enumerate()
    {
        let q = unpack(wb);
        let a = q8_k::quants(ab);
        let sumi: i32 = scales(wb)
            .iter()
            .enumerate()
            .map(|(s, &sc)| i32::from(sc) * dot_i8(&q[16 * s..16 * (s + 1)], &a[16 * s..16 * (s + 1)]))
            .sum();
        acc.add(b, (f16_at(wb, D) * q8_k::scale(ab)) * sumi as f32);
    }
    acc.sum()
}

#[cfg(test)]
mod tests {
    use crate::testutil;
    use crate::GgmlType;

    #[test]
    fn dequantize_matches_gguf_py() {
        testutil::assert_dequantize_matches_gguf_py(GgmlType::Q3_K);
    }

    #[test]
    fn vec_dot_matches_f64() {
        testutil::assert_vec_dot_matches_f64(GgmlType::Q3_K);
    }
}
