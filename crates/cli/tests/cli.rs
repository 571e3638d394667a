//! The `titan` binary as a user runs it: on a committed fixture GGUF written by llama.cpp's converter,
//! and on damaged files, which must each give a one-line error naming the file and the cause.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use titan_gguf::{GgufWriter, Value};
use titan_kernels::GgmlType;

fn fixture(rel: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures")
        .join(rel)
}

fn titan(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_titan"))
        .args(args)
        .output()
        .expect("titan runs")
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// Assert a clean failure: exit code 1, one line on stderr naming `path` and containing `cause`, no panic.
fn assert_clean_error(o: &Output, path: &Path, cause: &str) {
    let err = stderr(o);
    println!("{}", err.trim_end());
    assert_eq!(o.status.code(), Some(1), "stderr: {err}");
    assert!(!err.contains("panicked"), "panic: {err}");
    assert_eq!(err.trim_end().lines().count(), 1, "not one line: {err}");
    assert!(
        err.contains(&path.display().to_string()),
        "does not name the file: {err}"
    );
    assert!(err.contains(cause), "does not say {cause:?}: {err}");
}

const MODEL: &str = "qwen3moe/q8_0.gguf";

#[test]
fn run_streams_text_and_reports_speed() {
    let m = fixture(MODEL);
    let o = titan(&[
        "run",
        "-m",
        m.to_str().unwrap(),
        "-p",
        "The quick brown fox",
        "-n",
        "12",
        "--temp",
        "0",
        "--threads",
        "2",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(!o.stdout.is_empty());
    let err = stderr(&o);
    assert!(
        err.contains("prompt:") && err.contains("tok/s") && err.contains("generation:"),
        "{err}"
    );
    // greedy is deterministic
    let again = titan(&[
        "run",
        "-m",
        m.to_str().unwrap(),
        "-p",
        "The quick brown fox",
        "-n",
        "12",
        "--temp",
        "0",
    ]);
    assert_eq!(o.stdout, again.stdout);
}

#[test]
fn logits_writes_an_npy_of_positions_by_vocab() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("l.npy");
    let m = fixture(MODEL);
    let o = titan(&[
        "logits",
        "-m",
        m.to_str().unwrap(),
        "--tokens",
        "1,2,3,4",
        "-o",
        out.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let b = std::fs::read(&out).unwrap();
    let hlen = u16::from_le_bytes([b[8], b[9]]) as usize;
    let header = std::str::from_utf8(&b[10..10 + hlen]).unwrap();
    assert!(header.contains("'shape': (4, "), "{header}");
    let vocab: usize = header
        .split("(4, ")
        .nth(1)
        .unwrap()
        .split(')')
        .next()
        .unwrap()
        .parse()
        .unwrap();
    assert_eq!(b.len(), 10 + hlen + 4 * 4 * vocab);
}

#[test]
fn tokenize_prints_a_json_array() {
    let m = fixture(MODEL);
    let o = titan(&["tokenize", "-m", m.to_str().unwrap(), "hello world"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let s = String::from_utf8(o.stdout).unwrap();
    assert!(
        s.trim().starts_with('[') && s.trim().ends_with(']') && s.len() > 3,
        "{s}"
    );
}

#[test]
fn inspect_describes_the_model() {
    let m = fixture(MODEL);
    let o = titan(&["inspect", m.to_str().unwrap()]);
    assert!(o.status.success(), "{}", stderr(&o));
    let s = String::from_utf8(o.stdout).unwrap();
    for want in ["qwen3moe", "experts:", "Q8_0", "dense", "experts ("] {
        assert!(s.contains(want), "missing {want:?} in\n{s}");
    }
    // DeepSeek-V4's attention and streams, from the fixture's metadata (window 8, ratios 0 / 4 / 128, the
    // indexer's 8 heads of 64 keeping 4, one layer routed by token).
    let o = titan(&["inspect", fixture("deepseek4/mxfp4_moe.gguf").to_str().unwrap()]);
    let s = String::from_utf8(o.stdout).unwrap();
    for want in [
        "a window of 8 on every layer; compressed entries of 4 (indexer: 8 heads of 64, top 4) on 1, of 128 on 1, of 3 layers",
        "4 hyper-connection streams; experts chosen by the token in the first 1 layer(s)",
    ] {
        assert!(s.contains(want), "missing {want:?} in\n{s}");
    }
}

fn write(dir: &Path, name: &str, bytes: &[u8]) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, bytes).unwrap();
    p
}

#[test]
fn truncated_file() {
    let dir = tempfile::tempdir().unwrap();
    let full = std::fs::read(fixture(MODEL)).unwrap();
    for cut in [2, 100, full.len() / 2] {
        let p = write(dir.path(), "cut.gguf", &full[..cut]);
        let o = titan(&["run", "-m", p.to_str().unwrap(), "-p", "hi"]);
        let err = stderr(&o);
        let cause = ["truncated", "past the end", "cannot fit"]
            .into_iter()
            .find(|c| err.contains(c))
            .unwrap_or("truncated");
        assert_clean_error(&o, &p, cause);
    }
}

#[test]
fn wrong_magic() {
    let dir = tempfile::tempdir().unwrap();
    let mut b = std::fs::read(fixture(MODEL)).unwrap();
    b[..4].copy_from_slice(b"GGJT");
    let p = write(dir.path(), "magic.gguf", &b);
    assert_clean_error(&titan(&["inspect", p.to_str().unwrap()]), &p, "not a GGUF file");
}

#[test]
fn metadata_count_that_would_overflow() {
    let dir = tempfile::tempdir().unwrap();
    let mut b = std::fs::read(fixture(MODEL)).unwrap();
    b[16..24].copy_from_slice(&(u64::MAX / 3).to_le_bytes());
    let p = write(dir.path(), "count.gguf", &b);
    assert_clean_error(
        &titan(&["run", "-m", p.to_str().unwrap(), "-p", "hi"]),
        &p,
        "metadata count",
    );
}

/// A small file written by our own writer, then damaged.
fn tiny(arch: &str, ty: GgmlType) -> GgufWriter {
    let mut w = GgufWriter::new();
    w.set("general.architecture", Value::String(arch.into()));
    w.add_tensor("token_embd.weight", &[32, 4], ty).unwrap();
    w
}

#[test]
fn tensor_pointing_past_the_end() {
    let dir = tempfile::tempdir().unwrap();
    let w = tiny("qwen3moe", GgmlType::F32);
    let mut b = Vec::new();
    w.write_header(&mut b).unwrap();
    b.extend_from_slice(&[0u8; 64]); // 512 bytes needed
    let p = write(dir.path(), "short.gguf", &b);
    assert_clean_error(&titan(&["inspect", p.to_str().unwrap()]), &p, "points past the end");
}

#[test]
fn unsupported_architecture() {
    let dir = tempfile::tempdir().unwrap();
    let w = tiny("gpt2", GgmlType::F32);
    let mut b = Vec::new();
    w.write_all(&[&[0u8; 512]], &mut b).unwrap();
    let p = write(dir.path(), "arch.gguf", &b);
    assert_clean_error(
        &titan(&["run", "-m", p.to_str().unwrap(), "-p", "hi"]),
        &p,
        "unsupported architecture \"gpt2\"",
    );
}

#[test]
fn unsupported_tensor_type() {
    let dir = tempfile::tempdir().unwrap();
    let w = tiny("qwen3moe", GgmlType::F32);
    let mut b = Vec::new();
    w.write_all(&[&[0u8; 512]], &mut b).unwrap();
    // Patch the tensor's type id (after the name, the rank and two dims) to IQ2_XXS (16), which TITAN lacks.
    let name = b"token_embd.weight";
    let at = b.windows(name.len()).position(|x| x == name).unwrap() + name.len() + 4 + 16;
    b[at..at + 4].copy_from_slice(&16u32.to_le_bytes());
    let p = write(dir.path(), "type.gguf", &b);
    assert_clean_error(&titan(&["inspect", p.to_str().unwrap()]), &p, "unsupported type id 16");
}

#[test]
fn missing_file() {
    let p = PathBuf::from("/nonexistent/model.gguf");
    let o = titan(&["run", "-m", p.to_str().unwrap(), "-p", "hi"]);
    assert_clean_error(&o, &p, "No such file");
    // The cause is said once, not repeated by each layer of the error that carries it.
    assert_eq!(stderr(&o).matches("No such file").count(), 1, "{}", stderr(&o));
    let p = PathBuf::from("/nonexistent/store.titan");
    let o = titan(&["verify", p.to_str().unwrap()]);
    assert_clean_error(&o, &p, "No such file");
    assert_eq!(stderr(&o).matches("No such file").count(), 1, "{}", stderr(&o));
}

fn trace_file(dir: &Path, name: &str, threads: &str) -> PathBuf {
    let out = dir.join(name);
    let m = fixture(MODEL);
    let o = titan(&[
        "trace",
        "-m",
        m.to_str().unwrap(),
        "-p",
        "Hello world",
        "-n",
        "4",
        "--temp",
        "0",
        "--threads",
        threads,
        "-o",
        out.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    out
}

#[test]
fn trace_diff_of_one_and_two_threads_is_identical() {
    let dir = tempfile::tempdir().unwrap();
    let a = trace_file(dir.path(), "a.trace", "1");
    let b = trace_file(dir.path(), "b.trace", "2");
    let o = titan(&["trace-diff", a.to_str().unwrap(), b.to_str().unwrap()]);
    let out = String::from_utf8_lossy(&o.stdout);
    assert_eq!(o.status.code(), Some(0), "{out}{}", stderr(&o));
    assert!(out.starts_with("IDENTICAL: ") && out.contains("decisions"), "{out}");
}

#[test]
fn trace_diff_finds_one_flipped_bit() {
    use titan_engine::trace::Trace;
    let dir = tempfile::tempdir().unwrap();
    let a = trace_file(dir.path(), "a.trace", "2");
    // Perturb one element of one tensor by one bit (the lowest of the mantissa), re-digested so the file is valid.
    let mut t = Trace::read(&a).unwrap();
    let target = "s0002.l001.moe_out";
    let r = t
        .records
        .iter_mut()
        .find(|r| r.name == target)
        .expect("the trace has the record");
    r.data[4 * 5] ^= 1;
    let b = dir.path().join("b.trace");
    t.write(&b).unwrap();
    let o = titan(&["trace-diff", a.to_str().unwrap(), b.to_str().unwrap()]);
    let out = String::from_utf8_lossy(&o.stdout);
    assert_eq!(o.status.code(), Some(1), "{out}");
    assert!(
        out.contains("first divergence: s0002.l001.moe_out (step 2, layer 1, moe_out): 1 of ")
            && out.contains("max 1 ULP"),
        "{out}"
    );
    assert!(out.contains("decisions: all"), "{out}");
    // within a tolerance the two agree
    let o = titan(&[
        "trace-diff",
        "--tolerance",
        "1e-3",
        a.to_str().unwrap(),
        b.to_str().unwrap(),
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", String::from_utf8_lossy(&o.stdout));
}

#[test]
fn trace_diff_of_unreadable_input_exits_2() {
    let dir = tempfile::tempdir().unwrap();
    let junk = write(dir.path(), "junk.trace", b"not a trace");
    let o = titan(&["trace-diff", junk.to_str().unwrap(), junk.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("junk.trace"), "{}", stderr(&o));
}

/// A model copied into a temp dir with a copy of its experts converted beside it.
fn model_with_store(dir: &Path) -> (PathBuf, PathBuf) {
    let m = dir.join("m.gguf");
    std::fs::copy(fixture(MODEL), &m).unwrap();
    let o = titan(&["convert", m.to_str().unwrap(), "--layout", "copy"]);
    assert!(o.status.success(), "{}", stderr(&o));
    (m, dir.join("m.titan"))
}

#[test]
fn streamed_run_equals_resident_run_and_reports_the_cache() {
    let dir = tempfile::tempdir().unwrap();
    let (m, store) = model_with_store(dir.path());
    let verify = titan(&["verify", store.to_str().unwrap()]);
    assert!(
        verify.status.success() && String::from_utf8_lossy(&verify.stdout).starts_with("OK: "),
        "{}",
        stderr(&verify)
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
    let streamed = titan(&[&args[..], &["--expert-budget", "1"]].concat());
    assert!(streamed.status.success(), "{}", stderr(&streamed));
    assert_eq!(resident.stdout, streamed.stdout);
    let err = stderr(&streamed);
    assert!(
        err.contains("raised to") && err.contains("hit rate") && err.contains("misses"),
        "{err}"
    );
}

#[test]
fn a_corrupt_expert_record_is_named_and_never_used() {
    let dir = tempfile::tempdir().unwrap();
    let (m, store) = model_with_store(dir.path());
    let bin = store.join("experts.bin");
    let manifest: serde_json::Value =
        serde_json::from_slice(&std::fs::read(store.join("manifest.json")).unwrap()).unwrap();
    let rec = manifest["records"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["layer"] == 0 && r["expert"] == 2)
        .unwrap();
    let offset = rec["offset"].as_u64().unwrap();
    let mut b = std::fs::read(&bin).unwrap();
    b[offset as usize + 7] ^= 0x10;
    std::fs::write(&bin, &b).unwrap();
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
    let at = format!("offset {offset:#x}");
    assert!(
        err.contains("expert 2 of layer 0 failed its digest check") && err.contains("experts.bin") && err.contains(&at),
        "{err}"
    );
    assert!(!err.contains("panicked"));
    let v = titan(&["verify", store.to_str().unwrap()]);
    assert_eq!(v.status.code(), Some(1));
    assert!(stderr(&v).contains("expert 2 of layer 0"), "{}", stderr(&v));
}

#[test]
fn a_store_of_another_model_or_a_damaged_store_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let (m, store) = model_with_store(dir.path());
    let run = |extra: &[&str]| titan(&[&["run", "-m", m.to_str().unwrap(), "-p", "hi", "-n", "2"][..], extra].concat());
    // another model's store
    let other = dir.path().join("other.gguf");
    std::fs::copy(fixture("qwen3moe/q4_0.gguf"), &other).unwrap();
    assert!(titan(&["convert", other.to_str().unwrap(), "--layout", "copy"])
        .status
        .success());
    let o = run(&[
        "--expert-budget",
        "1GiB",
        "--store",
        dir.path().join("other.titan").to_str().unwrap(),
    ]);
    assert_eq!(o.status.code(), Some(1));
    assert!(stderr(&o).contains("other.gguf"), "{}", stderr(&o));
    // truncated records file
    let bin = store.join("experts.bin");
    let len = std::fs::metadata(&bin).unwrap().len();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&bin)
        .unwrap()
        .set_len(len - 4096)
        .unwrap();
    let o = run(&["--expert-budget", "1GiB"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(stderr(&o).contains("truncated"), "{}", stderr(&o));
    // a manifest that does not parse
    std::fs::write(store.join("manifest.json"), b"{ not json").unwrap();
    let o = run(&["--expert-budget", "1GiB"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(stderr(&o).contains("manifest.json"), "{}", stderr(&o));
    // no store at all
    let o = titan(&[
        "run",
        "-m",
        other.to_str().unwrap(),
        "-p",
        "hi",
        "--expert-budget",
        "1GiB",
        "--store",
        "/nonexistent.titan",
    ]);
    assert_eq!(o.status.code(), Some(1));
    assert!(stderr(&o).contains("titan convert"), "{}", stderr(&o));
}

/// Every SIMD path the CPU has gives the same trace, byte for byte, as the scalar path, on a model of
/// each architecture and on K-quants (each run is its own process, with TITAN_ISA forcing the path).
#[test]
fn every_simd_path_traces_identically_to_scalar() {
    let dir = tempfile::tempdir().unwrap();
    for model in [
        "qwen3moe/q4_0.gguf",
        "olmoe/q8_0.gguf",
        "qwen2moe/f16.gguf",
        "mixtral/q4_0.gguf",
        "qwen3moe-k/q4_k_m.gguf",
        "qwen3moe-k/q5_k_m.gguf",
    ] {
        let m = fixture(model);
        let trace = |isa: &str| {
            let out = dir.path().join(format!("{}-{isa}.trace", model.replace('/', "_")));
            let o = Command::new(env!("CARGO_BIN_EXE_titan"))
                .env("TITAN_ISA", isa)
                .args([
                    "trace",
                    "-m",
                    m.to_str().unwrap(),
                    "-p",
                    "Hello SIMD world, 日本語",
                    "-n",
                    "6",
                    "--temp",
                    "0.8",
                    "--threads",
                    "2",
                    "-o",
                    out.to_str().unwrap(),
                ])
                .output()
                .unwrap();
            assert!(o.status.success(), "{}", stderr(&o));
            out
        };
        let scalar = trace("scalar");
        for isa in titan_kernels::available_isas()
            .into_iter()
            .filter(|&i| i != titan_kernels::Isa::Scalar)
        {
            let other = trace(isa.name());
            let o = titan(&["trace-diff", scalar.to_str().unwrap(), other.to_str().unwrap()]);
            let out = String::from_utf8_lossy(&o.stdout);
            assert_eq!(o.status.code(), Some(0), "{model}: scalar vs {}: {out}", isa.name());
            println!("{model}: scalar vs {}: {}", isa.name(), out.trim());
        }
    }
}

#[test]
fn a_routing_profile_pins_hot_experts_without_changing_the_output() {
    let dir = tempfile::tempdir().unwrap();
    let (m, _store) = model_with_store(dir.path());
    let profile = dir.path().join("profile.json");
    let o = titan(&[
        "profile",
        "-m",
        m.to_str().unwrap(),
        "-p",
        "The quick brown fox",
        "-n",
        "16",
        "-o",
        profile.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let p: serde_json::Value = serde_json::from_slice(&std::fs::read(&profile).unwrap()).unwrap();
    let counts: u64 = p["counts"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|l| l.as_array().unwrap())
        .map(|c| c.as_u64().unwrap())
        .sum();
    assert!(counts > 0, "{p}");
    let args = [
        "run",
        "-m",
        m.to_str().unwrap(),
        "-p",
        "Pinned experts",
        "-n",
        "12",
        "--temp",
        "0",
    ];
    let resident = titan(&args);
    let pinned = [
        "--expert-budget",
        "64KiB",
        "--pin",
        profile.to_str().unwrap(),
        "--cache-policy",
        "lfu",
    ];
    for prefetch in [&[][..], &["--no-prefetch"]] {
        let o = titan(&[&args[..], &pinned, prefetch].concat());
        assert!(o.status.success(), "{}", stderr(&o));
        assert_eq!(resident.stdout, o.stdout, "{prefetch:?}");
    }
}

#[test]
fn a_token_outside_the_vocabulary_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let m = fixture(MODEL);
    let o = titan(&[
        "logits",
        "-m",
        m.to_str().unwrap(),
        "--tokens",
        "1,999999",
        "-o",
        dir.path().join("x.npy").to_str().unwrap(),
    ]);
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(
        err.contains("token id 999999 is outside the vocabulary") && !err.contains("panicked"),
        "{err}"
    );
    assert!(!dir.path().join("x.npy").exists());
}

#[test]
fn exceeding_the_context_is_an_error_not_a_crash() {
    let m = fixture(MODEL);
    let o = titan(&[
        "run",
        "-m",
        m.to_str().unwrap(),
        "-p",
        "The quick brown fox jumps",
        "-n",
        "50",
        "--temp",
        "0",
        "-c",
        "12",
    ]);
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(
        err.contains("context of 12 tokens exceeded") && !err.contains("panicked"),
        "{err}"
    );
}

#[test]
fn perplexity_of_the_demo_model_is_llama_cpps() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../models/demo");
    let m = root.join("demo-q8_0.gguf");
    let o = titan(&[
        "perplexity",
        "-m",
        m.to_str().unwrap(),
        "-f",
        root.join("heldout.txt").to_str().unwrap(),
        "-c",
        "128",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let out = String::from_utf8(o.stdout).unwrap();
    let reference: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(root.join("reference.json")).unwrap()).unwrap();
    let theirs = reference["perplexity"]["ppl"].as_f64().unwrap();
    let ours: f64 = out
        .lines()
        .find_map(|l| l.strip_prefix("perplexity: ")?.split(' ').next()?.parse().ok())
        .unwrap_or_else(|| panic!("{out}"));
    assert!(
        ((ours - theirs) / theirs).abs() < 1e-3,
        "TITAN {ours} vs llama-perplexity {theirs}"
    );
    assert!(out.starts_with("[1]") && out.contains(",[15]"), "{out}");
}

#[test]
fn the_demo_model_writes_english() {
    let m = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../models/demo/demo-q8_0.gguf");
    let o = titan(&[
        "run",
        "-m",
        m.to_str().unwrap(),
        "-p",
        "KING HENRY.\nNow, lords,",
        "-n",
        "24",
        "--temp",
        "0",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let text = String::from_utf8(o.stdout).unwrap();
    // llama.cpp's greedy continuation of this prompt starts so (models/demo/reference.json).
    assert!(text.starts_with(" you are a king, and all the world"), "{text}");
}

/// The fixture model rewritten with `edit` applied to its metadata (tensors copied as they are).
fn with_metadata(dir: &Path, name: &str, edit: impl FnOnce(&mut Vec<(String, Value)>)) -> PathBuf {
    let src = titan_gguf::GgufFile::open(fixture(MODEL)).unwrap();
    let mut meta = src.metadata.clone();
    edit(&mut meta);
    let mut w = GgufWriter::new();
    for (k, v) in meta {
        w.set(&k, v);
    }
    for t in &src.tensors {
        w.add_tensor(&t.name, &t.dims, t.ty).unwrap();
    }
    let data: Vec<&[u8]> = src.tensors.iter().map(|t| src.tensor_data(t)).collect();
    let mut b = Vec::new();
    w.write_all(&data, &mut b).unwrap();
    write(dir, name, &b)
}

fn set(meta: &mut [(String, Value)], key: &str, value: Value) {
    meta.iter_mut()
        .find(|(k, _)| k == key)
        .unwrap_or_else(|| panic!("the fixture has {key}"))
        .1 = value;
}

/// A block count the tensors do not back (4294967295 once asked for 2.4 TB and aborted) is refused before
/// anything is sized by it.
#[test]
fn a_block_count_the_tensors_do_not_back_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    for n in [u32::MAX, 1 << 26, 3, 1] {
        let p = with_metadata(dir.path(), "blocks.gguf", |m| {
            set(m, "qwen3moe.block_count", Value::U32(n))
        });
        let want = format!("qwen3moe.block_count is {n}, but the file holds tensors for 2 blocks");
        assert_clean_error(
            &titan(&["run", "-m", p.to_str().unwrap(), "-p", "hi", "-n", "1"]),
            &p,
            &want,
        );
    }
}

#[test]
fn non_finite_or_out_of_range_hyper_parameters_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let cases = [
        (
            "qwen3moe.attention.layer_norm_rms_epsilon",
            f32::NAN,
            "is NaN; it must be a finite number between 0 and 1",
        ),
        (
            "qwen3moe.attention.layer_norm_rms_epsilon",
            -1e-6,
            "is -0.000001; it must be a finite number between 0 and 1",
        ),
        ("qwen3moe.attention.layer_norm_rms_epsilon", 0.0, "is 0; it must be"),
        (
            "qwen3moe.rope.freq_base",
            f32::INFINITY,
            "is inf; it must be a finite number greater than 1",
        ),
        (
            "qwen3moe.rope.freq_base",
            -10000.0,
            "is -10000; it must be a finite number greater than 1",
        ),
    ];
    for (key, value, cause) in cases {
        let p = with_metadata(dir.path(), "hp.gguf", |m| set(m, key, Value::F32(value)));
        assert_clean_error(
            &titan(&["run", "-m", p.to_str().unwrap(), "-p", "hi", "-n", "1"]),
            &p,
            &format!("{key} {cause}"),
        );
    }
}

/// An expert tensor whose offset points into another tensor's bytes (here the token embeddings) used to load
/// and compute with the wrong weights.
#[test]
fn tensors_whose_bytes_overlap_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let f = titan_gguf::GgufFile::open(fixture(MODEL)).unwrap();
    let (victim, target) = (
        f.tensor("blk.0.ffn_gate_exps.weight").unwrap(),
        f.tensor("token_embd.weight").unwrap(),
    );
    let mut b = std::fs::read(fixture(MODEL)).unwrap();
    let name: Vec<u8> = [&(victim.name.len() as u64).to_le_bytes()[..], victim.name.as_bytes()].concat();
    let at = b.windows(name.len()).position(|w| w == name).unwrap() + name.len() + 4 + 8 * victim.dims.len() + 4;
    assert_eq!(b[at..at + 8], victim.offset.to_le_bytes());
    b[at..at + 8].copy_from_slice(&target.offset.to_le_bytes());
    let p = write(dir.path(), "overlap.gguf", &b);
    assert_clean_error(
        &titan(&["run", "-m", p.to_str().unwrap(), "-p", "hi", "-n", "1"]),
        &p,
        "overlap",
    );
}

/// Sizes and sampler values from the command line are checked before anything is allocated or run.
#[test]
fn out_of_range_options_are_refused() {
    let m = fixture(MODEL);
    let cases: [(&[&str], &str); 8] = [
        (
            &["-n", "1000000000000", "--ctx-size", "1000000000"],
            "--ctx-size: a context of 1000000000 tokens is outside 1..=512, the model's training context",
        ),
        (&["--ctx-size", "0"], "a context of 0 tokens is outside 1..=512"),
        (&["--threads", "10000"], "--threads 10000 is outside 1..="),
        (&["--threads", "0"], "--threads 0 is outside 1..="),
        (&["--temp", "nan"], "temperature is NaN"),
        (&["--top-p", "2"], "top_p is 2; it must be in (0, 1]"),
        (&["--min-p", "5"], "min_p is 5; it must be in [0, 1]"),
        (
            &["--repeat-penalty", "0"],
            "repeat_penalty is 0; it must be greater than 0",
        ),
    ];
    for (extra, cause) in cases {
        let o = titan(&[&["run", "-m", m.to_str().unwrap(), "-p", "hi"][..], extra].concat());
        let err = stderr(&o);
        println!("{extra:?}: {}", err.trim_end());
        assert_eq!(o.status.code(), Some(1), "{extra:?}: {err}");
        assert!(
            err.contains(cause) && !err.contains("panicked") && err.trim_end().lines().count() == 1,
            "{extra:?}: {err}"
        );
    }
}

/// A model whose header and size equal another's but whose experts differ (a fine-tune, a synthetic file of
/// another seed) must not run with the other's store: the store binds to the expert bytes. Opening hashes one
/// expert per layer (expert 0 of layer 0 here); `verify -m` hashes every expert.
#[test]
fn a_store_binds_to_the_expert_bytes_it_was_cut_from() {
    let dir = tempfile::tempdir().unwrap();
    let (m, store) = model_with_store(dir.path());
    let f = titan_gguf::GgufFile::open(&m).unwrap();
    let gate = f.tensor("blk.0.ffn_gate_exps.weight").unwrap();
    let expert_bytes = gate.size / gate.dims[2];
    let at = |expert: u64| (f.data_offset + gate.offset + expert * expert_bytes + 5) as usize;
    let original = std::fs::read(&m).unwrap();
    let twin = |expert: u64| {
        let mut b = original.clone();
        b[at(expert)] ^= 0x01;
        let p = dir.path().join(format!("twin{expert}.gguf"));
        std::fs::write(&p, &b).unwrap();
        p
    };
    let store_arg = store.to_str().unwrap();
    // Same size and header, another expert 0 in layer 0: refused at open, by run and by verify.
    let t0 = twin(0);
    let o = titan(&[
        "run",
        "-m",
        t0.to_str().unwrap(),
        "-p",
        "hi",
        "-n",
        "2",
        "--expert-budget",
        "1",
        "--store",
        store_arg,
    ]);
    assert_clean_error(&o, &t0, "was not made from");
    assert!(stderr(&o).contains("expert 0 of layer 0 differs"), "{}", stderr(&o));
    // Another expert 5 only: the open's sample does not cover it, verify -m does.
    let t5 = twin(5);
    let o = titan(&["verify", store_arg, "-m", t5.to_str().unwrap()]);
    assert_clean_error(&o, &t5, "1 experts differ, the first expert 5 of layer 0");
    let o = titan(&["verify", store_arg, "-m", m.to_str().unwrap()]);
    assert!(
        o.status.success() && String::from_utf8_lossy(&o.stdout).contains("every expert equal to"),
        "{}",
        stderr(&o)
    );
}

/// Every file in `dir` and what it is: for checking that a refused command left everything as it was.
fn listing(dir: &Path) -> Vec<(String, bool, u64)> {
    let mut v: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| {
            let e = e.unwrap();
            let m = std::fs::symlink_metadata(e.path()).unwrap();
            (e.file_name().to_string_lossy().into_owned(), m.is_file(), m.len())
        })
        .collect();
    v.sort();
    v
}

/// `slice -o M` once replaced the model with the shard (exit 0); `convert --layout in-place -o M --force` with
/// its index; `convert --layout copy -o M --force` left it renamed to `M.old-PID`. Every command that writes
/// refuses an output that is one of its inputs, under any name (another path, a hard or a symbolic link),
/// before it writes anything; the model and the directory are left as they were.
#[test]
fn a_command_never_writes_over_what_it_reads() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let (m, store) = model_with_store(d);
    let original = std::fs::read(&m).unwrap();
    let (hard, soft, dotted) = (d.join("hard.gguf"), d.join("soft.gguf"), d.join(".").join("m.gguf"));
    std::fs::hard_link(&m, &hard).unwrap();
    std::os::unix::fs::symlink(&m, &soft).unwrap();
    let experts = store.join("experts.bin");
    let before = listing(d);
    let s = |p: &Path| p.to_str().unwrap().to_string();
    let model = s(&m);
    let slice = |out: &Path| {
        vec![
            "slice".into(),
            model.clone(),
            "--layers".into(),
            "0-1".into(),
            "--experts".into(),
            "0-3".into(),
            "-o".into(),
            s(out),
        ]
    };
    let convert = |layout: &str, out: &Path| {
        vec![
            "convert".into(),
            model.clone(),
            "--layout".into(),
            layout.into(),
            "-o".into(),
            s(out),
            "--force".into(),
        ]
    };
    let run = |cmd: &str, out: &Path| {
        let mut v: Vec<String> = [cmd, "-m", &model, "-p", "hi", "-n", "1", "-o"]
            .map(String::from)
            .into();
        v.push(s(out));
        v
    };
    let cases: Vec<(Vec<String>, &Path)> = vec![
        (slice(&m), &m),
        (slice(&dotted), &dotted),
        (convert("in-place", &m), &m),
        (convert("in-place", &hard), &hard),
        (convert("copy", &m), &m),
        (convert("copy", &soft), &soft),
        (
            ["logits", "-m", &model, "--tokens", "1,2", "-o", &model]
                .map(String::from)
                .into(),
            &m,
        ),
        (run("trace", &soft), &soft),
        (run("profile", &hard), &hard),
        // The store a run streams from is an input too.
        (
            [&run("trace", &experts)[..], &["--expert-budget".into(), "1".into()]].concat(),
            &experts,
        ),
    ];
    for (args, out) in cases {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let o = titan(&args);
        assert_clean_error(&o, out, "it is an input of this command");
        assert_eq!(std::fs::read(&m).unwrap(), original, "{args:?} changed the model");
        assert_eq!(listing(d), before, "{args:?} changed the directory");
    }
    let o = titan(&["verify", store.to_str().unwrap(), "-m", &model]);
    assert!(o.status.success(), "{}", stderr(&o));
}

/// `-o /dev/full` once replaced the device node. An output that exists and is not a regular file — a device,
/// a FIFO, a socket, a directory where a file is meant, a symbolic link to one of those — is refused by every
/// command that writes one, and left as it was.
#[test]
fn an_output_that_is_not_a_regular_file_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let m = fixture(MODEL);
    let model = m.to_str().unwrap();
    let full = d.join("full");
    std::os::unix::fs::symlink("/dev/full", &full).unwrap();
    let fifo = d.join("fifo");
    let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
    // SAFETY: mkfifo reads the NUL-terminated path only.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    let socket = d.join("socket");
    let _listener = std::os::unix::net::UnixListener::bind(&socket).unwrap();
    let sub = d.join("sub");
    std::fs::create_dir(&sub).unwrap();
    std::fs::write(sub.join("keep.txt"), b"mine").unwrap();
    let before = listing(d);
    let specials = [
        (&full, "it is a symbolic link to a character device, not a regular file"),
        (&fifo, "it is a FIFO (named pipe), not a regular file"),
        (&socket, "it is a socket, not a regular file"),
        (&sub, "it is a directory, not a regular file"),
    ];
    for (out, cause) in specials {
        let o = out.to_str().unwrap();
        let commands: [&[&str]; 6] = [
            &["slice", model, "--layers", "0-1", "--experts", "0-3", "-o", o],
            &["convert", model, "--layout", "in-place", "--force", "-o", o],
            &["logits", "-m", model, "--tokens", "1,2", "-o", o],
            &["trace", "-m", model, "-p", "hi", "-n", "1", "-o", o],
            &["profile", "-m", model, "-p", "hi", "-n", "1", "-o", o],
            &[
                "synth",
                "--preset",
                "olmoe-1b-7b",
                "--type",
                "q4_0",
                "--layers",
                "1",
                "-o",
                o,
            ],
        ];
        for args in commands {
            assert_clean_error(&titan(args), out, cause);
        }
        let copy = titan(&["convert", model, "--layout", "copy", "--force", "-o", o]);
        let cause = if out == &sub {
            "it is a directory holding more than a store (keep.txt), which replacing it would delete"
        } else {
            "not a store directory"
        };
        assert_clean_error(&copy, out, cause);
        assert_eq!(listing(d), before);
    }
    assert_eq!(std::fs::read_link(&full).unwrap(), Path::new("/dev/full"));
    assert_eq!(std::fs::read(sub.join("keep.txt")).unwrap(), b"mine");
}

/// `bench -p 100000000` and `demo -n 100000000` once asked for 25.6 GB and aborted, and `bench -p 100000` ran past
/// a 512-token training context: both check their positions as `run` does, before anything is allocated.
#[test]
fn bench_and_demo_check_their_context_as_run_does() {
    let m = fixture(MODEL);
    let model = m.to_str().unwrap();
    for (args, cause) in [
        (
            &["bench", "-m", model, "-p", "100000000"][..],
            "-p 100000000 -n 32: the bench's sequence holds 100000001 positions: a context of 100000001 tokens is \
             outside 1..=512, the model's training context",
        ),
        (
            &["bench", "-m", model, "-p", "100000"],
            "-p 100000 -n 32: the bench's sequence holds 100001 positions: a context of 100001 tokens is outside",
        ),
        (
            &["demo", "-m", model, "-n", "100000000"],
            "-n 100000000: the prompt and the text generated: a context of 1000000",
        ),
        (
            &["bench", "-m", model, "-r", "0"],
            "-r 0: the bench reports the medians of its repetitions, and needs at least one",
        ),
    ] {
        assert_clean_error(&titan(args), Path::new(""), cause);
    }
    // Past the training context where allowed, within memory.
    let o = Command::new(env!("CARGO_BIN_EXE_titan"))
        .env("TITAN_MEMORY_AVAILABLE", "1GiB")
        .args(["bench", "-m", model, "-p", "100000000", "--allow-long-context"])
        .output()
        .unwrap();
    assert_clean_error(&o, &m, "do not fit in the 1.00 GiB of memory available");
    let o = titan(&[
        "bench",
        "-m",
        model,
        "-p",
        "600",
        "-n",
        "1",
        "-r",
        "1",
        "--allow-long-context",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
}

/// A directory given as the model once said `No such device (os error 19)`.
#[test]
fn a_directory_given_as_the_model_is_named_as_one() {
    let dir = tempfile::tempdir().unwrap();
    for args in [
        &["run", "-m", dir.path().to_str().unwrap(), "-p", "hi"][..],
        &["inspect", dir.path().to_str().unwrap()],
    ] {
        assert_clean_error(&titan(args), dir.path(), "is a directory, not a GGUF file");
    }
}

/// `--temp -1` was read as an unknown flag: negative sampling values reach the sampler's range check.
#[test]
fn negative_sampling_values_reach_the_samplers_range_check() {
    let m = fixture(MODEL);
    for (flag, cause) in [
        (
            "--temp",
            "sampling: temperature is -1; it must be 0 or more (0 is greedy)",
        ),
        ("--top-p", "sampling: top_p is -1; it must be in (0, 1]"),
        ("--min-p", "sampling: min_p is -1; it must be in [0, 1]"),
        (
            "--repeat-penalty",
            "sampling: repeat_penalty is -1; it must be greater than 0",
        ),
    ] {
        let o = titan(&["run", "-m", m.to_str().unwrap(), "-p", "hi", flag, "-1"]);
        assert_clean_error(&o, Path::new(""), cause);
    }
}

/// An expert budget that cannot be had is reported as such, before any store is looked for (the model here has
/// none beside it: these once said "no expert store").
#[test]
fn an_invalid_expert_budget_is_named_before_any_store_lookup() {
    let dir = tempfile::tempdir().unwrap();
    let m = dir.path().join("m.gguf");
    std::fs::copy(fixture(MODEL), &m).unwrap();
    let run = |budget: &str, memory: Option<&str>| {
        let mut c = Command::new(env!("CARGO_BIN_EXE_titan"));
        if let Some(v) = memory {
            c.env("TITAN_MEMORY_AVAILABLE", v);
        }
        c.args(["run", "-m", m.to_str().unwrap(), "-p", "hi", "--expert-budget", budget])
            .output()
            .unwrap()
    };
    for (o, cause) in [
        (run("lots", None), "--expert-budget: \"lots\" is not a size"),
        (
            run("0", None),
            "--expert-budget: \"0\" is 0 bytes, which holds no expert",
        ),
        (run("99999999999999999999TiB", None), "is more than 16 EiB"),
        (
            run("auto", Some("plenty")),
            "the memory available is unknown (TITAN_MEMORY_AVAILABLE is not a size",
        ),
    ] {
        assert_clean_error(&o, Path::new(""), cause);
        assert!(!stderr(&o).contains("no expert store"), "{}", stderr(&o));
    }
}

/// `perplexity -c 1` said "needs at least one chunk of the context size: 13176 tokens, context 1" of a text of
/// 13176 tokens: a chunk of 1 or 2 tokens scores none, and a text shorter than a chunk is named as such.
#[test]
fn perplexity_names_the_smallest_chunk_and_a_text_too_short() {
    let dir = tempfile::tempdir().unwrap();
    let m = fixture(MODEL);
    let text = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../models/demo/heldout.txt");
    let ppl = |file: &Path, c: &str| {
        titan(&[
            "perplexity",
            "-m",
            m.to_str().unwrap(),
            "-f",
            file.to_str().unwrap(),
            "-c",
            c,
        ])
    };
    for c in ["1", "2"] {
        let want = format!(
            "-c {c}: the second half of each chunk is scored, each token against the next, so a chunk of {c} \
             scores none; the smallest -c is 3"
        );
        assert_clean_error(&ppl(&text, c), Path::new(""), &want);
    }
    let o = ppl(&text, "3");
    assert!(o.status.success(), "{}", stderr(&o));
    let short = write(dir.path(), "short.txt", b"hi");
    assert_clean_error(
        &ppl(&short, "100"),
        &short,
        "fewer than one chunk of -c 100; give a smaller -c or a longer text",
    );
}

/// `--ctx-size 18446744073709551615 --allow-long-context` printed u64::MAX, the placeholder for an unknown
/// memory, as the memory available.
#[test]
fn a_placeholder_is_never_printed_as_the_memory_available() {
    let m = fixture(MODEL);
    let o = titan(&[
        "run",
        "-m",
        m.to_str().unwrap(),
        "-p",
        "hi",
        "--ctx-size",
        "18446744073709551615",
        "--allow-long-context",
    ]);
    assert_clean_error(
        &o,
        Path::new(""),
        "--ctx-size: a context of 18446744073709551615 tokens needs",
    );
    let err = stderr(&o);
    assert!(err.contains("of KV cache, more than this machine can address"), "{err}");
    assert!(
        !err.contains("memory available") && !err.contains("17179869184"),
        "{err}"
    );
}

/// `titan verify` of a copy store whose manifest claims 2^64−1 layers said OK: nothing backs that count.
#[test]
fn verify_refuses_a_layer_count_nothing_backs() {
    let dir = tempfile::tempdir().unwrap();
    let (_, store) = model_with_store(dir.path());
    let manifest = store.join("manifest.json");
    let text = std::fs::read_to_string(&manifest).unwrap();
    assert!(text.contains("\"n_layer\": 2,"), "{text}");
    std::fs::write(
        &manifest,
        text.replace("\"n_layer\": 2,", "\"n_layer\": 18446744073709551615,"),
    )
    .unwrap();
    let o = titan(&["verify", store.to_str().unwrap()]);
    assert_clean_error(
        &o,
        &manifest,
        "n_layer is 18446744073709551615, but its last layer with experts is layer 1 (a model's last layer always \
         has experts)",
    );
}

/// Each cause once: an error that quotes its source does not also pass it on to be printed again.
#[test]
fn each_cause_is_printed_once() {
    let dir = tempfile::tempdir().unwrap();
    let (m, store) = model_with_store(dir.path());
    let tok = dir.path().join("none/tokenizer.json");
    let o = titan(&[
        "run",
        "-m",
        m.to_str().unwrap(),
        "-p",
        "hi",
        "--tokenizer",
        tok.to_str().unwrap(),
    ]);
    assert_clean_error(&o, &tok, "--tokenizer: cannot read");
    std::fs::remove_file(store.join("experts.bin")).unwrap();
    let o2 = titan(&["verify", store.to_str().unwrap()]);
    assert_clean_error(&o2, &store.join("experts.bin"), "No such file");
    for (o, path) in [(&o, &tok), (&o2, &store.join("experts.bin"))] {
        let err = stderr(o);
        assert_eq!(err.matches(&path.display().to_string()).count(), 1, "{err}");
        assert_eq!(err.matches("No such file").count(), 1, "{err}");
    }
}
