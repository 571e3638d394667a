//! Time the record read path of a store, either layout:
//! `read_records MODEL.gguf STORE [N | SHARE] [SEED] [--no-verify] [--threads T]`.
//!
//! Reads N records (default 200; a share such as `0.5`: half as many as the store holds) chosen at
//! random with a fixed seed — the same records for either layout of the same model — through
//! `Store::read` with O_DIRECT, so that every read reaches the disk whatever the page cache holds
//! (dropping the page cache needs root and slows everyone else on the machine). T threads (default 1)
//! read at once, each its share of the records, as the expert cache's I/O threads do: with
//! `--no-verify --threads 8` this is the disk's read bandwidth at the record size, the divisor of the
//! streaming floor. Digests are checked, as in a run, unless `--no-verify` (which leaves the reads
//! alone to be timed). Prints one JSON line.

use std::path::Path;
use std::time::Instant;

use titan_gguf::GgufFile;
use titan_store::{Store, StoreOptions};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args: Vec<String> = std::env::args().collect();
    let verify_digests = !args.iter().any(|a| a == "--no-verify");
    args.retain(|a| a != "--no-verify");
    let mut threads = 1usize;
    if let Some(p) = args.iter().position(|a| a == "--threads") {
        threads = args.get(p + 1).ok_or("--threads needs a count")?.parse()?;
        args.drain(p..p + 2);
    }
    let [_, model, store, rest @ ..] = &args[..] else {
        return Err("usage: read_records MODEL.gguf STORE [N | SHARE] [SEED] [--no-verify] [--threads T]".into());
    };
    let count = rest.first().map_or("200", |s| s.as_str());
    // xorshift64 stays at 0 from 0.
    let mut seed: u64 = rest.get(1).map_or(Ok(1), |s| s.parse())?.max(1);
    let gguf = GgufFile::open(model)?;
    let opts = StoreOptions {
        direct_io: true,
        verify_digests,
    };
    let store = Store::open_with(Path::new(store), &gguf, &opts)?;
    let keys: Vec<(usize, usize)> = store.records().collect();
    let n: usize = if count.contains('.') {
        (count.parse::<f64>()? * keys.len() as f64).round() as usize
    } else {
        count.parse()?
    };
    let chosen: Vec<(usize, usize)> = (0..n)
        .map(|_| {
            // xorshift64: a reproducible choice, the same for both layouts.
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            keys[(seed % keys.len() as u64) as usize]
        })
        .collect();
    let start = Instant::now();
    let bytes = std::thread::scope(|s| {
        let workers: Vec<_> = chosen
            .chunks(n.div_ceil(threads.max(1)).max(1))
            .map(|part| {
                let store = &store;
                s.spawn(move || -> Result<u64, titan_store::StoreError> {
                    part.iter().map(|&(l, e)| Ok(store.read(l, e)?.resident_bytes())).sum()
                })
            })
            .collect();
        workers
            .into_iter()
            .map(|w| w.join().expect("reader thread"))
            .sum::<Result<u64, _>>()
    })?;
    let secs = start.elapsed().as_secs_f64();
    println!(
        "{{\"layout\": \"{:?}\", \"digests\": {verify_digests}, \"threads\": {threads}, \"records\": {n}, \"bytes_read\": {bytes}, \
         \"seconds\": {secs:.4}, \"ms_per_record\": {:.3}, \"mb_per_s\": {:.1}}}",
        store.layout(),
        secs * 1e3 / n as f64,
        bytes as f64 / secs / 1e6
    );
    Ok(())
}
