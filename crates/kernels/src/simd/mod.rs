//! Run-time choice of instruction set, and the kernel tables it selects from.
//!
//! The CPU is probed once; the best instruction set it supports is used unless the environment
//! variable `TITAN_ISA` (`scalar`, `avx2`, `avx512`, `neon`, read at first use) or [`set_isa`] says
//! otherwise. Every SIMD kernel has a scalar twin in `formats/` and returns the same bits (see the
//! crate root's determinism contract); a format without a kernel for the chosen ISA runs its scalar
//! twin. x86-64 kernels live in `x86.rs`, aarch64 ones in `neon.rs`.
//!
//! The only way to obtain an ISA-specific function is [`dot_kernel`] / [`quant_kernel`], which check
//! that the CPU has the features first; the returned handles are therefore safe to call.

#[cfg(target_arch = "aarch64")]
mod neon;
#[cfg(target_arch = "x86_64")]
mod x86;

use std::sync::atomic::{AtomicU8, Ordering};

use crate::{GgmlType, KernelError, WeightLayout};

/// Most activation rows one dot-product kernel call handles: the weight block is unpacked once and
/// multiplied with each of them. Each kernel says how many it takes ([`DotKernel::max_rows`]).
pub(crate) const MAX_ROWS: usize = 8;

/// How a kernel wants its activation rows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ActLayout {
    /// As GGUF blocks of the activation format.
    Plain,
    /// Q8_0 regrouped eight blocks at a time (`grouped.rs`).
    Grouped,
}

/// An instruction set the kernels can use.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Isa {
    /// Portable Rust: the reference every other path must match bit for bit.
    Scalar,
    /// x86-64 AVX2 with F16C (Haswell, Zen 1 and later).
    Avx2,
    /// x86-64 AVX-512 F/BW/VL with VNNI (Cascade Lake, Ice Lake, Zen 4 and later): the AVX2 kernels
    /// with the integer dot products done by `vpdpbusd` / `vpdpwssd` and 32 vector registers. CPUs with
    /// AVX-512 but no VNNI (Skylake-X) use [`Isa::Avx2`].
    Avx512,
    /// aarch64 NEON with the ARMv8.2 dot product `sdot` (Apple M1, Graviton2, Cortex-A76 and later).
    /// Cores without it (Cortex-A72, Graviton1, Raspberry Pi 4) use [`Isa::Scalar`].
    Neon,
}

impl Isa {
    /// Every ISA, slowest first among those of one architecture (a CPU has ISAs of one only).
    const ALL: [Isa; 4] = [Isa::Scalar, Isa::Avx2, Isa::Avx512, Isa::Neon];

    /// The name `TITAN_ISA` takes.
    pub fn name(self) -> &'static str {
        match self {
            Isa::Scalar => "scalar",
            Isa::Avx2 => "avx2",
            Isa::Avx512 => "avx512",
            Isa::Neon => "neon",
        }
    }

    /// Whether this CPU can run it (probed once, then cached by the standard library).
    pub fn is_available(self) -> bool {
        match self {
            Isa::Scalar => true,
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2 => is_x86_feature_detected!("avx2") && is_x86_feature_detected!("f16c"),
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512 => {
                Isa::Avx2.is_available()
                    && is_x86_feature_detected!("avx512f")
                    && is_x86_feature_detected!("avx512bw")
                    && is_x86_feature_detected!("avx512vl")
                    && is_x86_feature_detected!("avx512vnni")
            }
            #[cfg(target_arch = "aarch64")]
            Isa::Neon => {
                std::arch::is_aarch64_feature_detected!("neon") && std::arch::is_aarch64_feature_detected!("dotprod")
            }
            _ => false,
        }
    }

    fn from_code(code: u8) -> Option<Isa> {
        Isa::ALL.get(usize::from(code).checked_sub(1)?).copied()
    }

    fn code(self) -> u8 {
        self as u8 + 1
    }
}

