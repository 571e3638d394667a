//! Prefill GFLOP per second of this thread's CPU time (from /proc/thread-self/schedstat), one thread:
//! a measure that stays meaningful on a shared machine. Linux only.
//!
//! `cargo run --release -p titan-kernels --example prefill_cpu [-- ROWS]`: each format with ROWS
//! activation rows (default 64), a second of calls each.
//!
//! `cargo run --release -p titan-kernels --example prefill_cpu -- --per-row [ROUNDS]`: Q4_0 and Q8_0
//! regrouped (as loaded) with 1 to 8 activation rows, the row counts interleaved over ROUNDS rounds
//! (default 20) so that the machine's drift hits them all alike; medians. A kernel call takes up to 8
//! rows, so a count that does less work per row than a smaller one shows a kernel compiled worse for it.

use std::time::Instant;

use titan_kernels::{matmul, regroup_weights, Activations, GgmlType, WeightLayout, WeightView};

const ROWS: usize = 768;
const COLS: usize = 2048;

fn cpu_ns() -> u64 {
    std::fs::read_to_string("/proc/thread-self/schedstat")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

/// A `ROWS` × `COLS` matrix of random `ty` bytes (Q4_0 and Q8_0 with sane f16 scales: random bytes can be
/// NaN or inf; speed does not care, but keep it tidy).
fn random_matrix(ty: GgmlType, next: &mut impl FnMut() -> u64) -> Vec<u8> {
    let bytes = ty.row_bytes(COLS).unwrap() * ROWS;
    let mut data: Vec<u8> = (0..bytes).map(|_| next() as u8).collect();
    if ty == GgmlType::Q4_0 || ty == GgmlType::Q8_0 {
        for b in data.chunks_exact_mut(ty.block_bytes()) {
            b[..2].copy_from_slice(&[0x00, 0x3c]);
        }
    }
    data
}

fn random_acts(
    ty: GgmlType,
    n_act: usize,
    next: &mut impl FnMut() -> u64,
) -> Result<Activations, Box<dyn std::error::Error>> {
    let x: Vec<f32> = (0..n_act * COLS)
        .map(|_| (next() % 2000) as f32 / 1000.0 - 1.0)
        .collect();
    let mut acts = Activations::new();
    acts.quantize(ty.act_type(), &x, n_act, COLS)?;
    Ok(acts)
}

/// Calls `matmul` for `secs` seconds; (wall seconds, CPU seconds) per call.
fn time_calls(w: &WeightView, acts: &Activations, out: &mut [f32], secs: f64) -> (f64, f64) {
    matmul(w, acts, out).unwrap();
    let (t0, c0) = (Instant::now(), cpu_ns());
    let mut calls = 0;
    while t0.elapsed().as_secs_f64() < secs {
        matmul(w, acts, out).unwrap();
        calls += 1;
    }
    (
        t0.elapsed().as_secs_f64() / calls as f64,
        (cpu_ns() - c0) as f64 * 1e-9 / calls as f64,
    )
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let pool = rayon::ThreadPoolBuilder::new().num_threads(1).build()?;
    let mut state = 7u64;
    let mut next = move || {
        state = state
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        state >> 33
    };
    if args.first().is_some_and(|a| a == "--per-row") {
        let rounds: usize = args.get(1).and_then(|a| a.parse().ok()).unwrap_or(20);
        for ty in [GgmlType::Q4_0, GgmlType::Q8_0] {
            let data = random_matrix(ty, &mut next);
            let mut regrouped = vec![0u8; data.len()];
            assert!(regroup_weights(ty, COLS, &data, &mut regrouped));
            let w = WeightView {
                data: &regrouped,
                layout: WeightLayout::Regrouped,
                ..WeightView::new(ty, ROWS, COLS, &data)?
            };
            let acts: Vec<Activations> = (1..=8)
                .map(|n| random_acts(ty, n, &mut next))
                .collect::<Result<_, _>>()?;
            let mut gflops = vec![Vec::new(); 8];
            pool.install(|| {
                for _ in 0..rounds {
                    for (n, a) in acts.iter().enumerate() {
                        let mut out = vec![0f32; (n + 1) * ROWS];
                        let (_, cpu) = time_calls(&w, a, &mut out, 0.05);
                        gflops[n].push(2.0 * ((n + 1) * ROWS * COLS) as f64 / cpu / 1e9);
                    }
                }
            });
            println!("{ty}g, {ROWS} x {COLS}, median GFLOP/s per CPU second over {rounds} rounds:");
            for (n, g) in gflops.iter_mut().enumerate() {
                g.sort_by(f64::total_cmp);
                println!(
                    "  {} rows: {:.1} ({:.1}–{:.1})",
                    n + 1,
                    g[g.len() / 2],
                    g[0],
                    g[g.len() - 1]
                );
            }
        }
        return Ok(());
    }
    let n_act: usize = args.first().and_then(|a| a.parse().ok()).unwrap_or(64);
    for ty in [GgmlType::Q4_0, GgmlType::Q8_0, GgmlType::Q4_K, GgmlType::Q6_K] {
        let data = random_matrix(ty, &mut next);
        let acts = random_acts(ty, n_act, &mut next)?;
        let plain = WeightView::new(ty, ROWS, COLS, &data)?;
        // Q4_0 and Q8_0 also as regrouped at load (`regroup_weights`).
        let mut regrouped = vec![0u8; data.len()];
        let layouts = if regroup_weights(ty, COLS, &data, &mut regrouped) {
            2
        } else {
            1
        };
        for w in [
            plain,
            WeightView {
                data: &regrouped,
                layout: WeightLayout::Regrouped,
                ..plain
            },
        ]
        .iter()
        .take(layouts)
        {
            let mut out = vec![0f32; n_act * ROWS];
            let (secs, cpu) = pool.install(|| time_calls(w, &acts, &mut out, 1.0));
            let flops = 2.0 * (n_act * ROWS * COLS) as f64;
            let name = if w.layout == WeightLayout::Regrouped {
                format!("{ty}g")
            } else {
                ty.to_string()
            };
            println!(
                "{name}: {:.1} GFLOP/s per CPU second ({:.1} wall)",
                flops / cpu / 1e9,
                flops / secs / 1e9
            );
        }
    }
    Ok(())
}
