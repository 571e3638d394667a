//! Element-wise activations of the forward pass, with `exp` from the portable `libm` crate (FreeBSD's
//! `expf`, all in f32), so that every platform computes the same bits. The SIMD paths evaluate that same
//! algorithm operation for operation, eight lanes at a time (`simd/x86.rs`, `exp8`): the one function of
//! the decode path that was scalar arithmetic in a loop, and at 8 experts × 1024 elements per layer a
//! tenth of a millisecond of one thread per layer while the other one waited.

use crate::simd::{self, Isa};

/// `e^x`, as `libm::expf` computes it: the scalar twin of the SIMD paths.
pub fn exp(x: f32) -> f32 {
    libm::expf(x)
}

/// SiLU: `x / (1 + e^-x)`.
pub fn silu(x: f32) -> f32 {
    x / (1.0 + exp(-x))
}

/// `gate[i] = silu(gate[i]) · up[i]`: a SwiGLU feed-forward's gated product, in place, on the current
/// ISA. Every element is computed as [`silu`] then one multiply computes it, on every ISA.
///
/// # Panics
///
/// If the slices differ in length.
pub fn silu_mul(gate: &mut [f32], up: &[f32]) {
    silu_mul_on(simd::isa(), gate, up)
}

/// [`silu_mul`] on a given ISA (tests compare them without touching the global one).
pub(crate) fn silu_mul_on(isa: Isa, gate: &mut [f32], up: &[f32]) {
    assert_eq!(gate.len(), up.len(), "silu_mul: gate and up differ in length");
    simd::elementwise_kernel(isa).silu_mul(gate, up);
}

/// `x[i] = silu(x[i])` in place, on the current ISA, each element exactly as [`silu`] computes it: the
/// negated inputs through the ISA's `exp` (the bits of [`exp`]), then the same add and divide.
pub fn silu_in_place(x: &mut [f32]) {
    silu_in_place_on(simd::isa(), x)
}

/// [`silu_in_place`] on a given ISA.
pub(crate) fn silu_in_place_on(isa: Isa, x: &mut [f32]) {
    const CHUNK: usize = 64;
    let kernel = simd::elementwise_kernel(isa);
    let mut e = [0f32; CHUNK];
    for chunk in x.chunks_mut(CHUNK) {
        let e = &mut e[..chunk.len()];
        for (e, &v) in e.iter_mut().zip(chunk.iter()) {
            *e = -v;
        }
        kernel.exp(e);
        for (v, &e) in chunk.iter_mut().zip(e.iter()) {
            *v /= 1.0 + e;
        }
    }
}

/// `x[i] = e^x[i]` in place, on the current ISA, each element exactly as [`exp`] computes it.
pub fn exp_in_place(x: &mut [f32]) {
    exp_in_place_on(simd::isa(), x)
}

/// [`exp_in_place`] on a given ISA.
pub(crate) fn exp_in_place_on(isa: Isa, x: &mut [f32]) {
    simd::elementwise_kernel(isa).exp(x);
}

/// The scalar twin of every SIMD `exp_in_place`.
pub(crate) fn exp_scalar(x: &mut [f32]) {
    x.iter_mut().for_each(|v| *v = exp(*v));
}

/// The scalar twin of every SIMD `silu_mul`.
pub(crate) fn silu_mul_scalar(gate: &mut [f32], up: &[f32]) {
    for (g, &u) in gate.iter_mut().zip(up) {
        *g = silu(*g) * u;
    }
}
