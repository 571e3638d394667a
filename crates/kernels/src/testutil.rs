//! Shared test machinery: the gguf-py fixtures, random rows, and the f64 reference dot product.

use crate::formats::{f16_at, f16_bytes};
use crate::splitmix::SplitMix64;
use crate::{dequantize_row, quantize_row, vec_dot, GgmlType};

/// The project's generator with the draws tests need, so that test data never varies.
pub(crate) struct Rng(SplitMix64);

impl Rng {
    pub(crate) fn new(seed: u64) -> Self {
        Rng(SplitMix64(seed))
    }

    pub(crate) fn next_u64(&mut self) -> u64 {
        self.0.next_u64()
    }

    /// Uniform in [0, 1).
    pub(crate) fn uniform(&mut self) -> f32 {
        self.0.next_f32()
    }

    /// Roughly standard normal (Irwin–Hall with 4 terms, rescaled); good enough for test data.
    pub(crate) fn normal(&mut self) -> f32 {
        let s: f32 = (0..4).map(|_| self.uniform()).sum();
        (s - 2.0) * 3f32.sqrt()
    }

    /// A sane scale: magnitude 1e-3 .. 1e-1 (log-uniform), random sign.
    fn scale(&mut self) -> f32 {
        let mag = (1e-3f32.ln() + self.uniform() * (1e-1f32.ln() - 1e-3f32.ln())).exp();
        if self.next_u64() & 1 == 0 {
            mag
        } else {
            -mag
        }
    }
}

fn fixture(name: &str) -> Vec<u8> {
    let path = format!("{}/../../tests/fixtures/quant/{name}", env!("CARGO_MANIFEST_DIR"));
    std::fs::read(&path).unwrap_or_else(|e| panic!("{path}: {e} (regenerate with tools/gen_quant_vectors.py)"))
}

fn f32s(bytes: &[u8]) -> Vec<f32> {
    bytes
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect()
}

/// `dequantize_row` on `<TYPE>.bin` gives exactly the bits gguf-py wrote to `<TYPE>.f32`.
pub(crate) fn assert_dequantize_matches_gguf_py(ty: GgmlType) {
    let src = fixture(&format!("{}.bin", ty.name()));
    let expected = f32s(&fixture(&format!("{}.f32", ty.name())));
    let mut got = vec![0f32; expected.len()];
    dequantize_row(ty, &src, &mut got).expect("fixture sizes");
    for (i, (g, e)) in got.iter().zip(&expected).enumerate() {
        assert_eq!(g.to_bits(), e.to_bits(), "{ty} element {i}: got {g:e}, gguf-py {e:e}");
    }
}

/// `quantize_row` on `<TYPE>.quantize.f32` gives exactly the bytes gguf-py wrote to `<TYPE>.quantize.bin`.
pub(crate) fn assert_quantize_matches_gguf_py(ty: GgmlType) {
    let x = f32s(&fixture(&format!("{}.quantize.f32", ty.name())));
    let expected = fixture(&format!("{}.quantize.bin", ty.name()));
    let mut got = vec![0u8; expected.len()];
    quantize_row(ty, &x, &mut got).expect("fixture sizes");
    assert_eq!(got, expected, "{ty} quantisation differs from gguf-py");
}

/// Byte offsets of the f16 scale fields of each quantised format (`ggml-common.h`).
pub(crate) fn f16_scale_fields(ty: GgmlType) -> &'static [usize] {
    match ty {
        GgmlType::Q4_0 | GgmlType::Q5_0 | GgmlType::Q8_0 => &[0],
        GgmlType::Q4_1 | GgmlType::Q5_1 | GgmlType::Q8_1 | GgmlType::Q4_K | GgmlType::Q5_K => &[0, 2],
        GgmlType::Q2_K => &[80, 82],
        GgmlType::Q3_K => &[108],
        GgmlType::Q6_K => &[208],
        GgmlType::F32 | GgmlType::F16 | GgmlType::BF16 | GgmlType::Q8_K | GgmlType::MXFP4 | GgmlType::I32 => &[],
    }
}

/// `n` random elements of `ty`: random bits for the quants, sane values for the scales.
pub(crate) fn random_row(ty: GgmlType, n: usize, rng: &mut Rng) -> Vec<u8> {
    match ty {
        GgmlType::F32 => (0..n).flat_map(|_| rng.normal().to_le_bytes()).collect(),
        GgmlType::F16 => (0..n).flat_map(|_| f16_bytes(rng.normal())).collect(),
        GgmlType::BF16 => (0..n)
            .flat_map(|_| ((rng.normal().to_bits() >> 16) as u16).to_le_bytes())
            .collect(),
        _ => {
            let mut bytes: Vec<u8> = (0..ty.row_bytes(n).expect("whole blocks"))
                .map(|_| rng.next_u64() as u8)
                .collect();
            for block in bytes.chunks_exact_mut(ty.block_bytes()) {
                for &at in f16_scale_fields(ty) {
                    block[at..at + 2].copy_from_slice(&f16_bytes(rng.scale()));
                }
                if ty == GgmlType::Q8_K {
                    block[..4].copy_from_slice(&rng.scale().to_le_bytes());
                }
                if ty == GgmlType::MXFP4 {
                    // Its scale is the exponent byte: 2^-10 .. 2^-4, like the others' 1e-3 .. 1e-1.
                    block[0] = 118 + (rng.next_u64() % 7) as u8;
                }
            }
            bytes
        }
    }
}

