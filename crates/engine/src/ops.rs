//! Element-wise and per-row operations of the forward pass. Each has one fixed order of floating-point
//! operations, so its result depends only on its inputs (see the determinism contract in DESIGN.md).

use crate::config::Yarn;

/// RMS norm of each `w.len()`-long row of `x`, in place: x · w / sqrt(mean(x²) + eps).
/// The sum of squares is accumulated in f64, sequentially, as llama.cpp does.
pub fn rms_norm(x: &mut [f32], w: &[f32], eps: f32) {
    for row in x.chunks_exact_mut(w.len()) {
        let scale = rms_scale(row, eps);
        for (v, &g) in row.iter_mut().zip(w) {
            *v = *v * scale * g;
        }
    }
}

/// RMS norm without a weight of each `len`-long row of `x`, in place (Llama 4's L2 q/k norm, which
/// llama.cpp computes as `ggml_rms_norm`): x / sqrt(mean(x²) + eps).
pub fn rms_norm_unweighted(x: &mut [f32], len: usize, eps: f32) {
    for row in x.chunks_exact_mut(len) {
        let scale = rms_scale(row, eps);
        row.iter_mut().for_each(|v| *v *= scale);
    }
}

/// 1 / sqrt(mean(row²) + eps), the sum of squares in f64.
fn rms_scale(row: &[f32], eps: f32) -> f32 {
    let sum: f64 = row.iter().map(|&v| (v as f64) * (v as f64)).sum();
    let mean = (sum / row.len() as f64) as f32;
    1.0 / (mean + eps).sqrt()
}

/// RMS norm of `x` into `out` (the input is kept for the residual).
pub fn rms_norm_into(x: &[f32], w: &[f32], eps: f32, out: &mut Vec<f32>) {
    out.clear();
    out.extend_from_slice(x);
    rms_norm(out, w, eps);
}

pub fn add_bias(x: &mut [f32], b: &[f32]) {
    for row in x.chunks_exact_mut(b.len()) {
        for (v, &bb) in row.iter_mut().zip(b) {
            *v += bb;
        }
    }
}

pub fn add(x: &mut [f32], y: &[f32]) {
    for (a, &b) in x.iter_mut().zip(y) {
        *a += b;
    }
}

// Transcendental functions come from the pure-Rust `libm` crate, never the platform's libm: glibc,
// musl, Apple's libm and others may round `exp`, `pow`, `sin` and `cos` differently in the last place,
// and a cluster of x86 and ARM, Linux and macOS nodes must compute the same bits (docs/determinism.md).
// `exp` over many values at once is the kernels' `exp_in_place`, the same function eight lanes at a time.

/// e^x, the same bits on every platform.
pub use titan_kernels::{exp, silu};

pub fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + exp(-x))
}

/// ln(1 + eˣ), without overflow for large x (where it is x to f32 precision).
pub fn softplus(x: f32) -> f32 {
    if x > 20.0 {
        x
    } else {
        libm::log1pf(exp(x))
    }
}

/// Softmax in place, max-subtracted, sum accumulated sequentially in f32.
pub fn softmax(x: &mut [f32]) {
    let max = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    x.iter_mut().for_each(|v| *v -= max);
    titan_kernels::exp_in_place(x);
    let sum: f32 = x.iter().sum();
    let inv = 1.0 / sum;
    for v in x.iter_mut() {
        *v *= inv;
    }
}

/// Rotary position embedding tables for one position: cos and sin of `pos · base^(-2i/dims)` for each
/// pair `i` (`dims / 2` of each). Computed in f64 and rounded once, so every position gets the most
/// accurate angle f32 can hold.
///
/// `freq_factors` (the file's `rope_freqs`, Llama 3/4's frequency scaling) divide each pair's angle, as
/// ggml's RoPE divides it.
pub fn rope_angles(
    pos: usize,
    dims: usize,
    base: f32,
    (yarn, freq_factors): (Option<&Yarn>, Option<&[f32]>),
    cos: &mut [f32],
    sin: &mut [f32],
) {
    // YaRN blends each pair's angle from extrapolated (the plain angle) to interpolated (divided by the
    // factor) across the correction range, and scales cos and sin (see `Yarn`).
    let blend = yarn.map(|y| (y.factor as f64, y.corr_dims(dims, base), y.rope_mscale() as f64));
    for (i, (c, s)) in cos.iter_mut().zip(sin.iter_mut()).enumerate() {
        let mut theta = pos as f64 * libm::pow(base as f64, -2.0 * i as f64 / dims as f64);
        if let Some(ff) = freq_factors {
            theta /= ff[i] as f64;
        }
        let mut m = 1.0;
        if let Some((factor, (low, high), mscale)) = blend {
            let ramp = 1.0 - ((i as f64 - low as f64) / (high - low).max(0.001) as f64).clamp(0.0, 1.0);
            theta = theta / factor * (1.0 - ramp) + theta * ramp;
            m = mscale;
        }
        *c = (libm::cos(theta) * m) as f32;
        *s = (libm::sin(theta) * m) as f32;
    }
}

