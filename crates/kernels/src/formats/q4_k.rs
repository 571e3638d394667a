//! Q4_K: 256 weights in 8 sub-blocks of 32, 4-bit quants, a 6-bit scale and a 6-bit min per
//! sub-block, and f16 super-scales `d` and `dmin`. Multiplied with Q8_K activations.
//!
//! Layout (144 bytes, ggml `block_q4_K`): `d: f16 | dmin: f16 | scales: [u8; 12] | qs: [u8; 128]`.
//! Element `e` of sub-block `s = e / 32` (`l = e % 32`) is the low nibble of `qs[32(s / 2) + l]` for
//! even `s` and its high nibble for odd `s`. The 12 scale bytes pack 8 scales and 8 mins of 6 bits
//! (see [`scale_min`]). Element value `(d · scale) · q - dmin · min`.

use crate::accum::Lanes8;
use crate::formats::{dot_i8, f16_at, q8_k, QK_K};

pub(crate) const BLOCK_LEN: usize = QK_K;
pub(crate) const BLOCK_BYTES: usize = 4 + 12 + QK_K / 2;

const SCALES: usize = 4;
const QS: usize = SCALES + 12;

/// Scale and min of sub-block `s` from the 12 packed bytes shared by Q4_K and Q5_K (ggml's
/// `get_scale_min_k4`): sub-blocks 0..4 keep theirs in the low 6 bits of bytes `s` and `s + 4`;
/// sub-blocks 4..8 take their low 4 bits from the nibbles of byte `s + 4` and their top 2 bits from the
/// spare top bits of bytes `s - 4` (scale) and `s` (min).
#[inline(always)]
pub(crate) fn scale_min(scales: &[u8], s: usize) -> (u8, u8) {
    if s < 4 {
        (scales[s] & 63, scales[s + 4] & 63)
    } else {
        let scale = (scales[s + 4] & 0x0F) | ((scales[s - 4] >> 6) << 4);
        let min = (scales[s + 4] >> 4) | ((scales[s] >> 6) << 4);
        (scale, min)
    }
}

/// The block's quants (0..=15) in element order.
#[inline(always)]
fn unpack(block: &[u8]) -> [i8; QK_K] {
    std::array::from_fn(|e| {
        let (s, l) = (e / 32, e % 32);
        let byte = block[QS + 32 * (s / 2) + l];
        (if s % 2 == 0 { byte & 0x0F } else { byte >> 4 }) as i8
    })
}

pub(crate) fn dequantize(src: &[u8], dst: &mut [f32]) {
    for (block, out) in src.chunks_exact(BLOCK_BYTES).zip(dst.chunks_exact_mut(BLOCK_LEN)) {
        let (d, dmin) = (f16_at(block, 0), f16_at(block, 2));
        let q = unpack(block);
        for (s, (ys, qs)) in out.chunks_exact_mut(32).zip(q.chunks_exact(32)).enumerate() {
            let (scale, min) = scale_min(&block[SCALES..QS], s);
            let (dl, ml) = (d * f32::from(scale), dmin * f32::from(min));
            for (y, &q) in ys.iter_mut().zip(qs) {
                *y = dl * f32::from(q) - ml;
            }
        }
    }
}

/// Q4_K · Q8_K. Per block `b`, two exact integers: `sumi = Σ_s scale_s · (q · a)_s` and
/// `summ = Σ_s min_s · (bsums_2s + bsums_2s+1)`; then the term
/// `(d_w · d_a) · f32(sumi) - (dmin_w · d_a) · f32(summ)`, added to lane `b % 8` (see [`Lanes8`]).
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
            let (scale, min) = scale_min(&wb[SCALES..QS], s);
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
        testutil::assert_dequantize_matches_gguf_py(GgmlType::Q4_K);
    }

    #[test]
    fn vec_dot_matches_f64() {
        testutil::assert_vec_dot_matches_f64(GgmlType::Q4_K);
    }

    #[test]
    fn scale_min_unpacks_all_six_bits() {
        // Scale s = 10 + s and min s = 40 + s, packed the way ggml's quantize_row_q4_K_ref packs them.
        let (sc, mn): (Vec<u8>, Vec<u8>) = (0..8).map(|s| (10 + s, 40 + s)).unzip();
        let mut packed = [0u8; 12];
        for s in 0..8 {
            if s < 4 {
                packed[s] = sc[s];
                packed[s + 4] = mn[s];
            } else {
                packed[s + 4] = (sc[s] & 0x0F) | ((mn[s] & 0x0F) << 4);
                packed[s - 4] |= (sc[s] >> 4) << 6;
                packed[s] |= (mn[s] >> 4) << 6;
            }
        }
        for s in 0..8 {
            assert_eq!(super::scale_min(&packed, s), (sc[s], mn[s]), "sub-block {s}");
        }
    }
}
