//! F16: IEEE half precision, one element per "block". Multiplied with F32 activations.

use crate::accum::Lanes8;
use crate::formats::{f16_at, f32_at, fp32};

pub(crate) const BLOCK_LEN: usize = 1;
pub(crate) const BLOCK_BYTES: usize = 2;

/// Widening f16 to f32 is exact, so this equals ggml's and gguf-py's values bit for bit.
pub(crate) fn dequantize(src: &[u8], dst: &mut [f32]) {
    for (i, y) in dst.iter_mut().enumerate() {
        *y = f16_at(src, i * BLOCK_BYTES);
    }
}

/// Each weight is widened to f32 (exact) and then accumulated exactly as [`fp32::vec_dot`] does,
/// so F16 and F32 weights holding the same values give the same bits.
pub(crate) fn vec_dot(w: &[u8], act: &[u8]) -> f32 {
    let mut acc = Lanes8::default();
    for (i, (wb, ab)) in w
        .chunks_exact(BLOCK_BYTES)
        .zip(act.chunks_exact(fp32::BLOCK_BYTES))
        .enumerate()
    {
        acc.add(i, f16_at(wb, 0) * f32_at(ab, 0));
    }
    acc.sum()
}

#[cfg(test)]
mod tests {
    use crate::testutil;
    use crate::GgmlType;

    #[test]
    fn dequantize_matches_gguf_py() {
        testutil::assert_dequantize_matches_gguf_py(GgmlType::F16);
    }

    #[test]
    fn vec_dot_matches_f64() {
        testutil::assert_vec_dot_matches_f64(GgmlType::F16);
    }

    #[test]
    fn vec_dot_equals_f32_weights_with_the_same_values() {
        let mut rng = testutil::Rng::new(7);
        let w16 = testutil::random_row(GgmlType::F16, 77, &mut rng);
        let mut w32 = vec![0f32; 77];
        super::dequantize(&w16, &mut w32);
        let w32: Vec<u8> = w32.iter().flat_map(|x| x.to_le_bytes()).collect();
        let act: Vec<u8> = (0..77).flat_map(|_| rng.normal().to_le_bytes()).collect();
        assert_eq!(
            super::vec_dot(&w16, &act).to_bits(),
            crate::formats::fp32::vec_dot(&w32, &act).to_bits()
        );
    }
}
