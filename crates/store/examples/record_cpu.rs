//! The CPU time an I/O thread spends on one streamed record besides the read itself, by step:
//! `cargo run --release -p titan-store --example record_cpu [-- ROUNDS]`.
//!
//! A record shaped as a Qwen3-30B-A3B Q4_0 expert (three 768 × 2048 matrices, 2.65 MB) goes through what
//! `Store::read` and `ExpertRecord::regroup` do around the `pread`s: its buffer mapped, every page
//! written (as a read fills it) and unmapped; its BLAKE3 digest; its matrices regrouped in place for the
//! SIMD kernels. The records are cycled through about 800 MB so that each step reads memory, not cache, as
//! after a read from disk. On a machine of two cores this time is taken from the computation.

use std::time::Instant;

use titan_kernels::{regroup_weights_in_place, GgmlType};
use titan_store::AlignedBuf;

const COLS: usize = 2048;
const ROW_BYTES: usize = COLS / 32 * 18;
const RECORD_BYTES: usize = 3 * 768 * ROW_BYTES;
const RECORDS: usize = 300;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let rounds: usize = std::env::args().nth(1).map_or(Ok(3), |s| s.parse())?;
    let pool: Vec<u8> = (0..RECORDS * RECORD_BYTES)
        .map(|i| (i as u32).wrapping_mul(2_654_435_761) as u8)
        .collect();
    let ms = |t: Instant| t.elapsed().as_secs_f64() * 1e3 / RECORDS as f64;
    println!("per {:.2} MB record, ms:", RECORD_BYTES as f64 / 1e6);
    for round in 1..=rounds {
        let t = Instant::now();
        for _ in 0..RECORDS {
            let mut buf = AlignedBuf::zeroed(RECORD_BYTES, 4096).ok_or("cannot map a record")?;
            for page in buf.as_mut_slice().chunks_mut(4096) {
                page[0] = 1;
            }
            std::hint::black_box(&buf);
        }
        let map = ms(t);

        let t = Instant::now();
        for record in pool.chunks_exact(RECORD_BYTES) {
            std::hint::black_box(blake3::hash(record));
        }
        let digest = ms(t);

        let mut records = pool.clone();
        let t = Instant::now();
        for record in records.chunks_exact_mut(RECORD_BYTES) {
            regroup_weights_in_place(GgmlType::Q4_0, COLS, record);
        }
        let regroup = ms(t);
        println!("round {round}: map, fill and unmap {map:.2}; digest {digest:.2}; regroup {regroup:.2}");
    }
    Ok(())
}
