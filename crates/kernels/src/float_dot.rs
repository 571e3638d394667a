//! The f32 loops of attention over a cache: a query's dot products with the cached keys, and the
//! weighted sum of the cached values; and the delta rule's step over a linear-attention state's rows.
//! Every dot product accumulates in [`Lanes8`] (element `i` into lane `i % 8`, a multiply then an add,
//! the lanes reduced in its tree), which an 8-wide register computes as it stands, so the SIMD paths
//! give the scalar bits; the weighted sum adds each row in order, element by element, which any vector
//! width computes alike.

use crate::accum::Lanes8;
use crate::simd::{self, Isa};

/// `Σ a[i] · b[i]` over the shorter length, in [`Lanes8`]'s order, on the current ISA.
pub fn dot_f32(a: &[f32], b: &[f32]) -> f32 {
    simd::float_kernel(simd::isa()).dot(a, b)
}

/// `out[t] = dot_f32(q, rows[t · stride ..][.. q.len()]) · scale` for every `t` of `out`, on the
/// current ISA.
///
/// # Panics
///
/// If `rows` is too short for `out.len()` rows of `q.len()` elements `stride` apart.
pub fn dot_rows(q: &[f32], rows: &[f32], stride: usize, scale: f32, out: &mut [f32]) {
    dot_rows_on(simd::isa(), q, rows, stride, scale, out)
}

/// [`dot_rows`] on a given ISA (tests compare them without touching the global one).
pub(crate) fn dot_rows_on(isa: Isa, q: &[f32], rows: &[f32], stride: usize, scale: f32, out: &mut [f32]) {
    check_rows("dot_rows", q.len(), rows.len(), stride, out.len());
    simd::float_kernel(isa).dot_rows(q, rows, stride, scale, out);
}

/// `out[j] += Σ_t w[t] · rows[t · stride + j]`, adding row after row (`t` ascending), on the current
/// ISA.
///
/// # Panics
///
/// If `rows` is too short for `w.len()` rows of `out.len()` elements `stride` apart.
pub fn add_weighted_rows(out: &mut [f32], w: &[f32], rows: &[f32], stride: usize) {
    add_weighted_rows_on(simd::isa(), out, w, rows, stride)
}

/// [`add_weighted_rows`] on a given ISA.
pub(crate) fn add_weighted_rows_on(isa: Isa, out: &mut [f32], w: &[f32], rows: &[f32], stride: usize) {
    check_rows("add_weighted_rows", out.len(), rows.len(), stride, w.len());
    simd::float_kernel(isa).add_weighted_rows(out, w, rows, stride);
}

/// One token of the delta rule for one value head: the state's decay, the write strength β, the key,
/// query and value, and the output scale.
#[derive(Clone, Copy, Debug)]
pub struct DeltaStep<'a> {
    pub decay: f32,
    pub beta: f32,
    pub k: &'a [f32],
    pub q: &'a [f32],
    /// The value's elements for the rows given, in order.
    pub v: &'a [f32],
    pub scale: f32,
}

/// For each row `m_j` of `rows` (`k.len()` elements each): `m_j ← decay · m_j`, `δ = (v_j − m_j · k) · β`,
/// `m_j ← m_j + k · δ` and `out[j] = (q · m_j) · scale`, on the current ISA — the same bits as those
/// steps one at a time with [`dot_f32`].
pub fn delta_rule_rows(rows: &mut [f32], step: &DeltaStep, out: &mut [f32]) {
    delta_rule_rows_on(simd::isa(), rows, step, out)
}

/// [`delta_rule_rows`] on a given ISA.
pub(crate) fn delta_rule_rows_on(isa: Isa, rows: &mut [f32], step: &DeltaStep, out: &mut [f32]) {
    simd::float_kernel(isa).delta_rule_rows(rows, step, out)
}

