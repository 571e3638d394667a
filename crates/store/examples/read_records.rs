//! Time the record read path of a store, either layout:
//! `read_records MODEL.gguf STORE [N] [SEED] [--no-verify]`.
//!
//! Reads N records (default 200) chosen at random with a fixed seed — the same records for either
//! layout of the same model — one at a time through `Store::read` with O_DIRECT, so that every read
//! reaches the disk whatever the page cache holds (dropping the page cache needs root and slows
//! everyone else on the machine). Digests are checked, as in a run, unless `--no-verify` (which leaves
//! the reads alone to be timed). Prints one JSON line.

use std::path::Path;
use std::time::Instant;

use titan_gguf::GgufFile;
use titan_store::{Store, StoreOptions};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let verify_digests = !args.iter().any(|a| a == "--no-verify");
    let args: Vec<&String> = args.iter().filter(|a| *a != "--no-verify").collect();
    let [_, model, store, rest @ ..] = &args[..] else {
        return Err("usage: read_records MODEL.gguf STORE [N] [SEED] [--no-verify]".into());
    };
    let n: usize = rest.first().map_or(Ok(200), |s| s.parse())?;
    let mut seed: u64 = rest.get(1).map_or(Ok(1), |s| s.parse())?;
    let gguf = GgufFile::open(model)?;
    let opts = StoreOptions {
        direct_io: true,
        verify_digests,
    };
    let store = Store::open_with(Path::new(store), &gguf, &opts)?;
    let keys: Vec<(usize, usize)> = store.records().collect();
    let mut bytes = 0u64;
    let start = Instant::now();
    for _ in 0..n {
        // xorshift64: a reproducible choice, the same for both layouts.
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        let (layer, expert) = keys[(seed % keys.len() as u64) as usize];
        bytes += store.read(layer, expert)?.resident_bytes();
    }
    let secs = start.elapsed().as_secs_f64();
    println!(
        "{{\"layout\": \"{:?}\", \"digests\": {verify_digests}, \"records\": {n}, \"bytes_read\": {bytes}, \"seconds\": {secs:.4}, \
         \"ms_per_record\": {:.3}, \"mb_per_s\": {:.1}}}",
        store.layout(),
        secs * 1e3 / n as f64,
        bytes as f64 / secs / 1e6
    );
    Ok(())
}
