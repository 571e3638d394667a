//! The README's commands, run as a reader runs them, so that they cannot rot. Every ```sh block of README.md runs
//! as one bash script (`set -e`), in README order, in one temporary directory holding a copy of `models/demo/` and a
//! link to `tests/`, with the binary under test first on PATH (so `titan` is it) and `cargo run --release -p
//! titan-cli --` replaced by `titan`. A block must exit 0, print what its commands print when they work (`EXPECT`)
//! and leave every file it names after `-o`. A block that cannot run here (it downloads, takes minutes, starts a
//! server that runs until stopped, needs llama.cpp, or is the test command itself) is marked on the line before its
//! fence with `<!-- readme-test: skip (reason) -->`; the test prints those with their reasons. Whatever a block
//! leaves running (workers started with `&`) is killed with its process group when it ends.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const SKIP: &str = "<!-- readme-test: skip (";
const SKIP_END: &str = ") -->";
/// How long one block may run.
const LIMIT: Duration = Duration::from_secs(60);

/// A block whose text contains `.0` must print `.2` on stdout (`.1` true) or stderr (false); `""` means "something".
const EXPECT: &[(&str, bool, &str)] = &[
    ("titan run ", true, ""),
    ("titan run ", false, "tok/s"),
    ("titan tokenize ", true, "["),
    ("titan inspect ", true, "architecture:"),
    ("titan logits ", false, "logits to"),
    ("titan perplexity ", true, "perplexity: "),
    ("titan bench ", true, "decode:"),
    ("titan convert ", false, "wrote "),
    ("titan verify ", true, "OK: "),
    ("--expert-budget ", false, "hit rate"),
    ("TITAN_MEMORY_AVAILABLE=", false, "stream from disk"),
    ("titan worker ", true, "listening on"),
    ("--nodes ", false, "round trips"),
    ("--serve-slices ", false, "downloaded"),
    ("titan demo", true, "IDENTICAL"),
    ("titan slice ", false, "wrote "),
    ("titan trace ", false, "wrote "),
    ("titan trace-diff ", true, "IDENTICAL"),
];

struct Block {
    line: usize,
    skip: Option<String>,
    script: String,
}

/// The ```sh blocks of `text`, each with the reason of the skip marker on the line before it, if any.
fn blocks(text: &str) -> Vec<Block> {
    let lines: Vec<&str> = text.lines().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        let line = lines[i].trim();
        if line.starts_with(SKIP) {
            let next = lines.get(i + 1).map_or("", |l| l.trim());
            assert!(
                next == "```sh",
                "README.md:{}: a skip marker not followed by a ```sh fence",
                i + 1
            );
            assert!(
                line.ends_with(SKIP_END),
                "README.md:{}: write {SKIP}reason{SKIP_END}",
                i + 1
            );
        }
        if let Some(lang) = line.strip_prefix("```") {
            let start = i;
            i += 1;
            while i < lines.len() && !lines[i].trim().starts_with("```") {
                i += 1;
            }
            assert!(i < lines.len(), "README.md:{}: a fence that is never closed", start + 1);
            let shell = ["bash", "shell", "console", "zsh"].contains(&lang.trim());
            assert!(
                !shell,
                "README.md:{}: write ```sh, the fence the README test runs",
                start + 1
            );
            if lang.trim() == "sh" {
                let marker = start.checked_sub(1).map(|p| lines[p].trim());
                let skip = marker.and_then(|m| m.strip_prefix(SKIP)?.strip_suffix(SKIP_END));
                out.push(Block {
                    line: start + 1,
                    skip: skip.map(str::to_string),
                    script: lines[start + 1..i].join("\n"),
                });
            }
        }
        i += 1;
    }
    out
}