impl std::fmt::Display for Isa {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// The ISA in use, `0` until the first call to [`isa`] or [`set_isa`].
static CURRENT: AtomicU8 = AtomicU8::new(0);

/// The instruction sets this CPU supports, slowest first (always starts with [`Isa::Scalar`]).
pub fn available_isas() -> Vec<Isa> {
    Isa::ALL.into_iter().filter(|i| i.is_available()).collect()
}

/// The instruction set the kernels use: `TITAN_ISA` if set (and supported), else the best available.
pub fn isa() -> Isa {
    if let Some(isa) = Isa::from_code(CURRENT.load(Ordering::Relaxed)) {
        return isa;
    }
    let chosen = isa_from_env().unwrap_or_else(best_isa);
    // A concurrent `set_isa` wins; a concurrent first use computes the same value.
    match CURRENT.compare_exchange(0, chosen.code(), Ordering::Relaxed, Ordering::Relaxed) {
        Ok(_) => chosen,
        Err(code) => Isa::from_code(code).unwrap_or(chosen),
    }
}

/// Forces the instruction set for every later kernel call in this process (e.g. to compare paths).
/// Results do not change — every path gives the same bits — only speed does.
pub fn set_isa(isa: Isa) -> Result<(), KernelError> {
    if !isa.is_available() {
        return Err(KernelError::IsaUnavailable {
            isa,
            available: available_isas(),
        });
    }
    CURRENT.store(isa.code(), Ordering::Relaxed);
    Ok(())
}

fn best_isa() -> Isa {
    available_isas().last().copied().unwrap_or(Isa::Scalar)
}

/// `TITAN_ISA`, if it names an ISA this CPU has. A bad value is reported once on stderr rather than
/// failing: the variable is a tuning knob read deep inside the first kernel call.
fn isa_from_env() -> Option<Isa> {
    let value = std::env::var("TITAN_ISA").ok()?;
    let wanted = Isa::ALL
        .into_iter()
        .find(|i| i.name().eq_ignore_ascii_case(value.trim()));
    match wanted {
        Some(isa) if isa.is_available() => Some(isa),
        _ => {
            let names: Vec<&str> = available_isas().iter().map(|i| i.name()).collect();
            eprintln!(
                "titan-kernels: TITAN_ISA={value:?} is not available on this CPU (choose one of {}); using {}",
                names.join(", "),
                best_isa()
            );
            None
        }
    }
}

/// The instruction set that runs dot products of `ty` weights under the current [`isa`]: that ISA,
/// or [`Isa::Scalar`] for formats it has no kernels for (so a benchmark can say what it measured).
pub fn kernel_isa(ty: GgmlType) -> Isa {
    dot_kernel(isa(), ty, WeightLayout::Plain).isa
}

/// Dots each weight row of `w` (whole rows of `row_bytes`) with 1..=`max_rows` activation rows:
/// `out[k * acts.len() + i] = vec_dot(row k, acts[i])`. Unsafe because ISA-specific kernels need
/// their CPU features; see [`DotKernel`]. One call takes a run of rows so that the dispatch, the
/// row-count match and the loop-invariant constants are paid once per run, not once per row.
type DotFn = unsafe fn(w: &[u8], row_bytes: usize, acts: &[&[u8]], out: &mut [f32]);

/// A dot-product kernel for one weight format, for the ISA it was selected for.
#[derive(Clone, Copy)]
pub(crate) struct DotKernel {
    f: DotFn,
    /// The ISA whose code runs (the requested one, or Scalar where that ISA has no kernel).
    pub(crate) isa: Isa,
    /// The layout its activation rows must be in.
    pub(crate) layout: ActLayout,
    /// The most activation rows one call takes (at most [`MAX_ROWS`]).
    pub(crate) max_rows: usize,
}

impl DotKernel {
    /// `out[k * acts.len() + i] = vec_dot(w row k, acts[i])` for each weight row `k` of `w` and
    /// each of the 1..=`max_rows` activation rows, every output exactly as if it were computed
    /// alone. Rows must be whole blocks of equal length, activations in the kernel's [`ActLayout`].
    #[inline]
    pub(crate) fn run(&self, w: &[u8], row_bytes: usize, acts: &[&[u8]], out: &mut [f32]) {
        assert!(
            (1..=self.max_rows).contains(&acts.len()),
            "dot kernel takes 1..={} rows",
            self.max_rows
        );
        assert!(
            row_bytes > 0 && w.len().is_multiple_of(row_bytes) && out.len() == w.len() / row_bytes * acts.len(),
            "dot kernel: weights must be whole rows and out one value per (weight row, activation row)"
        );
        // SAFETY: `dot_kernel` stores an ISA-specific function only after `Isa::is_available` confirmed this
        // CPU has the features it is compiled with (the scalar ones need none), and that is the kernels' one
        // requirement: they reach `w`, `acts` and `out` only through these slices, `w` and `out` in whole
        // chunks of `row_bytes` and `acts.len()` (checked above) and each activation row after asserting its
        // length against the weight row.
        unsafe { (self.f)(w, row_bytes, acts, out) }
    }
}

/// The dot-product kernel for weights of type `ty` stored in `layout` on `isa` (falling back to
/// scalar where `isa` has none, or the CPU lacks `isa`).
pub(crate) fn dot_kernel(isa: Isa, ty: GgmlType, layout: WeightLayout) -> DotKernel {
    #[cfg(target_arch = "x86_64")]
    if isa != Isa::Scalar && isa.is_available() {
        if let Some(kernel) = x86::dot_kernel(isa, ty, layout) {
            return kernel;
        }
    }
    #[cfg(target_arch = "aarch64")]
    if isa != Isa::Scalar && isa.is_available() && layout == WeightLayout::Plain {
        if let Some(kernel) = neon::dot_kernel(isa, ty) {
            return kernel;
        }
    }
    let f = match layout {
        WeightLayout::Plain => scalar_dot_rows(ty),
        WeightLayout::Regrouped => scalar_regrouped_rows(ty),
    };
    DotKernel {
        f,
        isa: Isa::Scalar,
        layout: ActLayout::Plain,
        max_rows: MAX_ROWS,
    }
}

/// Whether the current [`isa`] multiplies regrouped `ty` weights with a SIMD kernel, so that
/// regrouping them at load pays (elsewhere they would run the slower scalar twin).
pub fn regrouped_weights_pay(ty: GgmlType) -> bool {
    dot_kernel(isa(), ty, WeightLayout::Regrouped).isa != Isa::Scalar
}

/// Quantises whole blocks of activations (`src` and `dst` hold the same number of blocks).
type QuantFn = unsafe fn(src: &[f32], dst: &mut [u8]);

/// An activation quantiser for the ISA it was selected for.
#[derive(Clone, Copy)]
pub(crate) struct QuantKernel {
    f: QuantFn,
}

impl QuantKernel {
    /// Quantises `src` into `dst` (the same number of whole blocks).
    #[inline]
    pub(crate) fn run(&self, src: &[f32], dst: &mut [u8]) {
        // SAFETY: `quant_kernel` stores an ISA-specific quantiser only after `Isa::is_available` confirmed this
        // CPU has the features it is compiled with; the quantisers walk `src` and `dst` in whole blocks
        // (`chunks_exact`), so they stay inside both whatever the lengths.
        unsafe { (self.f)(src, dst) }
    }
}

/// The quantiser into activation format `act_ty` on `isa`, or the error for a non-activation type.
pub(crate) fn quant_kernel(isa: Isa, act_ty: GgmlType) -> Result<QuantKernel, KernelError> {
    use crate::formats::{fp32, q8_0, q8_1, q8_k};
    let scalar: fn(&[f32], &mut [u8]) = match act_ty {
        GgmlType::F32 => fp32::quantize,
        GgmlType::Q8_0 => q8_0::quantize,
        GgmlType::Q8_1 => q8_1::quantize,
        GgmlType::Q8_K => q8_k::quantize,
        other => return Err(KernelError::NotActivationType(other)),
    };
    #[cfg(target_arch = "x86_64")]
    if isa != Isa::Scalar && isa.is_available() {
        if let Some(f) = x86::quant_fn(isa, act_ty) {
            return Ok(QuantKernel { f });
        }
    }
    #[cfg(target_arch = "aarch64")]
    if isa != Isa::Scalar && isa.is_available() {
        if let Some(f) = neon::quant_fn(isa, act_ty) {
            return Ok(QuantKernel { f });
        }
    }
    Ok(QuantKernel { f: scalar })
}

/// `gate[i] = silu(gate[i]) · up[i]` over slices of equal length.
type SiluMulFn = unsafe fn(gate: &mut [f32], up: &[f32]);

/// `x[i] = e^x[i]` in place.
type ExpFn = unsafe fn(x: &mut [f32]);

/// The element-wise activation kernels for the ISA they were selected for.
#[derive(Clone, Copy)]
pub(crate) struct ElementwiseKernel {
    silu_mul: SiluMulFn,
    exp: ExpFn,
}

impl ElementwiseKernel {
    /// `gate[i] = silu(gate[i]) · up[i]`; the caller has checked that the lengths agree.
    #[inline]
    pub(crate) fn silu_mul(&self, gate: &mut [f32], up: &[f32]) {
        // SAFETY: `elementwise_kernel` stores the AVX2 kernels only after `Isa::is_available` confirmed this CPU
        // has AVX2 (the scalar ones need nothing); they read and write `gate` and `up` in 8-float chunks
        // (`chunks_exact`), so they stay inside both whatever the lengths.
        unsafe { (self.silu_mul)(gate, up) }
    }

