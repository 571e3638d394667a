//! Prefill (64 rows) GFLOP per second of this thread's CPU time (from /proc/thread-self/schedstat),
//! one thread: a measure that stays meaningful on a shared machine. Linux only.
//!
//! `cargo run --release -p titan-kernels --example prefill_cpu [-- ROWS]`

use std::time::Instant;

use titan_kernels::{matmul, regroup_weights, Activations, GgmlType, WeightLayout, WeightView};

fn cpu_ns() -> u64 {
    std::fs::read_to_string("/proc/thread-self/schedstat")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let n_act: usize = std::env::args().nth(1).and_then(|a| a.parse().ok()).unwrap_or(64);
    let pool = rayon::ThreadPoolBuilder::new().num_threads(1).build()?;
    let (rows, cols) = (768, 2048);
    let mut state = 7u64;
    let mut next = || {
        state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        state >> 33
    };
    for ty in [GgmlType::Q4_0, GgmlType::Q8_0, GgmlType::Q4_K, GgmlType::Q6_K] {
        let bytes = ty.row_bytes(cols).unwrap() * rows;
        let mut data: Vec<u8> = (0..bytes).map(|_| next() as u8).collect();
        // Sane f16 scales (random bytes can be NaN/inf; speed does not care, but keep it tidy).
        if ty == GgmlType::Q4_0 || ty == GgmlType::Q8_0 {
            for b in data.chunks_exact_mut(ty.block_bytes()) {
                b[..2].copy_from_slice(&[0x00, 0x3c]);
            }
        }
        let x: Vec<f32> = (0..n_act * cols).map(|_| (next() % 2000) as f32 / 1000.0 - 1.0).collect();
        let mut acts = Activations::new();
        acts.quantize(ty.act_type(), &x, n_act, cols)?;
        let plain = WeightView::new(ty, rows, cols, &data)?;
        // Q4_0 and Q8_0 also as regrouped at load (`regroup_weights`).
        let mut regrouped = vec![0u8; data.len()];
        let layouts = if regroup_weights(ty, cols, &data, &mut regrouped) { 2 } else { 1 };
        for w in [plain, WeightView { data: &regrouped, layout: WeightLayout::Regrouped, ..plain }].iter().take(layouts) {
            let mut out = vec![0f32; n_act * rows];
            let (secs, cpu) = pool.install(|| {
                matmul(w, &acts, &mut out).unwrap();
                let (t0, c0) = (Instant::now(), cpu_ns());
                let mut calls = 0;
                while t0.elapsed().as_secs_f64() < 1.0 {
                    matmul(w, &acts, &mut out).unwrap();
                    calls += 1;
                }
                (t0.elapsed().as_secs_f64() / calls as f64, (cpu_ns() - c0) as f64 * 1e-9 / calls as f64)
            });
            let flops = 2.0 * (n_act * rows * cols) as f64;
            let name = if w.layout == WeightLayout::Regrouped { format!("{ty}g") } else { ty.to_string() };
            println!("{name}: {:.1} GFLOP/s per CPU second ({:.1} wall)", flops / cpu / 1e9, flops / secs / 1e9);
        }
    }
    Ok(())
}
