//! F32: plain little-endian f32, one element per "block". Also the activation format for float weights.

use crate::accum::Lanes8;
use crate::formats::f32_at;

pub(crate) const BLOCK_LEN: usize = 1;
pub(crate) const BLOCK_BYTES: usize = 4;

pub(crate) fn dequantize(src: &[u8], dst: &mut [f32]) {
    for (i, y) in dst.iter_mut().enumerate() {
        *y = f32_at(src, i * BLOCK_BYTES);
    }
}

/// Activations in F32 are the values themselves, stored little-endian.
pub(crate) fn quantize(src: &[f32], dst: &mut [u8]) {
    for (x, out) in src.iter().zip(dst.chunks_exact_mut(BLOCK_BYTES)) {
        out.copy_from_slice(&x.to_le_bytes());
    }
}

/// `Σ w_i · a_i`: product `i` goes to lane `i % 8` (see [`Lanes8`]), multiply and add kept separate.
pub(crate) fn vec_dot(w: &[u8], act: &[u8]) -> f32 {
    let mut acc = Lanes8::default();
    for (i, (wb, ab)) in w
        .chunks_exact(BLOCK_BYTES)
        .zip(act.chunks_exact(BLOCK_BYTES))
        .enumerate()
    {
        acc.add(i, f32_at(wb, 0) * f32_at(ab, 0));
    }
    acc.sum()
}

#[cfg(test)]
mod tests {
    use crate::testutil;
    use crate::GgmlType;

    #[test]
    fn dequantize_matches_gguf_py() {
        testutil::assert_dequantize_matches_gguf_py(GgmlType::F32);
    }

    #[test]
    fn vec_dot_matches_f64() {
        testutil::assert_vec_dot_matches_f64(GgmlType::F32);
    }

    #[test]
    fn vec_dot_uses_the_documented_lane_order() {
        // Terms chosen so that any other association gives a different f32: the big terms cancel only
        // when the lanes meet in the documented tree.
        let w: Vec<f32> = vec![1e8, 1.0, 3.0, 1.0, -1e8, 1.0, 5.0, 1.0, 0.5];
        let a = vec![1.0f32; 9];
        let bytes = |v: &[f32]| v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>();
        let lanes = [1e8 + 0.5, 1.0, 3.0, 1.0, -1e8, 1.0, 5.0, 1.0f32];
        let tree = ((lanes[0] + lanes[4]) + (lanes[2] + lanes[6])) + ((lanes[1] + lanes[5]) + (lanes[3] + lanes[7]));
        assert_eq!(super::vec_dot(&bytes(&w), &bytes(&a)).to_bits(), tree.to_bits());
    }
}
