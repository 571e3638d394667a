//! The two layouts of the committed fixture models serve the same experts: the copy (`experts.bin`)
//! and the in-place index over the GGUF give every expert the same digest and the same bytes, buffered
//! and with O_DIRECT.

use std::path::{Path, PathBuf};

use titan_gguf::GgufFile;
use titan_store::{convert, write_index, ConvertOptions, Layout, Store, StoreOptions, MANIFEST_FILE};

/// Q4_0, a K-quant mix (Q4_K_M: Q4_K and Q6_K experts) and Q8_0, of two architectures.
const FILES: &[&str] = &["qwen3moe/q4_0.gguf", "qwen3moe-k/q4_k_m.gguf", "olmoe/q8_0.gguf"];

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures")
}

#[test]
fn copy_and_in_place_give_identical_digests_and_bytes() {
    // Beside the test binary, on the build disk: O_DIRECT needs a real filesystem.
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let mut unaligned = 0;
    for f in FILES {
        let gguf = GgufFile::open(fixtures().join(f)).unwrap();
        let name = f.replace('/', "_");
        let copy = dir.path().join(&name).with_extension("titan");
        let manifest = convert(&gguf, &copy, &ConvertOptions::default(), &mut |_, _| {}).unwrap();
        let in_place = dir.path().join(&name).with_extension("titan-index");
        let index = write_index(&gguf, &in_place, false, &mut |_, _| {}).unwrap();

        // The model's identity is the same digests, expert by expert.
        assert_eq!(manifest.layers, index.layers, "{f}");
        let copied: Vec<String> = manifest.records.iter().map(|r| r.blake3.clone()).collect();
        let indexed: Vec<String> = index
            .digests
            .iter()
            .map(|d| blake3::Hash::from_bytes(*d).to_hex().to_string())
            .collect();
        assert_eq!(copied, indexed, "{f}");
        assert_eq!(manifest.source, index.source, "{f}");
        assert!(copy.join(MANIFEST_FILE).exists());
        for (l, offsets) in index.layers.iter().zip(&index.offsets) {
            let sizes = [l.gate.bytes, l.up.bytes, l.down.bytes];
            let parts = (0..index.n_expert as u64).flat_map(|e| (0..3).map(move |p| (p, e)));
            unaligned += parts.filter(|&(p, e)| (offsets[p] + e * sizes[p]) % 4096 != 0).count();
        }

        for direct_io in [false, true] {
            let opts = StoreOptions {
                direct_io,
                verify_digests: true,
            };
            let a = Store::open_with(&copy, &gguf, &opts).unwrap();
            let b = Store::open_with(&in_place, &gguf, &opts).unwrap();
            assert_eq!((a.layout(), b.layout()), (Layout::Copy, Layout::InPlace));
            assert_eq!(b.file_path(), gguf.path());
            assert_eq!(a.records().collect::<Vec<_>>(), b.records().collect::<Vec<_>>());
            for (layer, expert) in a.records() {
                let (ra, rb) = (a.read(layer, expert).unwrap(), b.read(layer, expert).unwrap());
                for (x, y) in [(ra.gate(), rb.gate()), (ra.up(), rb.up()), (ra.down(), rb.down())] {
                    assert!(x.data == y.data, "{f}: layer {layer} expert {expert}");
                    assert_eq!((x.ty, x.rows, x.cols), (y.ty, y.rows, y.cols));
                }
                // In place holds each part's reads, rounded out: at most two blocks more per part.
                let extra = rb.resident_bytes() as i64 - ra.resident_bytes() as i64;
                assert!((-4096..=6 * 4096).contains(&extra), "{f}: {extra}");
            }
            for s in [&a, &b] {
                let report = s.verify(&mut |_, _| {}).unwrap();
                assert!(report.is_ok(), "{f}: {:?}", report.bad);
                assert_eq!(report.records, manifest.records.len());
                assert!(s.source_mismatches(&gguf, true).unwrap().is_empty());
            }
        }
    }
    // Slices that start inside a block were among those read: the rounding out was exercised.
    assert!(unaligned > 0);
}