    /// `x[i] = e^x[i]` in place.
    #[inline]
    pub(crate) fn exp(&self, x: &mut [f32]) {
        // SAFETY: `elementwise_kernel` stores `exp_avx2` only after `Isa::is_available` confirmed AVX2 (the
        // scalar one needs nothing); it reads and writes `x` in 8-float chunks (`chunks_exact_mut`).
        unsafe { (self.exp)(x) }
    }
}

/// The element-wise kernels of `isa` (scalar where it has none, or the CPU lacks it).
pub(crate) fn elementwise_kernel(isa: Isa) -> ElementwiseKernel {
    #[cfg(target_arch = "x86_64")]
    if isa != Isa::Scalar && isa.is_available() {
        return x86::elementwise_kernel();
    }
    let _ = isa;
    ElementwiseKernel {
        silu_mul: crate::activation::silu_mul_scalar,
        exp: crate::activation::exp_scalar,
    }
}

/// `Σ a[i] · b[i]` over the shorter length, in `Lanes8`'s order.
type DotF32Fn = unsafe fn(a: &[f32], b: &[f32]) -> f32;

/// [`crate::dot_rows`]'s kernels, on rows the caller has checked are there.
type DotRowsFn = unsafe fn(q: &[f32], rows: &[f32], stride: usize, scale: f32, out: &mut [f32]);
/// [`crate::add_weighted_rows`]'s kernels, on rows the caller has checked are there.
type AddWeightedRowsFn = unsafe fn(out: &mut [f32], w: &[f32], rows: &[f32], stride: usize);
/// [`crate::delta_rule_rows`]'s kernels.
type DeltaRowsFn = unsafe fn(rows: &mut [f32], step: &crate::DeltaStep, out: &mut [f32]);

/// The f32 loops of attention over a cache (`float_dot.rs`) for the ISA they were selected for.
#[derive(Clone, Copy)]
pub(crate) struct FloatKernel {
    dot: DotF32Fn,
    dot_rows: DotRowsFn,
    add_weighted_rows: AddWeightedRowsFn,
    delta_rule_rows: DeltaRowsFn,
}

impl FloatKernel {
    #[inline]
    pub(crate) fn dot(&self, a: &[f32], b: &[f32]) -> f32 {
        // SAFETY: `float_kernel` stores the AVX2 kernels only after `Isa::is_available` confirmed this CPU has
        // AVX2 (the scalar ones need nothing); `dot_f32_avx2` cuts both slices to the shorter length and reads
        // them in 8-float chunks (`chunks_exact`).
        unsafe { (self.dot)(a, b) }
    }

