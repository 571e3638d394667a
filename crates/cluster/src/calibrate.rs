//! How fast this machine multiplies quantised weights by one activation row — decode's work, bound by
//! memory bandwidth and the kernels — measured the same way on every node and on the backbone, so that a
//! plan can give a machine twice as fast twice the experts and twice the rows.

use std::time::{Duration, Instant};

use titan_kernels::{matmul, Activations, GgmlType, WeightLayout, WeightView};

/// Columns and rows of the probe's Q8_0 matrix: 36 MB, more than the last-level cache of the machines
/// TITAN targets, so that it measures the memory path decode takes.
const COLS: usize = 8192;
const ROWS: usize = 4096;

/// Bytes of weights multiplied per second, over passes of the probe matrix for about `time` (at least two
/// passes in each of three windows, the median window's rate): the throughput of this process's thread
/// pool, as its quota and its neighbours allow.
pub fn weight_throughput(time: Duration) -> f64 {
    let row_bytes = GgmlType::Q8_0.row_bytes(COLS).expect("whole blocks");
    // Q8_0 blocks of scale 1.0 (f16 0x3C00) and small quants: finite products, as real weights give.
    let mut plain = vec![0u8; row_bytes * ROWS];
    for (i, block) in plain.chunks_exact_mut(34).enumerate() {
        block[..2].copy_from_slice(&0x3C00u16.to_le_bytes());
        for (j, q) in block[2..].iter_mut().enumerate() {
            *q = ((i * 7 + j * 13) % 31) as u8;
        }
    }
    let regrouped = titan_layout::regroup::regrouped(GgmlType::Q8_0, COLS, &plain);
    let (data, layout) = match &regrouped {
        Some(r) => (&r[..], WeightLayout::Regrouped),
        None => (&plain[..], WeightLayout::Plain),
    };
    let w = WeightView {
        ty: GgmlType::Q8_0,
        rows: ROWS,
        cols: COLS,
        data,
        layout,
    };
    let x: Vec<f32> = (0..COLS).map(|i| (i as f32 * 0.01).sin()).collect();
    let mut acts = Activations::new();
    let mut out = vec![0f32; ROWS];
    if acts.quantize(GgmlType::Q8_0, &x, 1, COLS).is_err() || matmul(&w, &acts, &mut out).is_err() {
        return 0.0;
    }
    // The median of three windows: one disturbed by a neighbour's burst moves nothing.
    let mut windows = [0f64; 3];
    for speed in &mut windows {
        let start = Instant::now();
        let mut passes = 0u64;
        while passes < 2 || start.elapsed() < time / 3 {
            if matmul(&w, &acts, &mut out).is_err() {
                return 0.0;
            }
            passes += 1;
        }
        *speed = (passes * (row_bytes * ROWS) as u64) as f64 / start.elapsed().as_secs_f64();
    }
    std::hint::black_box(&out);
    windows.sort_by(f64::total_cmp);
    windows[1]
}

#[cfg(test)]
mod tests {
    /// A throughput, and a plausible one: more than 100 MB/s on any machine that runs the tests.
    #[test]
    fn the_probe_measures_a_throughput() {
        let t = super::weight_throughput(std::time::Duration::from_millis(20));
        assert!(t > 1e8, "{t} B/s");
    }
}
