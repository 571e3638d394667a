//! Matmul throughput at MoE shapes, per instruction set and thread count, against the memory floor.
//!
//! `cargo run --release -p titan-kernels --example matmul_speed [-- --quick] [--isa NAME]`
//! (`--isa avx512` measures that instruction set only.)
//!
//! - Memory read bandwidth: a sum over a 1 GiB buffer, 1 and 2 threads (the decode floor).
//! - Decode (matvec, one activation row): GB/s of weights streamed. Weights are cycled through a 1 GiB
//!   pool of copies, larger than any cache, so every call reads from memory as decode does.
//! - Prefill (64 activation rows): GFLOP/s (2 · rows · cols · 64 per call); the LM head is skipped
//!   there (tens of GFLOP per call on the scalar path).
//! - `matmul_many`: one MoE layer's decode (8 experts × gate and up) as 16 `matmul` calls vs one
//!   `matmul_many`.
//!
//! Weights are random bytes, MXFP4's exponents aside: speed does not depend on the values (no
//! subnormal arithmetic arises).

use std::hint::black_box;
use std::time::{Duration, Instant};

use titan_kernels::splitmix::SplitMix64;

use titan_kernels::{
    available_isas, kernel_isa, matmul, matmul_many, set_isa, Activations, GgmlType, Isa, MatmulJob, WeightView,
};

const POOL_BYTES: usize = 1 << 30;

struct Shape {
    name: &'static str,
    rows: usize,
    cols: usize,
    prefill: bool,
}

const SHAPES: [Shape; 4] = [
    Shape {
        name: "expert gate/up 768x2048",
        rows: 768,
        cols: 2048,
        prefill: true,
    },
    Shape {
        name: "expert down 2048x768",
        rows: 2048,
        cols: 768,
        prefill: true,
    },
    Shape {
        name: "attention 4096x2048",
        rows: 4096,
        cols: 2048,
        prefill: true,
    },
    Shape {
        name: "LM head 151936x2048",
        rows: 151936,
        cols: 2048,
        prefill: false,
    },
];