    #[inline]
    pub(crate) fn dot_rows(&self, q: &[f32], rows: &[f32], stride: usize, scale: f32, out: &mut [f32]) {
        // SAFETY: `float_kernel` stores `dot_rows_avx2` only after `Isa::is_available` confirmed AVX2 (the
        // scalar one needs nothing); it slices each row out of `rows` with bounds checks.
        unsafe { (self.dot_rows)(q, rows, stride, scale, out) }
    }

    #[inline]
    pub(crate) fn add_weighted_rows(&self, out: &mut [f32], w: &[f32], rows: &[f32], stride: usize) {
        // SAFETY: `float_kernel` stores `add_weighted_rows_avx2` only after `Isa::is_available` confirmed AVX2
        // (the scalar one needs nothing); it slices each row's elements out of `rows` with bounds checks.
        unsafe { (self.add_weighted_rows)(out, w, rows, stride) }
    }

    #[inline]
    pub(crate) fn delta_rule_rows(&self, rows: &mut [f32], step: &crate::DeltaStep, out: &mut [f32]) {
        // SAFETY: `float_kernel` stores `delta_rule_rows_avx2` only after `Isa::is_available` confirmed AVX2
        // (the scalar one needs nothing); it works on whole rows of `rows` (`chunks_exact_mut(k.len())`), on
        // `k` and `q` (asserted to be as long) in 8-float chunks, and on `out` by iterator.
        unsafe { (self.delta_rule_rows)(rows, step, out) }
    }
}

/// The f32 cache loops of `isa` (scalar where it has none, or the CPU lacks it).
pub(crate) fn float_kernel(isa: Isa) -> FloatKernel {
    #[cfg(target_arch = "x86_64")]
    if isa != Isa::Scalar && isa.is_available() {
        return x86::float_kernel();
    }
    let _ = isa;
    use crate::float_dot::{add_weighted_rows_scalar, delta_rule_rows_scalar, dot_rows_scalar, dot_scalar};
    FloatKernel {
        dot: dot_scalar,
        dot_rows: dot_rows_scalar,
        add_weighted_rows: add_weighted_rows_scalar,
        delta_rule_rows: delta_rule_rows_scalar,
    }
}

/// The scalar twin of the regrouped-weight kernels: each group is restored to its plain blocks, and
/// each block's term (a one-block `vec_dot`) goes to lane `block % 8`, as the plain `vec_dot` does.
/// Only Q4_0, Q8_0 and MXFP4 are ever regrouped (`grouped::weights_regroupable`).
fn scalar_regrouped_rows(ty: GgmlType) -> DotFn {
    use crate::accum::Lanes8;
    use crate::formats::{mxfp4, q4_0, q8_0};
    use crate::grouped::{ungroup_weights, GROUP_BLOCKS};
    macro_rules! rows {
        ($m:ident, $ty:expr) => {{
            fn rows(w: &[u8], row_bytes: usize, acts: &[&[u8]], out: &mut [f32]) {
                let (bb, ab) = ($m::BLOCK_BYTES, q8_0::BLOCK_BYTES);
                let mut plain = [0u8; GROUP_BLOCKS * $m::BLOCK_BYTES];
                for (w, out) in w.chunks_exact(row_bytes).zip(out.chunks_exact_mut(acts.len())) {
                    let mut lanes = [Lanes8::default(); MAX_ROWS];
                    let mut dot = |b: usize, block: &[u8]| {
                        for (l, a) in lanes.iter_mut().zip(acts) {
                            l.add(b, $m::vec_dot(block, &a[b * ab..(b + 1) * ab]));
                        }
                    };
                    // Groups of eight blocks, and a row's last `t < 8` blocks in `t` lanes.
                    for (g, group) in w.chunks(plain.len()).enumerate() {
                        let plain = &mut plain[..group.len()];
                        ungroup_weights($ty, group, plain);
                        for (k, block) in plain.chunks_exact(bb).enumerate() {
                            dot(g * GROUP_BLOCKS + k, block);
                        }
                    }
                    for (o, l) in out.iter_mut().zip(lanes) {
                        *o = l.sum();
                    }
                }
            }
            rows
        }};
    }
    match ty {
        GgmlType::Q4_0 => rows!(q4_0, GgmlType::Q4_0),
        GgmlType::Q8_0 => rows!(q8_0, GgmlType::Q8_0),
        GgmlType::MXFP4 => rows!(mxfp4, GgmlType::MXFP4),
        other => unreachable!("{other} weights are never regrouped"),
    }
}

/// The scalar twin of every dot kernel: one `vec_dot` per activation row.
fn scalar_dot_rows(ty: GgmlType) -> DotFn {
    use crate::formats::{
        bf16, fp16, fp32, mxfp4, q2_k, q3_k, q4_0, q4_1, q4_k, q5_0, q5_1, q5_k, q6_k, q8_0, q8_1, q8_k,
    };
    macro_rules! rows {
        ($m:ident) => {{
            fn rows(w: &[u8], row_bytes: usize, acts: &[&[u8]], out: &mut [f32]) {
                for (w, out) in w.chunks_exact(row_bytes).zip(out.chunks_exact_mut(acts.len())) {
                    for (o, a) in out.iter_mut().zip(acts) {
                        *o = $m::vec_dot(w, a);
                    }
                }
            }
            rows
        }};
    }
    match ty {
        GgmlType::F32 => rows!(fp32),
        GgmlType::F16 => rows!(fp16),
        GgmlType::BF16 => rows!(bf16),
        GgmlType::Q4_0 => rows!(q4_0),
        GgmlType::Q4_1 => rows!(q4_1),
        GgmlType::Q5_0 => rows!(q5_0),
        GgmlType::Q5_1 => rows!(q5_1),
        GgmlType::Q8_0 => rows!(q8_0),
        GgmlType::Q8_1 => rows!(q8_1),
        GgmlType::Q2_K => rows!(q2_k),
        GgmlType::Q3_K => rows!(q3_k),
        GgmlType::Q4_K => rows!(q4_k),
        GgmlType::Q5_K => rows!(q5_k),
        GgmlType::Q6_K => rows!(q6_k),
        GgmlType::Q8_K => rows!(q8_k),
        GgmlType::MXFP4 => rows!(mxfp4),
        GgmlType::I32 => unreachable!("an I32 table is never multiplied: no activation has its type"),
    }
}

#[cfg(test)]
mod tests;
