//! BF16: the top 16 bits of an f32, one element per "block". Multiplied with F32 activations.

use crate::accum::Lanes8;
use crate::formats::{f32_at, fp32};

pub(crate) const BLOCK_LEN: usize = 1;
pub(crate) const BLOCK_BYTES: usize = 2;

/// The f32 whose high half is the bf16 at byte offset `at` (exact, as ggml and gguf-py widen it).
#[inline(always)]
pub(crate) fn bf16_at(b: &[u8], at: usize) -> f32 {
    f32::from_bits(u32::from(u16::from_le_bytes([b[at], b[at + 1]])) << 16)
}

pub(crate) fn dequantize(src: &[u8], dst: &mut [f32]) {
    for (i, y) in dst.iter_mut().enumerate() {
        *y = bf16_at(src, i * BLOCK_BYTES);
    }
}

/// Widen (exact), then accumulate exactly as [`fp32::vec_dot`] does.
pub(crate) fn vec_dot(w: &[u8], act: &[u8]) -> f32 {
    let mut acc = Lanes8::default();
    for (i, (wb, ab)) in w
        .chunks_exact(BLOCK_BYTES)
        .zip(act.chunks_exact(fp32::BLOCK_BYTES))
        .enumerate()
    {
        acc.add(i, bf16_at(wb, 0) * f32_at(ab, 0));
    }
    acc.sum()
}

#[cfg(test)]
mod tests {
    use crate::testutil;
    use crate::GgmlType;

    #[test]
    fn dequantize_matches_gguf_py() {
        testutil::assert_dequantize_matches_gguf_py(GgmlType::BF16);
    }

    #[test]
    fn vec_dot_matches_f64() {
        testutil::assert_vec_dot_matches_f64(GgmlType::BF16);
    }
}
