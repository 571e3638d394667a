//! Q6_K: 256 weights in 16 sub-blocks of 16, 6-bit quants offset by 32, an i8 scale per sub-block and
//! an f16 super-scale `d`. Multiplied with Q8_K activations.
//!
//! Layout (210 bytes, ggml `block_q6_K`): `ql: [u8; 128] | qh: [u8; 64] | scales: [i8; 16] | d: f16`.
//! Element `e = 128n + 32k + l` (`n < 2, k < 4, l < 32`): low 4 bits are the low nibble (`k < 2`) or high
//! nibble (`k >= 2`) of `ql[64n + 32(k % 2) + l]`, high 2 bits are bits `2k .. 2k + 2` of `qh[32n + l]`;
//! `q = bits - 32`. Sub-block `s = e / 16` has scale `scales[s]`. Element value `(d · scale) · q`.

use crate::accum::Lanes8;
use crate::formats::{dot_i8, f16_at, q8_k, QK_K};

pub(crate) const BLOCK_LEN: usize = QK_K;
pub(crate) const BLOCK_BYTES: usize = QK_K / 2 + QK_K / 4 + QK_K / 16 + 2;

const QH: usize = QK_K / 2;
const SCALES: usize = QH + QK_K / 4;
const D: usize = SCALES + QK_K / 16;

/// The block's quants (-32..=31) in element order.
#[inline(always)]
fn unpack(block: &[u8]) -> [i8; QK_K] {
    std::array::from_fn(|e| {
        let (n, k, l) = (e / 128, e % 128 / 32, e % 32);
        let byte = block[64 * n + 32 * (k % 2) + l];
        let low = if k < 2 { byte & 0x0F } else { byte >> 4 };
        let high = (block[QH + 32 * n + l] >> (2 * k)) & 3;
        (low | high << 4) as i8 - 32
    })
}

/// Scale of sub-block `s`.
#[inline(always)]
fn scale(block: &[u8], s: usize) -> i8 {
    block[SCALES + s] as i8
}

pub(crate) fn dequantize(src: &[u8], dst: &mut [f32]) {
    for (block, out) in src.chunks_exact(BLOCK_BYTES).zip(dst.chunks_exact_mut(BLOCK_LEN)) {
        let d = f16_at(block, D);
        let q = unpack(block);
        for (s, (ys, qs)) in out.chunks_exact_mut(16).zip(q.chunks_exact(16)).enumerate() {
            let dl = d * f32::from(scale(block, s));
            for (y, &q) in ys.iter_mut().zip(qs) {
                *y = dl * f32::from(q);
            }
        }
    }
}

/// Q6_K · Q8_K. Per block `b`: exact integer `sumi = Σ_s scale_s · (q · a)_s`, then the term
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
        let sumi: i32 = (0..QK_K / 16)
            .map(|s| i32::from(scale(wb, s)) * dot_i8(&q[16 * s..16 * (s + 1)], &a[16 * s..16 * (s + 1)]))
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
        testutil::assert_dequantize_matches_gguf_py(GgmlType::Q6_K);
    }

    #[test]
    fn vec_dot_matches_f64() {
        testutil::assert_vec_dot_matches_f64(GgmlType::Q6_K);
    }
}