/// `vec_dot` agrees with an f64 dot product of the dequantised weight and activation rows, up to
/// f32 rounding. The bound is relative to `max|w| · Σ|a|`, which bounds every intermediate term
/// (including the K-quants' `d·scale·q` and `dmin·min` parts, which can cancel).
pub(crate) fn assert_vec_dot_matches_f64(ty: GgmlType) {
    let act_ty = ty.act_type();
    let mut rng = Rng::new(0x5EED ^ u64::from(ty.id()));
    // Block counts below and above the 8 accumulation lanes, and not multiples of them.
    for blocks in [1, 3, 8, 13, 40] {
        let n = blocks * act_ty.block_len().max(ty.block_len());
        let w = random_row(ty, n, &mut rng);
        let mut x: Vec<f32> = (0..n).map(|_| rng.normal()).collect();
        x[n / 2] *= 30.0; // an outlier, as real activations have
        let mut act = vec![0u8; act_ty.row_bytes(n).expect("whole blocks")];
        quantize_row(act_ty, &x, &mut act).expect("quantize");

        let got = vec_dot(ty, n, &w, &act);

        let (mut wf, mut af) = (vec![0f32; n], vec![0f32; n]);
        dequantize_row(ty, &w, &mut wf).expect("dequantize weights");
        dequantize_row(act_ty, &act, &mut af).expect("dequantize activations");
        let reference: f64 = wf.iter().zip(&af).map(|(&w, &a)| f64::from(w) * f64::from(a)).sum();
        let w_max = wf.iter().fold(0f64, |m, &w| m.max(f64::from(w).abs()));
        let a_sum: f64 = af.iter().map(|&a| f64::from(a).abs()).sum();
        let mut tol = 1e-5 * w_max * a_sum + 1e-30;
        if act_ty == GgmlType::Q8_1 && ty != GgmlType::Q8_1 {
            // Q4_1/Q5_1 multiply their offset m by Q8_1's precomputed sum s = f16(d · Σq), which differs
            // from the dequantised activations' sum by f16 roundings of d and of s.
            let blocks = w
                .chunks_exact(ty.block_bytes())
                .zip(act.chunks_exact(act_ty.block_bytes()));
            tol += blocks
                .map(|(wb, ab)| f64::from(f16_at(wb, 2) * f16_at(ab, 2)).abs() * 2f64.powi(-9))
                .sum::<f64>();
        }
        let err = (f64::from(got) - reference).abs();
        assert!(
            err <= tol,
            "{ty} · {act_ty}, {n} elements: got {got}, f64 {reference}, error {err:e} > {tol:e}"
        );
    }
}

/// Quantise → dequantise of activations stays within half a quantisation step (plus, for Q8_0/Q8_1,
/// the f16 rounding of the stored scale), and an all-zero block comes back as zeros.
pub(crate) fn assert_quantize_round_trip(act_ty: GgmlType) {
    let mut rng = Rng::new(11);
    let n = 4 * 256;
    let mut x: Vec<f32> = (0..n).map(|_| rng.normal() * 3.0).collect();
    x[300] = -80.0;
    x[256..256 + act_ty.block_len()].fill(0.0);
    let mut q = vec![0u8; act_ty.row_bytes(n).expect("whole blocks")];
    quantize_row(act_ty, &x, &mut q).expect("quantize");
    let mut y = vec![0f32; n];
    dequantize_row(act_ty, &q, &mut y).expect("dequantize");
    // The stored f16 scale may be off by 2^-11 relative, times |q| <= 127: 127 · 2^-11 < 0.07 steps.
    let half_step = if act_ty == GgmlType::Q8_K { 0.5 + 1e-5 } else { 0.57 };
    for (xb, yb) in x
        .chunks_exact(act_ty.block_len())
        .zip(y.chunks_exact(act_ty.block_len()))
    {
        let step = xb.iter().fold(0f32, |m, v| m.max(v.abs())) / 127.0;
        for (&xv, &yv) in xb.iter().zip(yb) {
            assert!(
                (xv - yv).abs() <= half_step * step,
                "{act_ty}: {xv} came back as {yv} (step {step})"
            );
        }
    }
    assert!(y[256..256 + act_ty.block_len()].iter().all(|&v| v == 0.0));
}
