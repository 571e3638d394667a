//! Every SIMD path against its scalar twin, bit for bit, on every ISA this CPU has.

use super::*;
use crate::formats::{f16_bytes, QK_K};
use crate::matmul::{matmul_many_on, regroup_weights, Activations, MatmulJob, WeightLayout, WeightView};
use crate::testutil::{f16_scale_fields, random_row, Rng};

/// The SIMD ISAs available here (the tests pass vacuously on a CPU with none).
fn simd_isas() -> Vec<Isa> {
    available_isas().into_iter().filter(|&i| i != Isa::Scalar).collect()
}

#[test]
fn required_isas_are_available() {
    // The SIMD tests pass vacuously without SIMD: `TITAN_TEST_REQUIRE_ISA` (a comma-separated list, set by
    // `.ci/run` to the paths the host CPU's flags promise and by `tools/test_aarch64.sh` to `neon`) makes them
    // fail instead when the CPU or emulator does not offer an ISA the run is meant to cover.
    let names = std::env::var("TITAN_TEST_REQUIRE_ISA").unwrap_or_default();
    eprintln!(
        "SIMD paths compared with scalar here: {:?}; required: {names:?}",
        simd_isas()
    );
    for name in names.split(',').map(str::trim).filter(|n| !n.is_empty()) {
        let isa = Isa::ALL
            .into_iter()
            .find(|i| i.name().eq_ignore_ascii_case(name))
            .unwrap_or_else(|| panic!("TITAN_TEST_REQUIRE_ISA names {name:?}, which is no ISA"));
        assert!(
            isa.is_available(),
            "TITAN_TEST_REQUIRE_ISA asks for {isa}, but this CPU has only {:?}",
            available_isas()
        );
        // Its own kernels, not the scalar fallback, are what the tests below compare with scalar.
        assert_eq!(
            dot_kernel(isa, GgmlType::Q8_0, WeightLayout::Plain).isa,
            isa,
            "{isa} Q8_0 kernel"
        );
    }
}

/// Row lengths in blocks: below, at and above the 8 accumulation lanes, and not multiples of them.
const BLOCK_COUNTS: [usize; 9] = [1, 2, 3, 7, 8, 9, 13, 16, 41];

/// Activations with the hard cases: an outlier, an all-zero block and a subnormal; from `level` 1
/// also values near f32::MAX (which make most dot products infinite, so not in every row); from
/// level 2 infinities and NaN.
fn activations(n: usize, rng: &mut Rng, level: u8) -> Vec<f32> {
    let mut x: Vec<f32> = (0..n).map(|_| rng.normal()).collect();
    x[n / 2] *= 50.0;
    if n >= 64 {
        x[..32].fill(0.0);
        x[40] = 1e-40;
    }
    if level >= 1 && n >= 64 {
        x[32] = 3e38;
        x[33] = -3e38;
    }
    if level >= 1 && n >= 128 {
        // A block so small that its scale underflows (and Q8_0's 1/d overflows).
        for (i, v) in x[64..96].iter_mut().enumerate() {
            *v = if i % 2 == 0 { 1e-39 } else { -2e-39 };
        }
    }
    if level >= 2 && n >= 128 {
        x[70] = f32::INFINITY;
        x[100] = f32::NEG_INFINITY;
        x[120] = f32::NAN;
    }
    x
}

/// A weight row whose block scales include extremes (0, ±65504, a subnormal; for MXFP4 the
/// subnormal and largest exponents) as well as sane values.
fn weights(ty: GgmlType, n: usize, rng: &mut Rng) -> Vec<u8> {
    let mut w = random_row(ty, n, rng);
    if ty == GgmlType::MXFP4 {
        let extremes = [0, 1, 2, 127, 254, 255];
        for block in w.chunks_exact_mut(ty.block_bytes()) {
            if rng.next_u64().is_multiple_of(3) {
                block[0] = extremes[(rng.next_u64() % 6) as usize];
            }
        }
    }
    if ty.block_len() > 1 {
        let extremes = [0.0, 65504.0, -65504.0, 6e-8, 1.0];
        for block in w.chunks_exact_mut(ty.block_bytes()) {
            if rng.next_u64().is_multiple_of(3) {
                let v = extremes[(rng.next_u64() % 5) as usize];
                for &at in f16_scale_fields(ty) {
                    block[at..at + 2].copy_from_slice(&f16_bytes(v));
                }
            }
        }
    }
    w
}

