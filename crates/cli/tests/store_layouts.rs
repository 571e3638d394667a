//! `titan convert` (its default layout, in-place): an index beside the model instead of a copy, picked up
//! by the streaming options when no copy is there, checked by `titan verify`, with damage to the index or to
//! the model named as such.

mod common;

use std::path::{Path, PathBuf};
use std::process::Output;

use common::{fixture, stderr};
use titan_store::Index;

const MODEL: &str = "qwen3moe/q8_0.gguf";

fn titan(args: &[&str]) -> Output {
    common::titan().args(args).output().expect("titan runs")
}

/// The fixture copied into `dir` (so its stores are written beside it) and indexed in place, by default.
fn model_with_index(dir: &Path) -> (PathBuf, PathBuf) {
    let m = dir.join("m.gguf");
    std::fs::copy(fixture(MODEL), &m).unwrap();
    let o = titan(&["convert", m.to_str().unwrap()]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stderr(&o).contains("no copy"), "{}", stderr(&o));
    assert!(!dir.join("m.titan").exists(), "an in-place conversion wrote a copy");
    (m, dir.join("m.titan-index"))
}

#[test]
fn an_in_place_index_streams_the_resident_output_and_a_copy_takes_precedence() {
    // On the build disk, where O_DIRECT works.
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let (m, index) = model_with_index(dir.path());
    let v = titan(&["verify", index.to_str().unwrap()]);
    let out = String::from_utf8_lossy(&v.stdout);
    assert!(
        v.status.success() && out.starts_with("OK: ") && out.contains("in place in"),
        "{out}"
    );

    let args = [
        "run",
        "-m",
        m.to_str().unwrap(),
        "-p",
        "The quick brown fox",
        "-n",
        "16",
        "--temp",
        "0",
    ];
    let resident = titan(&args);
    assert!(resident.status.success(), "{}", stderr(&resident));
    for extra in [&["--expert-budget", "1"][..], &["--expert-budget", "1", "--direct-io"]] {
        let streamed = titan(&[&args[..], extra].concat());
        assert!(streamed.status.success(), "{}", stderr(&streamed));
        assert_eq!(resident.stdout, streamed.stdout, "{extra:?}");
        assert!(stderr(&streamed).contains("misses"), "{}", stderr(&streamed));
    }

    // With a copy beside it too, streaming takes the copy: a damaged index does not matter then…
    let o = titan(&["convert", m.to_str().unwrap(), "--layout", "copy"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let mut bytes = std::fs::read(&index).unwrap();
    let mid = bytes.len() / 2;
    bytes[mid] ^= 0x01;
    std::fs::write(&index, &bytes).unwrap();
    let streamed = titan(&[&args[..], &["--expert-budget", "1"]].concat());
    assert!(streamed.status.success(), "{}", stderr(&streamed));
    assert_eq!(resident.stdout, streamed.stdout);
    // …and without the copy the index is used, and its damage named.
    std::fs::remove_dir_all(dir.path().join("m.titan")).unwrap();
    let o = titan(&[&args[..], &["--expert-budget", "1"]].concat());
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(!err.contains("panicked"), "{err}");
    assert!(
        err.contains(&format!("{}: its checksum does not match", index.display()))
            && err.contains("re-run titan convert --layout in-place"),
        "{err}"
    );
    let v = titan(&["verify", index.to_str().unwrap()]);
    assert_eq!(v.status.code(), Some(1));
    assert!(stderr(&v).contains("checksum does not match"), "{}", stderr(&v));

    // With neither, the error says how to make either.
    std::fs::remove_file(&index).unwrap();
    let o = titan(&[&args[..], &["--expert-budget", "1"]].concat());
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(
        err.contains("no expert store beside") && err.contains("--layout copy"),
        "{err}"
    );
}

#[test]
fn a_flipped_model_byte_is_named_by_verify_and_by_the_run_that_reads_it() {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let (m, index) = model_with_index(dir.path());
    // Expert 2 of layer 0, a byte into its up slice. Opening samples expert 0 of layer 0, so this
    // damage is found by the read of expert 2, as damage after opening would be.
    let idx = Index::load(&index).unwrap();
    let (gate, up) = (idx.offsets[0][0] + 2 * idx.layers[0].gate.bytes, idx.offsets[0][1]);
    let at = up + 2 * idx.layers[0].up.bytes + 7;
    let mut b = std::fs::read(&m).unwrap();
    b[at as usize] ^= 0x10;
    std::fs::write(&m, &b).unwrap();

    let v = titan(&["verify", index.to_str().unwrap()]);
    let err = stderr(&v);
    assert_eq!(v.status.code(), Some(1), "{err}");
    let named = format!(
        "expert 2 of layer 0 failed its digest check in {} (offset {gate:#x})",
        m.display()
    );
    assert!(
        err.contains(&named) && err.contains("the model changed or is damaged"),
        "{err}"
    );
    assert!(err.contains("1 of 16 records failed verification"), "{err}");

    let o = titan(&[
        "run",
        "-m",
        m.to_str().unwrap(),
        "-p",
        "The quick brown fox jumps",
        "-n",
        "8",
        "--expert-budget",
        "1",
    ]);
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(err.contains(&named) && !err.contains("panicked"), "{err}");
}

/// A model whose weights do not fit in the memory available streams its experts by default: the index is
/// made beside it on first use (no copy), the output is the resident one, and `--resident` opts out.
#[test]
fn a_model_that_does_not_fit_streams_from_an_index_made_on_first_use() {
    let dir = tempfile::tempdir().unwrap();
    let m = dir.path().join("m.gguf");
    std::fs::copy(fixture(MODEL), &m).unwrap();
    let (dense, experts) = titan_layout::dense_and_expert_bytes(&titan_gguf::GgufFile::open(&m).unwrap());
    // Room for the dense weights, the 512 MiB margin and half the experts (the KV cache of this run's 43
    // positions at most takes a few KiB of them).
    let memory = (dense + (512 << 20) + experts / 2).to_string();
    let args = [
        "run",
        "-m",
        m.to_str().unwrap(),
        "-p",
        "The quick brown fox",
        "-n",
        "16",
        "--temp",
        "0",
    ];
    let resident = titan(&args);
    assert!(
        resident.status.success() && !dir.path().join("m.titan-index").exists(),
        "{}",
        stderr(&resident)
    );

    let streamed = common::titan()
        .args(args)
        .env("TITAN_MEMORY_AVAILABLE", &memory)
        .output()
        .unwrap();
    let err = stderr(&streamed);
    assert!(streamed.status.success(), "{err}");
    assert!(
        err.contains("of weights do not fit in the")
            && err.contains("indexing the experts of")
            && err.contains("hit rate"),
        "{err}"
    );
    assert!(err.contains("43 positions of KV cache"), "{err}");
    assert!(dir.path().join("m.titan-index").is_file() && !dir.path().join("m.titan").exists());
    assert_eq!(
        streamed.stdout, resident.stdout,
        "streamed output differs from resident"
    );

    // Second run: the index is there already; --resident loads everything.
    let again = common::titan()
        .args(args)
        .env("TITAN_MEMORY_AVAILABLE", &memory)
        .output()
        .unwrap();
    assert!(
        again.status.success() && !stderr(&again).contains("indexing"),
        "{}",
        stderr(&again)
    );
    let forced = common::titan()
        .args(args)
        .arg("--resident")
        .env("TITAN_MEMORY_AVAILABLE", &memory)
        .output()
        .unwrap();
    assert!(
        forced.status.success() && !stderr(&forced).contains("hit rate"),
        "{}",
        stderr(&forced)
    );
    assert_eq!(forced.stdout, resident.stdout);

    // Not even the dense weights fit: an error that says so.
    let none = common::titan()
        .args(args)
        .env("TITAN_MEMORY_AVAILABLE", "100MiB")
        .output()
        .unwrap();
    assert!(
        !none.status.success() && stderr(&none).contains("do not fit in the 100.00 MiB of memory available"),
        "{}",
        stderr(&none)
    );

    // A server's slots each hold a whole context: 256 of them do not fit beside the weights, and it says so
    // before it listens.
    let serve = [
        "serve",
        "-m",
        m.to_str().unwrap(),
        "--listen",
        "127.0.0.1:0",
        "--parallel",
        "256",
        "--ctx-size",
        "512",
    ];
    let slots = common::titan()
        .args(serve)
        .env("TITAN_MEMORY_AVAILABLE", &memory)
        .output()
        .unwrap();
    let err = stderr(&slots);
    assert_eq!(slots.status.code(), Some(1), "{err}");
    assert!(
        err.contains("256 × 512 positions of KV cache") && err.contains("a smaller --ctx-size"),
        "{err}"
    );
}