/// Runs one block in `dir`; `Err` says what went wrong, with the block's output.
fn run(block: &Block, dir: &Path, bin_dir: &Path) -> Result<usize, String> {
    let script = block.script.replace("cargo run --release -p titan-cli --", "titan");
    std::fs::write(dir.join("block.sh"), format!("set -e\n{script}\n")).unwrap();
    let path = format!("{}:{}", bin_dir.display(), std::env::var("PATH").unwrap_or_default());
    let mut child = std::os::unix::process::CommandExt::process_group(
        Command::new("bash")
            .arg("block.sh")
            .current_dir(dir)
            .env("PATH", path)
            .env("HOME", dir)
            .stdin(Stdio::null())
            .stdout(std::fs::File::create(dir.join("block.out")).unwrap())
            .stderr(std::fs::File::create(dir.join("block.err")).unwrap()),
        0,
    )
    .spawn()
    .expect("bash starts");
    let start = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break Some(status);
        }
        if start.elapsed() > LIMIT {
            break None;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    // The block's process group: the block itself if it ran too long, and what it left running.
    let kill = format!("kill -KILL -- -{} 2>/dev/null", child.id());
    let _ = Command::new("bash").args(["-c", &kill]).status();
    let _ = child.wait();
    let stdout = std::fs::read_to_string(dir.join("block.out")).unwrap();
    let stderr = std::fs::read_to_string(dir.join("block.err")).unwrap();
    let output = format!("--- stdout:\n{stdout}\n--- stderr:\n{stderr}");
    match status {
        None => return Err(format!("still running after {LIMIT:?}\n{output}")),
        Some(s) if !s.success() => return Err(format!("exited with {s}\n{output}")),
        Some(_) => {}
    }
    let mut checks = 0;
    for &(used, on_stdout, needle) in EXPECT.iter().filter(|e| script.contains(e.0)) {
        let (name, text) = if on_stdout {
            ("stdout", &stdout)
        } else {
            ("stderr", &stderr)
        };
        let ok = if needle.is_empty() {
            !text.trim().is_empty()
        } else {
            text.contains(needle)
        };
        if !ok {
            return Err(format!("`{used}` should print {needle:?} on {name}\n{output}"));
        }
        checks += 1;
    }
    let words: Vec<&str> = script.split_whitespace().collect();
    for file in words.windows(2).filter(|w| w[0] == "-o").map(|w| w[1]) {
        if !dir.join(file).is_file() {
            return Err(format!("{file} was not written\n{output}"));
        }
        checks += 1;
    }
    if checks == 0 {
        return Err("nothing checks its output: add its command to EXPECT in this test, or mark it skip".into());
    }
    Ok(checks)
}

#[test]
fn every_sh_block_of_the_readme_runs_or_says_why_not() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
    let readme = std::fs::read_to_string(root.join("README.md")).unwrap();
    let bin = PathBuf::from(env!("CARGO_BIN_EXE_titan"));
    let dir = tempfile::tempdir().unwrap();
    let demo = dir.path().join("models/demo");
    std::fs::create_dir_all(&demo).unwrap();
    for entry in std::fs::read_dir(root.join("models/demo")).unwrap() {
        let entry = entry.unwrap();
        std::fs::copy(entry.path(), demo.join(entry.file_name())).unwrap();
    }
    std::os::unix::fs::symlink(root.join("tests"), dir.path().join("tests")).unwrap();

    let all = blocks(&readme);
    assert!(all.len() >= 10, "only {} ```sh blocks found in README.md", all.len());
    let (mut ran, mut skipped, mut failed) = (0, 0, Vec::new());
    for block in &all {
        if let Some(reason) = &block.skip {
            println!("README.md:{}: skipped ({reason})", block.line);
            skipped += 1;
            continue;
        }
        let started = Instant::now();
        match run(block, dir.path(), bin.parent().unwrap()) {
            Ok(checks) => println!(
                "README.md:{}: ran, {checks} checks passed, {:.1?}",
                block.line,
                started.elapsed()
            ),
            Err(e) => failed.push(format!("README.md:{}: {e}", block.line)),
        }
        ran += 1;
    }
    println!("{ran} blocks run, {skipped} skipped");
    assert!(failed.is_empty(), "{}", failed.join("\n\n"));
}