fn quantize(act_ty: GgmlType, isa: Isa, x: &[f32]) -> Vec<u8> {
    let mut q = vec![0u8; act_ty.row_bytes(x.len()).unwrap()];
    quant_kernel(isa, act_ty).unwrap().run(x, &mut q);
    q
}

/// A plain activation row in the layout `kernel` reads.
fn in_layout(kernel: DotKernel, plain: &[u8]) -> Vec<u8> {
    match kernel.layout {
        ActLayout::Plain => plain.to_vec(),
        ActLayout::Grouped => {
            let blocks = plain.len() / crate::formats::q8_0::BLOCK_BYTES;
            let mut g = vec![0u8; crate::grouped::row_bytes(blocks)];
            crate::grouped::regroup(plain, &mut g);
            g
        }
    }
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

#[test]
fn every_dot_kernel_matches_scalar_for_every_row_count() {
    // Three weight rows per call, so a call's later rows are checked too.
    const W_ROWS: usize = 3;
    for isa in simd_isas() {
        for ty in GgmlType::ALL {
            let act_ty = ty.act_type();
            let block_len = ty.block_len().max(act_ty.block_len()).max(8);
            let mut rng = Rng::new(u64::from(ty.id()) * 1000 + isa as u64);
            for blocks in BLOCK_COUNTS {
                let n = blocks * block_len;
                let w: Vec<u8> = (0..W_ROWS).flat_map(|_| weights(ty, n, &mut rng)).collect();
                let row_bytes = w.len() / W_ROWS;
                let acts: Vec<Vec<u8>> = (0..MAX_ROWS)
                    .map(|i| {
                        let x = activations(n, &mut rng, (i % 2) as u8);
                        quantize(act_ty, Isa::Scalar, &x)
                    })
                    .collect();
                let act_refs: Vec<&[u8]> = acts.iter().map(|a| a.as_slice()).collect();
                let mut expected = [0f32; W_ROWS * MAX_ROWS];
                dot_kernel(Isa::Scalar, ty, WeightLayout::Plain).run(&w, row_bytes, &act_refs, &mut expected);
                let kernel = dot_kernel(isa, ty, WeightLayout::Plain);
                let laid_out: Vec<Vec<u8>> = acts.iter().map(|a| in_layout(kernel, a)).collect();
                let act_refs: Vec<&[u8]> = laid_out.iter().map(|a| a.as_slice()).collect();
                for rows in 1..=kernel.max_rows {
                    let mut got = vec![0f32; W_ROWS * rows];
                    kernel.run(&w, row_bytes, &act_refs[..rows], &mut got);
                    let want: Vec<f32> = expected
                        .chunks_exact(MAX_ROWS)
                        .flat_map(|per_row| per_row[..rows].to_vec())
                        .collect();
                    assert_eq!(
                        bits(&got),
                        bits(&want),
                        "{isa} {ty}, {blocks} blocks, {rows} rows: {got:?} vs {want:?}"
                    );
                }
            }
        }
    }
}

/// Every quant at its largest unsigned encoding and every activation at ±127 (Q8_0 of a constant row):
/// the integer sums the kernels build from `maddubs` pairs reach their bounds (AVX2 adds the pairs of
/// several registers in i16 before widening), and must still be exact.
#[test]
fn integer_sums_at_their_largest_are_exact_on_every_isa() {
    const BLOCKS: usize = 16;
    let block = |ty: GgmlType| -> Vec<u8> {
        match ty {
            // nibbles 15, the quants + 8
            GgmlType::Q4_0 => [&f16_bytes(1.0)[..], &[0xFF; 16]].concat(),
            // nibbles 15 and every fifth bit set: 31, the quants + 16
            GgmlType::Q5_0 => [&f16_bytes(1.0)[..], &[0xFF; 20]].concat(),
            // exponent 2^0 and nibble 7 (E2M1 6.0, 28 unsigned)
            GgmlType::MXFP4 => [&[127u8][..], &[0x77; 16]].concat(),
            // -128, the largest magnitude
            GgmlType::Q8_0 => [&f16_bytes(1.0)[..], &[0x80; 32]].concat(),
            _ => unreachable!(),
        }
    };
    for ty in [GgmlType::Q4_0, GgmlType::Q5_0, GgmlType::MXFP4, GgmlType::Q8_0] {
        let w = block(ty).repeat(BLOCKS);
        let n = BLOCKS * 32;
        let acts: Vec<Vec<u8>> = [1.0f32, -1.0]
            .iter()
            .map(|&v| quantize(GgmlType::Q8_0, Isa::Scalar, &vec![v; n]))
            .collect();
        let plain: Vec<&[u8]> = acts.iter().map(|a| a.as_slice()).collect();
        let mut want = [0f32; 2];
        dot_kernel(Isa::Scalar, ty, WeightLayout::Plain).run(&w, w.len(), &plain, &mut want);
        assert!(want[0] != 0.0 && want[0] == -want[1], "{ty}: {want:?}");
        for isa in simd_isas() {
            let kernel = dot_kernel(isa, ty, WeightLayout::Plain);
            assert_eq!(kernel.isa, isa);
            let laid_out: Vec<Vec<u8>> = acts.iter().map(|a| in_layout(kernel, a)).collect();
            let refs: Vec<&[u8]> = laid_out.iter().map(|a| a.as_slice()).collect();
            let mut got = [0f32; 2];
            kernel.run(&w, w.len(), &refs, &mut got);
            assert_eq!(bits(&got), bits(&want), "{isa} {ty}: {got:?} vs {want:?}");
        }
    }
}

#[test]
fn mxfp4_kernels_match_scalar_for_every_exponent() {
    // Block `e` of 256 has E8M0 exponent byte `e`, so each lane's scale conversion is checked for
    // all 256; 32 weight rows of 8 blocks, so all but the largest exponents give finite results.
    const W_ROWS: usize = 32;
    let (ty, n) = (GgmlType::MXFP4, 8 * 32);
    let mut rng = Rng::new(39);
    let mut w = random_row(ty, W_ROWS * n, &mut rng);
    for (e, block) in w.chunks_exact_mut(ty.block_bytes()).enumerate() {
        block[0] = e as u8;
    }
    let row_bytes = w.len() / W_ROWS;
    let acts: Vec<Vec<u8>> = (0..MAX_ROWS)
        .map(|_| quantize(GgmlType::Q8_0, Isa::Scalar, &activations(n, &mut rng, 0)))
        .collect();
    let plain_refs: Vec<&[u8]> = acts.iter().map(|a| a.as_slice()).collect();
    let mut expected = [0f32; W_ROWS * MAX_ROWS];
    dot_kernel(Isa::Scalar, ty, WeightLayout::Plain).run(&w, row_bytes, &plain_refs, &mut expected);
    let finite = expected.iter().filter(|v| v.is_finite() && **v != 0.0).count();
    assert!(finite > W_ROWS * MAX_ROWS * 3 / 4, "{expected:?}");
    for isa in simd_isas() {
        let kernel = dot_kernel(isa, ty, WeightLayout::Plain);
        assert_eq!(kernel.isa, isa);
        let laid_out: Vec<Vec<u8>> = acts.iter().map(|a| in_layout(kernel, a)).collect();
        let act_refs: Vec<&[u8]> = laid_out.iter().map(|a| a.as_slice()).collect();
        for rows in 1..=kernel.max_rows {
            let mut got = vec![0f32; W_ROWS * rows];
            kernel.run(&w, row_bytes, &act_refs[..rows], &mut got);
            let want: Vec<f32> = expected
                .chunks_exact(MAX_ROWS)
                .flat_map(|r| r[..rows].to_vec())
                .collect();
            assert_eq!(bits(&got), bits(&want), "{isa}, {rows} rows");
        }
    }
}

#[test]
fn regrouped_weights_give_the_plain_scalar_bits_on_every_isa() {
    // Scalar included: its regrouped twin restores the blocks. Three weight rows per call.
    const W_ROWS: usize = 3;
    for isa in available_isas() {
        for ty in [GgmlType::Q4_0, GgmlType::Q8_0, GgmlType::MXFP4] {
            let mut rng = Rng::new(u64::from(ty.id()) * 77 + isa as u64);
            // Whole groups, and rows that end in plain blocks (1408 = 5 groups and 4 blocks).
            for n in [256, 512, 1280, 288, 480, 1408] {
                let w: Vec<u8> = (0..W_ROWS).flat_map(|_| weights(ty, n, &mut rng)).collect();
                let row_bytes = w.len() / W_ROWS;
                let mut regrouped = vec![0u8; w.len()];
                assert!(regroup_weights(ty, n, &w, &mut regrouped));
                assert_ne!(regrouped, w);
                let acts: Vec<Vec<u8>> = (0..MAX_ROWS)
                    .map(|i| quantize(GgmlType::Q8_0, Isa::Scalar, &activations(n, &mut rng, (i % 2) as u8)))
                    .collect();
                let plain_refs: Vec<&[u8]> = acts.iter().map(|a| a.as_slice()).collect();
                let mut expected = [0f32; W_ROWS * MAX_ROWS];
                dot_kernel(Isa::Scalar, ty, WeightLayout::Plain).run(&w, row_bytes, &plain_refs, &mut expected);
                let kernel = dot_kernel(isa, ty, WeightLayout::Regrouped);
                // NEON has no regrouped kernels (its scalar twin runs, and the engine does not regroup there).
                if isa != Isa::Neon {
                    assert_eq!(kernel.isa, isa, "{ty}");
                }
                let laid_out: Vec<Vec<u8>> = acts.iter().map(|a| in_layout(kernel, a)).collect();
                let act_refs: Vec<&[u8]> = laid_out.iter().map(|a| a.as_slice()).collect();
                for rows in 1..=kernel.max_rows {
                    let mut got = vec![0f32; W_ROWS * rows];
                    kernel.run(&regrouped, row_bytes, &act_refs[..rows], &mut got);
                    let want: Vec<f32> = expected
                        .chunks_exact(MAX_ROWS)
                        .flat_map(|r| r[..rows].to_vec())
                        .collect();
                    assert_eq!(bits(&got), bits(&want), "{isa} {ty}, {n} columns, {rows} rows");
                }
            }
        }
    }
}

#[test]
fn matmul_of_regrouped_weights_equals_plain_on_every_isa() {
    for isa in available_isas() {
        for ty in [GgmlType::Q4_0, GgmlType::Q8_0, GgmlType::MXFP4] {
            for (rows, cols) in [(70, 512), (21, 1408), (9, 2880)] {
                let (data, acts) = problem(ty, rows, cols, 11, 5);
                let plain = WeightView::new(ty, rows, cols, &data).unwrap();
                let mut regrouped = vec![0u8; data.len()];
                assert!(regroup_weights(ty, cols, &data, &mut regrouped));
                let w = WeightView {
                    data: &regrouped,
                    layout: WeightLayout::Regrouped,
                    ..plain
                };
                for n_act in [1, 3, 8, 11] {
                    let mut some = Activations::new();
                    some.gather_from(&acts, &(0..n_act).collect::<Vec<_>>());
                    let expected = matmul_on(Isa::Scalar, &plain, &some);
                    assert_eq!(
                        bits(&matmul_on(isa, &w, &some)),
                        bits(&expected),
                        "{isa} {ty}, {cols} columns, {n_act} rows"
                    );
                }
            }
        }
    }
}

#[test]
fn q4_0_and_q8_0_rows_of_a_group_or_more_are_regrouped() {
    let src = vec![0u8; 18 * 9];
    let mut dst = vec![0u8; 18 * 9];
    assert!(
        !regroup_weights(GgmlType::Q4_0, 128, &src[..72], &mut dst[..72]),
        "4 blocks: not a whole group"
    );
    assert!(
        regroup_weights(GgmlType::Q4_0, 288, &src, &mut dst),
        "a group and a plain block"
    );
    let (src, dst) = (&src[..18 * 8], &mut dst[..18 * 8]);
    assert!(!regroup_weights(GgmlType::Q4_1, 256, src, dst));
    assert!(!regroup_weights(GgmlType::Q4_0, 256, src, &mut dst[..100]));
    assert!(regroup_weights(GgmlType::Q4_0, 256, src, dst));
}

#[test]
fn every_quantiser_matches_scalar_bytes() {
    for isa in simd_isas() {
        for act_ty in [GgmlType::F32, GgmlType::Q8_0, GgmlType::Q8_1, GgmlType::Q8_K] {
            let mut rng = Rng::new(77 + isa as u64);
            for blocks in [1, 2, 3, 8, 13] {
                let n = blocks * QK_K;
                for level in 0..3 {
                    let x = activations(n, &mut rng, level);
                    assert_eq!(
                        quantize(act_ty, isa, &x),
                        quantize(act_ty, Isa::Scalar, &x),
                        "{isa} {act_ty}, {n} elements, level {level}"
                    );
                }
            }
        }
    }
}

#[test]
fn quantisers_round_exact_ties_like_scalar() {
    // Q8_0: amax 127 makes d = 1 and 1/d = 1, so x · id is x: the halves are exact ties (away from
    // zero). Q8_K: a first element of -127 makes iscale = 1 (ties to even).
    let mut x = vec![0f32; 2 * QK_K];
    for (i, v) in x.iter_mut().enumerate() {
        *v = (i % 64) as f32 - 31.5;
    }
    for block in x.chunks_exact_mut(32) {
        block[0] = 127.0;
    }
    x[0] = -127.0;
    x[QK_K] = -127.0;
    for isa in simd_isas() {
        for act_ty in [GgmlType::Q8_0, GgmlType::Q8_K] {
            assert_eq!(
                quantize(act_ty, isa, &x),
                quantize(act_ty, Isa::Scalar, &x),
                "{isa} {act_ty}"
            );
        }
    }
    let q = quantize(GgmlType::Q8_0, Isa::Scalar, &x[..32]);
    assert_eq!(q[2 + 1] as i8, -31, "Q8_0: -30.5 rounds away from zero");
    let q = quantize(GgmlType::Q8_K, Isa::Scalar, &x[..QK_K]);
    assert_eq!(q[4 + 1] as i8, -30, "Q8_K: 30.5 · -1 rounds to even");
}

/// A random weight matrix of `rows` rows and `n_act` quantised activation rows.
fn problem(ty: GgmlType, rows: usize, cols: usize, n_act: usize, seed: u64) -> (Vec<u8>, Activations) {
    let mut rng = Rng::new(seed);
    let w: Vec<u8> = (0..rows).flat_map(|_| weights(ty, cols, &mut rng)).collect();
    let x: Vec<f32> = (0..n_act)
        .flat_map(|i| activations(cols, &mut rng, u8::from(i == 6)))
        .collect();
    let mut acts = Activations::new();
    acts.quantize(ty.act_type(), &x, n_act, cols).unwrap();
    (w, acts)
}

fn matmul_on(isa: Isa, w: &WeightView, acts: &Activations) -> Vec<f32> {
    let mut out = vec![0f32; w.rows * acts.rows()];
    matmul_many_on(
        isa,
        &mut [MatmulJob {
            w: *w,
            acts,
            out: &mut out,
        }],
    )
    .unwrap();
    out
}

#[test]
fn matmul_on_every_isa_equals_scalar_vec_dot_for_one_to_seventeen_rows() {
    // Up to two full calls of the widest kernel and one row more.
    for isa in available_isas() {
        for ty in GgmlType::ALL {
            let (rows, cols) = (19, 3 * 256);
            let (data, acts) = problem(ty, rows, cols, 17, u64::from(ty.id()));
            let w = WeightView::new(ty, rows, cols, &data).unwrap();
            for n_act in 1..=17 {
                let mut some = Activations::new();
                let picked: Vec<usize> = (0..n_act).collect();
                some.gather_from(&acts, &picked);
                let out = matmul_on(isa, &w, &some);
                for i in 0..n_act {
                    for r in 0..rows {
                        let mut e = [0f32];
                        dot_kernel(Isa::Scalar, ty, WeightLayout::Plain).run(
                            w.row(r),
                            w.row_bytes(),
                            &[acts.row(i)],
                            &mut e,
                        );
                        assert_eq!(
                            out[i * rows + r].to_bits(),
                            e[0].to_bits(),
                            "{isa} {ty}: {n_act} rows, out[{i}][{r}]"
                        );
                    }
                }
            }
        }
    }
}

#[test]
fn matmul_many_equals_separate_matmuls() {
    let shapes = [
        (GgmlType::Q4_0, 70, 512, 1),
        (GgmlType::Q4_K, 33, 512, 1),
        (GgmlType::Q6_K, 200, 256, 3),
        (GgmlType::Q8_0, 5, 64, 6),
        (GgmlType::F16, 40, 100, 2),
        (GgmlType::Q4_0, 1, 32, 1),
    ];
    let problems: Vec<_> = shapes
        .iter()
        .enumerate()
        .map(|(k, &(ty, rows, cols, n))| (ty, rows, cols, problem(ty, rows, cols, n, k as u64)))
        .collect();
    for isa in available_isas() {
        let views: Vec<WeightView> = problems
            .iter()
            .map(|(ty, rows, cols, (data, _))| WeightView::new(*ty, *rows, *cols, data).unwrap())
            .collect();
        let separate: Vec<Vec<f32>> = views
            .iter()
            .zip(&problems)
            .map(|(w, (.., (_, acts)))| matmul_on(isa, w, acts))
            .collect();
        let mut outs: Vec<Vec<f32>> = separate.iter().map(|o| vec![0f32; o.len()]).collect();
        let mut jobs: Vec<MatmulJob> = views
            .iter()
            .zip(&problems)
            .zip(outs.iter_mut())
            .map(|((w, (.., (_, acts))), out)| MatmulJob { w: *w, acts, out })
            .collect();
        matmul_many_on(isa, &mut jobs).unwrap();
        for (k, (a, b)) in outs.iter().zip(&separate).enumerate() {
            assert_eq!(bits(a), bits(b), "{isa} job {k}");
        }
    }
}

#[test]
fn matmul_bits_do_not_depend_on_thread_count_on_any_isa() {
    let pool = |n| rayon::ThreadPoolBuilder::new().num_threads(n).build().unwrap();
    let (one, two) = (pool(1), pool(2));
    for isa in available_isas() {
        for ty in [
            GgmlType::Q4_0,
            GgmlType::Q8_0,
            GgmlType::Q4_K,
            GgmlType::Q5_K,
            GgmlType::Q6_K,
            GgmlType::F32,
            GgmlType::MXFP4,
        ] {
            let (data, acts) = problem(ty, 300, 512, 5, 3);
            let w = WeightView::new(ty, 300, 512, &data).unwrap();
            let a = one.install(|| matmul_on(isa, &w, &acts));
            let b = two.install(|| matmul_on(isa, &w, &acts));
            assert_eq!(bits(&a), bits(&b), "{isa} {ty}");
        }
    }
}

#[test]
fn a_chosen_isa_runs_its_own_kernels() {
    for isa in available_isas() {
        for ty in [
            GgmlType::Q4_0,
            GgmlType::Q8_0,
            GgmlType::Q4_K,
            GgmlType::Q5_K,
            GgmlType::Q6_K,
            GgmlType::F32,
            GgmlType::F16,
            GgmlType::MXFP4,
            GgmlType::Q4_1,
            GgmlType::Q5_1,
            GgmlType::Q5_0,
            GgmlType::Q3_K,
            GgmlType::Q2_K,
            GgmlType::BF16,
        ] {
            assert_eq!(dot_kernel(isa, ty, WeightLayout::Plain).isa, isa, "{ty}");
        }
        // Formats without SIMD kernels fall back to their scalar twin.
        assert_eq!(dot_kernel(isa, GgmlType::Q8_K, WeightLayout::Plain).isa, Isa::Scalar);
    }
    for isa in Isa::ALL.into_iter().filter(|i| !i.is_available()) {
        assert!(set_isa(isa).is_err(), "{isa} is not on this CPU");
        assert_eq!(dot_kernel(isa, GgmlType::Q4_0, WeightLayout::Plain).isa, Isa::Scalar);
    }
    // Re-selecting the current ISA is always allowed (and changes nothing, as every path agrees).
    set_isa(isa()).unwrap();
}

#[test]
fn gathered_rows_are_byte_copies() {
    let (_, acts) = problem(GgmlType::Q4_K, 1, 512, 4, 9);
    let mut g = Activations::new();
    g.gather_from(&acts, &[3, 0, 3]);
    assert_eq!((g.rows(), g.cols(), g.act_type()), (3, 512, GgmlType::Q8_K));
    assert_eq!(g.row(0), acts.row(3));
    assert_eq!(g.row(1), acts.row(0));
    assert_eq!(g.row(2), acts.row(3));
    g.gather_from(&acts, &[]);
    assert_eq!(g.rows(), 0);
}

#[test]
#[should_panic(expected = "row 4 requested from activations of 4 rows")]
fn gathering_a_missing_row_panics() {
    let (_, acts) = problem(GgmlType::Q8_0, 1, 64, 4, 9);
    Activations::new().gather_from(&acts, &[0, 4]);
}

/// Inputs at every threshold of `expf`'s branches (a few ulps either side, both signs), the special
/// values, and a sweep over every 97th bit pattern (44 million values: every exponent, sign and range).
fn exp_inputs() -> Vec<f32> {
    let thresholds = [
        0x3900_0000u32,
        0x3eb1_7218,
        0x3f85_1592,
        0x42ae_ac50,
        0x42b1_7218,
        0x42cf_f1b5,
        0x7f80_0000,
    ];
    let mut x: Vec<f32> = thresholds
        .iter()
        .flat_map(|&t| (t - 3..=t + 3).flat_map(|b| [f32::from_bits(b), -f32::from_bits(b)]))
        .collect();
    x.extend([
        0.0,
        -0.0,
        1.0,
        -1.0,
        f32::MIN_POSITIVE,
        1e-45,
        f32::MAX,
        f32::MIN,
        f32::NAN,
        -f32::NAN,
    ]);
    x.extend((0..=u32::MAX / 97).map(|i| f32::from_bits(i * 97)));
    x
}

#[test]
fn exp_matches_libm_bit_for_bit_on_every_isa() {
    let x = exp_inputs();
    let mut expected = x.clone();
    crate::activation::exp_scalar(&mut expected);
    for isa in simd_isas() {
        let mut got = x.clone();
        crate::activation::exp_in_place_on(isa, &mut got);
        let bad = got
            .iter()
            .zip(&expected)
            .zip(&x)
            .find(|((g, e), _)| g.to_bits() != e.to_bits());
        assert!(
            bad.is_none(),
            "{isa}: exp({:e} = {:#x}) gives {:e}, libm {:e}",
            bad.unwrap().1,
            bad.unwrap().1.to_bits(),
            bad.unwrap().0 .0,
            bad.unwrap().0 .1
        );
    }
}

#[test]
fn silu_in_place_matches_scalar_silu_on_every_isa() {
    let mut rng = Rng::new(19);
    // Lengths around the 8 lanes and the 64-element chunks, inputs over exp's whole range.
    let x: Vec<f32> = exp_inputs()
        .into_iter()
        .step_by(997)
        .chain((0..3000).map(|_| rng.normal() * 30.0))
        .collect();
    for len in [0, 1, 7, 8, 9, 63, 64, 65, 1000, x.len()] {
        let expected: Vec<f32> = x[..len].iter().map(|&v| crate::activation::silu(v)).collect();
        for isa in std::iter::once(Isa::Scalar).chain(simd_isas()) {
            let mut got = x[..len].to_vec();
            crate::activation::silu_in_place_on(isa, &mut got);
            assert_eq!(bits(&got), bits(&expected), "{isa}, {len} elements");
        }
    }
}

#[test]
fn silu_mul_matches_scalar_on_every_isa() {
    let mut rng = Rng::new(17);
    // Lengths around the 8 lanes, and gates over exp's whole range (its special values included).
    let gates: Vec<f32> = exp_inputs()
        .into_iter()
        .step_by(1001)
        .chain((0..3000).map(|_| rng.normal() * 30.0))
        .collect();
    for len in [0, 1, 7, 8, 9, 1000, gates.len()] {
        let up: Vec<f32> = (0..len).map(|_| rng.normal()).collect();
        let mut expected = gates[..len].to_vec();
        crate::activation::silu_mul_scalar(&mut expected, &up);
        for isa in simd_isas() {
            let mut got = gates[..len].to_vec();
            crate::activation::silu_mul_on(isa, &mut got, &up);
            assert_eq!(bits(&got), bits(&expected), "{isa}, {len} elements");
        }
    }
}