const TYPES: [GgmlType; 5] = [
    GgmlType::Q4_0,
    GgmlType::Q8_0,
    GgmlType::Q4_K,
    GgmlType::Q6_K,
    GgmlType::MXFP4,
];

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let quick = args.iter().any(|a| a == "--quick");
    let only_isa = args
        .iter()
        .position(|a| a == "--isa")
        .and_then(|i| args.get(i + 1))
        .cloned();
    let isas: Vec<Isa> = available_isas()
        .into_iter()
        .filter(|i| only_isa.as_deref().is_none_or(|n| i.name().eq_ignore_ascii_case(n)))
        .collect();
    let min_time = Duration::from_millis(if quick { 100 } else { 300 });
    let pools: Vec<rayon::ThreadPool> = [1, 2]
        .iter()
        .map(|&n| rayon::ThreadPoolBuilder::new().num_threads(n).build())
        .collect::<Result<_, _>>()?;

    let mut pool_data = random_bytes(POOL_BYTES, 1);
    // MXFP4's exponent bytes (one per 17, and every weight matrix starts at a multiple of 17 bytes)
    // set to scales 2^-8 .. 2^-1: random ones would make some products subnormal, which x86 CPUs
    // compute in microcode, many times slower, so the rows would measure the assists, not the kernel.
    for (i, e) in pool_data.iter_mut().step_by(17).enumerate() {
        *e = 120 + (i % 8) as u8;
    }
    println!("ISAs available: {:?}", available_isas());
    println!("\n## Memory read bandwidth (sum over 1 GiB)");
    for (t, pool) in pools.iter().enumerate() {
        let gbs = pool.install(|| read_bandwidth(&pool_data));
        println!("{} thread(s): {gbs:.1} GB/s", t + 1);
    }

    let mut rng_seed = 2;
    for ty in TYPES {
        println!("\n## {ty} (activations {})", ty.act_type());
        println!("| shape | ISA | decode 1T GB/s | decode 2T GB/s | prefill64 1T GFLOP/s | prefill64 2T GFLOP/s |");
        println!("|---|---|---|---|---|---|");
        for shape in &SHAPES {
            let bytes = ty.row_bytes(shape.cols).expect("whole blocks") * shape.rows;
            let copies = (POOL_BYTES / bytes).max(1);
            let x1 = random_f32(shape.cols, rng_seed);
            let x64 = random_f32(64 * shape.cols, rng_seed + 1);
            rng_seed += 2;
            let (mut a1, mut a64) = (Activations::new(), Activations::new());
            a1.quantize(ty.act_type(), &x1, 1, shape.cols)?;
            a64.quantize(ty.act_type(), &x64, 64, shape.cols)?;
            let view = |k: usize| WeightView::new(ty, shape.rows, shape.cols, &pool_data[k * bytes..(k + 1) * bytes]);
            for &isa in &isas {
                set_isa(isa)?;
                let mut cells = Vec::new();
                for pool in &pools {
                    let mut out = vec![0f32; shape.rows];
                    let mut k = 0;
                    let secs = pool.install(|| {
                        time_per_call(min_time, || {
                            let w = view(k % copies).expect("pool slice");
                            k += 1;
                            matmul(&w, &a1, &mut out).expect("matmul");
                        })
                    });
                    cells.push(format!("{:.1}", bytes as f64 / secs / 1e9));
                }
                for pool in &pools {
                    if !shape.prefill {
                        cells.push("-".into());
                        continue;
                    }
                    let mut out = vec![0f32; 64 * shape.rows];
                    let w = view(0)?;
                    let secs = pool.install(|| time_per_call(min_time, || matmul(&w, &a64, &mut out).expect("matmul")));
                    let flops = 2.0 * 64.0 * (shape.rows * shape.cols) as f64;
                    cells.push(format!("{:.1}", flops / secs / 1e9));
                }
                println!("| {} | {} | {} |", shape.name, kernel_isa(ty), cells.join(" | "));
            }
        }
    }

    println!("\n## One MoE layer's decode: 8 experts x (gate, up) 768x2048, 2 threads");
    println!("| type | ISA | 16 x matmul: us, GB/s | matmul_many: us, GB/s |");
    println!("|---|---|---|---|");
    for ty in [GgmlType::Q4_0, GgmlType::Q4_K] {
        let (rows, cols) = (768, 2048);
        let bytes = ty.row_bytes(cols).expect("whole blocks") * rows;
        let copies = POOL_BYTES / bytes;
        let mut a1 = Activations::new();
        a1.quantize(ty.act_type(), &random_f32(cols, 99), 1, cols)?;
        let views: Vec<WeightView> = (0..copies)
            .map(|k| WeightView::new(ty, rows, cols, &pool_data[k * bytes..(k + 1) * bytes]))
            .collect::<Result<_, _>>()?;
        for &isa in &isas {
            set_isa(isa)?;
            let mut outs = vec![vec![0f32; rows]; 16];
            let mut next = 0;
            let separate = pools[1].install(|| {
                time_per_call(min_time, || {
                    for out in outs.iter_mut() {
                        matmul(&views[next % copies], &a1, out).expect("matmul");
                        next += 1;
                    }
                })
            });
            let many = pools[1].install(|| {
                time_per_call(min_time, || {
                    let mut jobs: Vec<MatmulJob> = outs
                        .iter_mut()
                        .enumerate()
                        .map(|(j, out)| MatmulJob {
                            w: views[(next + j) % copies],
                            acts: &a1,
                            out,
                        })
                        .collect();
                    next += 16;
                    matmul_many(&mut jobs).expect("matmul_many");
                })
            });
            let gbs = |s: f64| 16.0 * bytes as f64 / s / 1e9;
            println!(
                "| {ty} | {} | {:.0}, {:.1} | {:.0}, {:.1} |",
                kernel_isa(ty),
                separate * 1e6,
                gbs(separate),
                many * 1e6,
                gbs(many)
            );
        }
    }
    set_isa(*available_isas().last().unwrap_or(&Isa::Scalar))?;
    Ok(())
}

/// Seconds per call of `f`, averaged over at least `min_time` (after one warm-up call).
fn time_per_call(min_time: Duration, mut f: impl FnMut()) -> f64 {
    f();
    let start = Instant::now();
    let mut calls = 0u32;
    while start.elapsed() < min_time || calls < 3 {
        f();
        calls += 1;
    }
    start.elapsed().as_secs_f64() / f64::from(calls)
}

/// GB/s of a sum over `data` on the current rayon pool, one contiguous part per thread (best of
/// three passes).
fn read_bandwidth(data: &[u8]) -> f64 {
    use rayon::prelude::*;
    let part = data.len().div_ceil(rayon::current_num_threads());
    let mut best = f64::MAX;
    for _ in 0..3 {
        let start = Instant::now();
        let total = data
            .par_chunks(part)
            .map(|chunk| {
                chunk
                    .chunks_exact(8)
                    .map(|b| u64::from_le_bytes(b.try_into().unwrap_or([0; 8])))
                    .fold(0u64, u64::wrapping_add)
            })
            .reduce(|| 0, u64::wrapping_add);
        black_box(total);
        best = best.min(start.elapsed().as_secs_f64());
    }
    data.len() as f64 / best / 1e9
}

fn random_bytes(n: usize, seed: u64) -> Vec<u8> {
    let mut state = SplitMix64(seed);
    let mut v = Vec::with_capacity(n);
    while v.len() < n {
        v.extend_from_slice(&state.next_u64().to_le_bytes());
    }
    v.truncate(n);
    v
}

fn random_f32(n: usize, seed: u64) -> Vec<f32> {
    let mut state = SplitMix64(seed);
    (0..n)
        .map(|_| (state.next_u64() >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0)
        .collect()
}
