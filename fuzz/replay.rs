//! Replays a fuzz target's committed inputs as an ordinary test: every file in
//! `fuzz/corpus/<target>/` and `fuzz/regressions/<target>/` goes through the same body the fuzz
//! target runs, so stable CI checks what nightly fuzzing found without running libFuzzer. Included
//! by each owning crate's `tests/fuzz_corpus.rs` with `#[path]`, so there is one copy.

use std::path::{Path, PathBuf};

/// The repository root, from the including crate's manifest directory (`crates/<name>`).
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Runs `body` on every input of `target`; fails naming each input that panicked, and fails if the
/// corpus is empty (a replay of nothing would pass whatever the parser does).
pub fn replay(target: &str, body: impl Fn(&[u8])) {
    let fuzz = repo_root().join("fuzz");
    let corpus = files(&fuzz.join("corpus").join(target));
    assert!(
        !corpus.is_empty(),
        "fuzz/corpus/{target} holds no inputs: the replay would test nothing"
    );
    let inputs = corpus.into_iter().chain(files(&fuzz.join("regressions").join(target)));
    let mut panicked = Vec::new();
    let mut n = 0;
    for path in inputs {
        let data = std::fs::read(&path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
        // A panic is recorded and the replay goes on, so one run names every failing input.
        if std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| body(&data))).is_err() {
            panicked.push(path.display().to_string());
        }
        n += 1;
    }
    assert!(
        panicked.is_empty(),
        "{} of {n} inputs of {target} panicked:\n{}",
        panicked.len(),
        panicked.join("\n")
    );
}

/// The files directly in `dir`, sorted; none if it does not exist (a target may have no
/// regressions).
fn files(dir: &Path) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut out: Vec<PathBuf> = entries
        .filter_map(|e| Some(e.ok()?.path()))
        .filter(|p| p.is_file())
        .collect();
    out.sort();
    out
}
