//! Q4_1: 32 weights, an f16 scale and an f16 offset, 4-bit unsigned quants. Multiplied with Q8_1
//! activations, whose block sum `s` carries the offset.
//!
//! Layout (20 bytes, ggml `block_q4_1`): `d: f16 | m: f16 | qs: [u8; 16]`. Byte `j` holds element `j`
//! in its low nibble and element `j + 16` in its high nibble; element value `d · nibble + m`.

use crate::accum::Lanes8;
use crate::formats::{dot_i8, f16_at, q8_1};

pub(crate) const BLOCK_LEN: usize = 32;
pub(crate) const BLOCK_BYTES: usize = 20;

/// The block's quants (0..=15) in element order.
#[inline(always)]
fn unpack(block: &[u8]) -> [i8; BLOCK_LEN] {
    let qs = &block[4..BLOCK_BYTES];
    std::array::from_fn(|i| (if i < 16 { qs[i] & 0x0F } else { qs[i - 16] >> 4 }) as i8)
}

pub(crate) fn dequantize(src: &[u8], dst: &mut [f32]) {
    for (block, out) in src.chunks_exact(BLOCK_BYTES).zip(dst.chunks_exact_mut(BLOCK_LEN)) {
        let (d, m) = (f16_at(block, 0), f16_at(block, 2));
        for (y, q) in out.iter_mut().zip(unpack(block)) {
            *y = d * f32::from(q) + m;
        }
    }
}

/// Q4_1 · Q8_1. Per block `b`: exact integer `sumi`, then the term
/// `(d_w · d_a) · f32(sumi) + m_w · s_a`, added to lane `b % 8` (see [`Lanes8`]).
pub(crate) fn vec_dot(w: &[u8], act: &[u8]) -> f32 {
    let mut acc = Lanes8::default();
    for (b, (wb, ab)) in w
        .chunks_exact(BLOCK_BYTES)
        .zip(act.chunks_exact(q8_1::BLOCK_BYTES))
        .enumerate()
    {
        let sumi = dot_i8(&unpack(wb), q8_1::quants(ab));
        let scaled = (f16_at(wb, 0) * q8_1::scale(ab)) * sumi as f32;
        acc.add(b, scaled + f16_at(wb, 2) * q8_1::sum(ab));
    }
    acc.sum()
}

#[cfg(test)]
mod tests {
    use crate::testutil;
    use crate::GgmlType;

    #[test]
    fn dequantize_matches_gguf_py() {
        testutil::assert_dequantize_matches_gguf_py(GgmlType::Q4_1);
    }

    #[test]
    fn vec_dot_matches_f64() {
        testutil::assert_vec_dot_matches_f64(GgmlType::Q4_1);
    }
}