/// The scalar twin of [`delta_rule_rows`]: each step over the whole row in turn.
pub(crate) fn delta_rule_rows_scalar(rows: &mut [f32], step: &DeltaStep, out: &mut [f32]) {
    let DeltaStep {
        decay,
        beta,
        k,
        q,
        v,
        scale,
    } = *step;
    assert_eq!(q.len(), k.len(), "delta_rule_rows: q and k differ in length");
    for ((m, &vj), o) in rows.chunks_exact_mut(k.len()).zip(v).zip(out.iter_mut()) {
        for x in m.iter_mut() {
            *x *= decay;
        }
        let delta = (vj - dot_scalar(m, k)) * beta;
        add_scaled_scalar(m, delta, k);
        *o = dot_scalar(q, m) * scale;
    }
}

fn check_rows(what: &str, len: usize, have: usize, stride: usize, n: usize) {
    let need = if n == 0 { 0 } else { (n - 1) * stride + len };
    assert!(
        have >= need,
        "{what}: {n} rows of {len} elements {stride} apart need {need} elements, got {have}"
    );
}

/// The scalar twin of every SIMD dot product, written eight lanes at a time so that the compiler
/// vectorises it where it is the path that runs (aarch64).
pub(crate) fn dot_scalar(a: &[f32], b: &[f32]) -> f32 {
    let n = a.len().min(b.len());
    let (a, b) = (&a[..n], &b[..n]);
    let mut l = [0f32; 8];
    let (ac, bc) = (a.chunks_exact(8), b.chunks_exact(8));
    let (ar, br) = (ac.remainder(), bc.remainder());
    for (x, y) in ac.zip(bc) {
        for i in 0..8 {
            l[i] += x[i] * y[i];
        }
    }
    for (i, (x, y)) in ar.iter().zip(br).enumerate() {
        l[i] += x * y;
    }
    Lanes8(l).sum()
}

/// The scalar twin of [`dot_rows`]: each row's dot product in turn.
pub(crate) fn dot_rows_scalar(q: &[f32], rows: &[f32], stride: usize, scale: f32, out: &mut [f32]) {
    for (t, o) in out.iter_mut().enumerate() {
        *o = dot_scalar(q, &rows[t * stride..][..q.len()]) * scale;
    }
}

/// The scalar twin of [`add_weighted_rows`]: row after row, each element a multiply then an add.
pub(crate) fn add_weighted_rows_scalar(out: &mut [f32], w: &[f32], rows: &[f32], stride: usize) {
    for (t, &p) in w.iter().enumerate() {
        add_scaled_scalar(out, p, &rows[t * stride..][..out.len()]);
    }
}