/// Rotate one head in place. `halves`: pairs (i, i + dims/2) (NeoX / rotate_half); else adjacent pairs.
pub fn rope_head(head: &mut [f32], cos: &[f32], sin: &[f32], halves: bool) {
    let half = cos.len();
    for i in 0..half {
        let (a, b) = if halves { (i, i + half) } else { (2 * i, 2 * i + 1) };
        let (x0, x1) = (head[a], head[b]);
        head[a] = x0 * cos[i] - x1 * sin[i];
        head[b] = x0 * sin[i] + x1 * cos[i];
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rms_norm_matches_definition() {
        let mut x = vec![1.0, 2.0, 3.0, 4.0];
        rms_norm(&mut x, &[1.0, 1.0, 2.0, 1.0], 0.0);
        let r = (30.0f64 / 4.0).sqrt() as f32;
        for (a, b) in x.iter().zip([1.0 / r, 2.0 / r, 6.0 / r, 4.0 / r]) {
            assert!((a - b).abs() < 1e-6);
        }
    }

    #[test]
    fn softmax_sums_to_one_and_survives_large_logits() {
        let mut x = vec![1000.0, 1001.0, 999.0];
        softmax(&mut x);
        assert!((x.iter().sum::<f32>() - 1.0).abs() < 1e-6);
        assert!(x[1] > x[0] && x[0] > x[2]);
    }

    #[test]
    fn rope_rotation_preserves_norm_and_pairs() {
        let (mut c, mut s) = ([0.0; 2], [0.0; 2]);
        rope_angles(7, 4, 10000.0, (None, None), &mut c, &mut s);
        let mut h = vec![1.0, 0.0, 0.0, 0.0];
        rope_head(&mut h, &c, &s, true);
        // halves: dim 0 pairs with dim 2
        assert!((h[0] - 7f32.cos()).abs() < 1e-6 && (h[2] - 7f32.sin()).abs() < 1e-6 && h[1] == 0.0);
        let mut h = vec![1.0, 0.0, 0.0, 0.0];
        rope_head(&mut h, &c, &s, false);
        assert!((h[0] - 7f32.cos()).abs() < 1e-6 && (h[1] - 7f32.sin()).abs() < 1e-6 && h[2] == 0.0);
    }

    /// The file's frequency factors divide each pair's angle: pair 1 of 4 dims turns at 100^-1 per position.
    #[test]
    fn rope_freq_factors_divide_the_angles() {
        let (mut c, mut s) = ([0.0; 2], [0.0; 2]);
        rope_angles(8, 4, 10000.0, (None, Some(&[2.0, 16.0])), &mut c, &mut s);
        assert_eq!((c[0], s[0]), (4f64.cos() as f32, 4f64.sin() as f32));
        assert!((c[1] - 0.005f32.cos()).abs() < 1e-7 && (s[1] - 0.005f32.sin()).abs() < 1e-9);
    }

    /// Llama 4's L2 norm is the RMS norm with a weight of ones.
    #[test]
    fn unweighted_rms_norm_is_the_norm_with_unit_weights() {
        let mut x: Vec<f32> = (0..12).map(|i| (i as f32 * 0.7).sin() * 3.0).collect();
        let mut y = x.clone();
        rms_norm(&mut x, &[1.0; 4], 1e-5);
        rms_norm_unweighted(&mut y, 4, 1e-5);
        assert_eq!(x, y);
    }

    #[test]
    fn transcendentals_match_known_values() {
        // Reference values: the results rounded to f32 / f64 (from Python's math module). The portable
        // functions must be within an ULP of them; being pure Rust, they are then the same bits everywhere.
        let ulps32 = |a: f32, b: f32| (a.to_bits() as i64 - b.to_bits() as i64).abs();
        for (x, want) in [
            (0.0f32, 1.0f32),
            (1.0, 2.7182817),
            (-1.0, 0.36787945),
            (10.0, 22026.465),
            (-20.0, 2.0611537e-9),
            (0.5, 1.6487212),
        ] {
            assert!(ulps32(exp(x), want) <= 1, "exp({x}) = {} want {want}", exp(x));
        }
        assert_eq!(exp(-200.0), 0.0);
        assert!(exp(100.0).is_infinite());
        assert!((silu(1.0) - 0.7310586).abs() < 1e-7 && (sigmoid(0.0) - 0.5).abs() == 0.0);
        let ulps64 = |a: f64, b: f64| (a.to_bits() as i64 - b.to_bits() as i64).abs();
        assert!(ulps64(libm::pow(10000.0, -0.5), 0.01) <= 1);
        assert!(ulps64(libm::pow(1e6, -2.0 * 3.0 / 128.0), 0.5232991146814947) <= 1);
        assert!(ulps64(libm::sin(7.0), 0.6569865987187891) <= 1);
        assert!(ulps64(libm::cos(7.0), 0.7539022543433046) <= 1);
        assert!(ulps64(libm::sin(4095.0), -0.9978212103769744) <= 1);
    }
}
