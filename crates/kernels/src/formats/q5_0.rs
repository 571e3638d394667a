//! Q5_0: 32 weights, one f16 scale, 5-bit quants offset by 16. Multiplied with Q8_0 activations.
//!
//! Layout (22 bytes, ggml `block_q5_0`): `d: f16 | qh: u32 (LE) | qs: [u8; 16]`. The low 4 bits of
//! element `j` are nibbles as in Q4_0 (low nibble of byte `j`, high nibble of byte `j - 16`); bit `j`
//! of `qh` is its fifth bit. Element value `d · (q - 16)`.

use crate::accum::Lanes8;
use crate::formats::{dot_i8, f16_at, q8_0};

pub(crate) const BLOCK_LEN: usize = 32;
pub(crate) const BLOCK_BYTES: usize = 22;

/// The block's quants (-16..=15) in element order.
#[inline(always)]
fn unpack(block: &[u8]) -> [i8; BLOCK_LEN] {
    let qh = u32::from_le_bytes([block[2], block[3], block[4], block[5]]);
    let qs = &block[6..BLOCK_BYTES];
    std::array::from_fn(|i| {
        let low = if i < 16 { qs[i] & 0x0F } else { qs[i - 16] >> 4 };
        let high = ((qh >> i) & 1) as u8;
        (low | high << 4) as i8 - 16
    })
}

pub(crate) fn dequantize(src: &[u8], dst: &mut [f32]) {
    for (block, out) in src.chunks_exact(BLOCK_BYTES).zip(dst.chunks_exact_mut(BLOCK_LEN)) {
        let d = f16_at(block, 0);
        for (y, q) in out.iter_mut().zip(unpack(block)) {
            *y = d * f32::from(q);
        }
    }
}

/// Q5_0 · Q8_0. Per block `b`: exact integer `sumi`, then the term `(d_w · d_a) · f32(sumi)`, added to
/// lane `b % 8` (see [`Lanes8`]).
pub(crate) fn vec_dot(w: &[u8], act: &[u8]) -> f32 {
    let mut acc = Lanes8::default();
    for (b, (wb, ab)) in w
        .chunks_exact(BLOCK_BYTES)
        .zip(act.chunks_exact(q8_0::BLOCK_BYTES))
        .enumerate()
    {
        let sumi = dot_i8(&unpack(wb), q8_0::quants(ab));
        acc.add(b, (f16_at(wb, 0) * q8_0::scale(ab)) * sumi as f32);
    }
    acc.sum()
}

#[cfg(test)]
mod tests {
    use crate::testutil;
    use crate::GgmlType;

    #[test]
    fn dequantize_matches_gguf_py() {
        testutil::assert_dequantize_matches_gguf_py(GgmlType::Q5_0);
    }

    #[test]
    fn vec_dot_matches_f64() {
        testutil::assert_vec_dot_matches_f64(GgmlType::Q5_0);
    }
}