/// The scalar twin of every SIMD `out[j] += p · row[j]` (over the shorter length).
pub(crate) fn add_scaled_scalar(out: &mut [f32], p: f32, row: &[f32]) {
    for (o, &v) in out.iter_mut().zip(row) {
        *o += p * v;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::Rng;

    fn bits(v: &[f32]) -> Vec<u32> {
        v.iter().map(|x| x.to_bits()).collect()
    }

    /// Every ISA this CPU has against the scalar twin, for lengths around the lane count and strides
    /// wider than a row, with values of mixed magnitude so that the order of additions shows.
    #[test]
    fn cache_loops_match_scalar_on_every_isa() {
        let mut rng = Rng::new(11);
        let mut value = || rng.normal() * 10f32.powi((rng.next_u64() % 7) as i32 - 3);
        for len in [1, 7, 8, 9, 64, 127, 128, 131] {
            let (n, stride) = (13, len + 5);
            let q: Vec<f32> = (0..len).map(|_| value()).collect();
            let rows: Vec<f32> = (0..n * stride).map(|_| value()).collect();
            let w: Vec<f32> = (0..n).map(|_| value()).collect();
            let start: Vec<f32> = (0..len).map(|_| value()).collect();
            let dots = |isa| {
                let mut out = vec![0f32; n];
                dot_rows_on(isa, &q, &rows, stride, 0.125, &mut out);
                out
            };
            let sums = |isa| {
                let mut out = start.clone();
                add_weighted_rows_on(isa, &mut out, &w, &rows, stride);
                out
            };
            let (want_dots, want_sums) = (dots(Isa::Scalar), sums(Isa::Scalar));
            for t in 0..n {
                assert_eq!(
                    want_dots[t].to_bits(),
                    (dot_scalar(&q, &rows[t * stride..][..len]) * 0.125).to_bits()
                );
            }
            for isa in crate::available_isas() {
                assert_eq!(bits(&dots(isa)), bits(&want_dots), "{isa}: dot_rows, length {len}");
                assert_eq!(
                    bits(&sums(isa)),
                    bits(&want_sums),
                    "{isa}: add_weighted_rows, length {len}"
                );
            }
        }
    }

    /// The fused delta-rule kernels against the scalar twin, and the twin against its steps taken one at
    /// a time with the other loops' kernels (as the engine took them), for lengths around the lanes.
    #[test]
    fn delta_rule_rows_match_the_steps_on_every_isa() {
        let mut rng = Rng::new(23);
        for d in [1, 7, 8, 9, 64, 128, 131] {
            let n = 5;
            let mut value = || rng.normal() * 10f32.powi((rng.next_u64() % 5) as i32 - 2);
            let state: Vec<f32> = (0..n * d).map(|_| value()).collect();
            let (k, q): (Vec<f32>, Vec<f32>) = ((0..d).map(|_| value()).collect(), (0..d).map(|_| value()).collect());
            let v: Vec<f32> = (0..n).map(|_| value()).collect();
            let step = DeltaStep {
                decay: 0.93,
                beta: 0.61,
                k: &k,
                q: &q,
                v: &v,
                scale: 0.0884,
            };
            let (mut want, mut want_out) = (state.clone(), vec![0f32; n]);
            for ((m, &vj), o) in want.chunks_exact_mut(d).zip(&v).zip(&mut want_out) {
                for x in m.iter_mut() {
                    *x *= step.decay;
                }
                let delta = (vj - dot_scalar(m, &k)) * step.beta;
                for (x, &ki) in m.iter_mut().zip(&k) {
                    *x += ki * delta;
                }
                *o = dot_scalar(&q, m) * step.scale;
            }
            for isa in std::iter::once(Isa::Scalar).chain(crate::available_isas()) {
                let (mut got, mut out) = (state.clone(), vec![0f32; n]);
                delta_rule_rows_on(isa, &mut got, &step, &mut out);
                assert_eq!(bits(&got), bits(&want), "{isa}: state, length {d}");
                assert_eq!(bits(&out), bits(&want_out), "{isa}: outputs, length {d}");
            }
        }
    }

    /// The lanes are reduced in `Lanes8`'s tree, not left to right: a sum whose value depends on it.
    #[test]
    fn dot_reduces_in_the_lanes_tree() {
        // Lane 0 holds 1e8, lane 4 holds -1e8, lane 1 holds 1: the tree adds l0 + l4 first (0), then 1.
        let mut a = [0f32; 8];
        (a[0], a[4], a[1]) = (1e8, -1e8, 1.0);
        let ones = [1f32; 8];
        for isa in crate::available_isas() {
            assert_eq!(simd::float_kernel(isa).dot(&a, &ones), 1.0, "{isa}");
            // Rows reduced together (eight at a time on AVX2) too, each row with its lanes in their places.
            for shift in 0..8 {
                let mut b = a;
                b.rotate_right(shift);
                let rows: Vec<f32> = (0..9).flat_map(|t| if t % 2 == 0 { b } else { a }).collect();
                let mut out = [0f32; 9];
                dot_rows_on(isa, &ones, &rows, 8, 1.0, &mut out);
                let mut want = [0f32; 9];
                dot_rows_on(Isa::Scalar, &ones, &rows, 8, 1.0, &mut want);
                assert_eq!(out, want, "{isa}, lanes rotated by {shift}");
            }
        }
        assert_eq!(dot_f32(&a, &ones), 1.0);
    }

    #[test]
    #[should_panic(expected = "dot_rows: 3 rows of 4 elements 6 apart need 16 elements, got 15")]
    fn too_few_rows_panic() {
        dot_rows(&[0.0; 4], &[0.0; 15], 6, 1.0, &mut [0.0; 3]);
    }
}
