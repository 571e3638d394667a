//! MXFP4 (OCP microscaling FP4): 32 weights, one shared power-of-two scale, 4-bit E2M1 floats.
//! Multiplied with Q8_0 activations, as llama.cpp's CPU backend does (`vec_dot_type`).
//!
//! Layout (17 bytes, ggml `block_mxfp4`): `e: u8 (E8M0) | qs: [u8; 16]`. Byte `j` holds element
//! `j` in its low nibble and element `j + 16` in its high nibble, as in Q4_0. A nibble indexes
//! [`KVALUES`], the E2M1 values doubled so that they are integers (ggml's `kvalues_mxfp4`), and the
//! scale is halved to make up for it ([`scale`]): element value `scale(e) · KVALUES[nibble]`. The
//! integer values let the dot product sum exactly in `i32`, as for the other 32-element formats.

use crate::accum::Lanes8;
use crate::formats::{dot_i8, q8_0};

pub(crate) const BLOCK_LEN: usize = 32;
pub(crate) const BLOCK_BYTES: usize = 17;

/// Twice the E2M1 value of each nibble (sign in bit 3, then exponent and mantissa): ggml's
/// `kvalues_mxfp4`.
pub(crate) const KVALUES: [i8; 16] = [0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12];

/// Half the E8M0 scale `2^(e - 127)`, i.e. `2^(e - 128)` (ggml's `ggml_e8m0_to_fp32_half`): a
/// normal f32 with biased exponent `e - 1`, except `e` = 0 and 1, which give the subnormals 2^-128
/// and 2^-127. E8M0's NaN (255) is read as 2^127, as ggml reads it.
#[inline(always)]
pub(crate) fn scale(e: u8) -> f32 {
    let bits = if e < 2 {
        0x0020_0000u32 << e
    } else {
        u32::from(e - 1) << 23
    };
    f32::from_bits(bits)
}

/// The block's doubled E2M1 values (-12..=12) in element order.
#[inline(always)]
fn unpack(block: &[u8]) -> [i8; BLOCK_LEN] {
    let qs = &block[1..BLOCK_BYTES];
    std::array::from_fn(|i| {
        let nibble = if i < 16 { qs[i] & 0x0F } else { qs[i - 16] >> 4 };
        KVALUES[usize::from(nibble)]
    })
}

/// As ggml's `dequantize_row_mxfp4`: `f32(k) · scale(e)`, one rounding (only below 2^-126 or above
/// f32::MAX can it be inexact).
pub(crate) fn dequantize(src: &[u8], dst: &mut [f32]) {
    for (block, out) in src.chunks_exact(BLOCK_BYTES).zip(dst.chunks_exact_mut(BLOCK_LEN)) {
        let d = scale(block[0]);
        for (y, k) in out.iter_mut().zip(unpack(block)) {
            *y = f32::from(k) * d;
        }
    }
}

/// MXFP4 · Q8_0. Per block `b`: exact integer `sumi` of the doubled values times the quants, then
/// the term `(d_w · d_a) · f32(sumi)` with `d_w = scale(e)` (ggml's product of the same two
/// factors), added to lane `b % 8` (see [`Lanes8`]).
pub(crate) fn vec_dot(w: &[u8], act: &[u8]) -> f32 {
    let mut acc = Lanes8::default();
    for (b, (wb, ab)) in w
        .chunks_exact(BLOCK_BYTES)
        .zip(act.chunks_exact(q8_0::BLOCK_BYTES))
        .enumerate()
    {
        let sumi = dot_i8(&unpack(wb), q8_0::quants(ab));
        acc.add(b, (scale(wb[0]) * q8_0::scale(ab)) * sumi as f32);
    }
    acc.sum()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil;
    use crate::GgmlType;

    #[test]
    fn dequantize_matches_gguf_py() {
        testutil::assert_dequantize_matches_gguf_py(GgmlType::MXFP4);
    }

    #[test]
    fn vec_dot_matches_f64() {
        testutil::assert_vec_dot_matches_f64(GgmlType::MXFP4);
    }

    #[test]
    fn scale_is_two_to_the_e_minus_128() {
        assert_eq!(scale(0), 2f32.powi(-128));
        assert_eq!(scale(1), 2f32.powi(-127));
        assert_eq!(scale(2), 2f32.powi(-126));
        assert_eq!(scale(127), 0.5);
        assert_eq!(scale(128), 1.0);
        assert_eq!(scale(255), 2f32.powi(127));
        for e in 2..=255u8 {
            assert_eq!(scale(e), 2f32.powi(i32::from(e) - 128), "e = {e}");
        }
    }

    #[test]
    fn nibbles_decode_as_e2m1() {
        // e = 128: scale 1, so each element is twice its E2M1 value: ±{0, 0.5, 1, 1.5, 2, 3, 4, 6}.
        let mut block = [0u8; BLOCK_BYTES];
        block[0] = 128;
        for j in 0..16 {
            block[1 + j] = (j as u8) | ((15 - j as u8) << 4);
        }
        let mut y = [0f32; BLOCK_LEN];
        dequantize(&block, &mut y);
        let e2m1 = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0];
        for j in 0..16 {
            let want = |n: usize| {
                if n < 8 {
                    2.0 * e2m1[n]
                } else {
                    -2.0 * e2m1[n - 8]
                }
            };
            assert_eq!(y[j], want(j), "element {j}");
            assert_eq!(y[j + 16], want(15 - j), "element {}", j + 16);
        }
        // Nibble 8 is E2M1's negative zero, which ggml's table (and so the value) makes +0.
        assert_eq!(y[8].to_bits(), 0f32.to_bits());
    }
}
