//! The tokenizer against llama.cpp's own tokenizer test data: `models/ggml-vocab-*.gguf` with `.inp`
//! (texts separated by "\n__ggml_vocab_test__\n") and `.out` (llama.cpp's ids, one line per text, from
//! `common_tokenize(text, add_special = false, parse_special = false)`), real vocabularies of many model
//! families. The files are several MB each, so they are not committed: this test reads them from the
//! llama.cpp source that `tools/make_fixtures.sh` unpacks under build/, and is ignored by default.

use std::path::{Path, PathBuf};

use titan_engine::vocab::tokenizer_from_gguf;
use titan_engine::EngineError;
use titan_gguf::GgufFile;

fn vocab_dir() -> Option<PathBuf> {
    let dir = std::env::var_os("TITAN_LLAMA_VOCABS")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("../../build/sdist/llama_cpp_python-0.3.36/vendor/llama.cpp/models")
        });
    dir.is_dir().then_some(dir)
}

#[test]
#[ignore = "needs llama.cpp's source tree: run `bash tools/make_fixtures.sh` (or set TITAN_LLAMA_VOCABS), then `cargo test -- --ignored`"]
fn matches_llama_cpp_tokenizer_tests() {
    let dir = vocab_dir().expect("llama.cpp's models/ directory with ggml-vocab-*.gguf (set TITAN_LLAMA_VOCABS)");
    let mut inputs: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "inp"))
        .collect();
    inputs.sort();
    let mut failures = Vec::new();
    for inp in inputs {
        let gguf = inp.with_extension("");
        let name = gguf.file_name().unwrap().to_string_lossy().into_owned();
        let tok = match GgufFile::open(&gguf)
            .map_err(EngineError::from)
            .and_then(|f| tokenizer_from_gguf(&f))
        {
            Ok(t) => t,
            Err(e) => {
                eprintln!("{name}: not supported: {e}");
                continue;
            }
        };
        let raw = std::fs::read_to_string(&inp).unwrap();
        let sep = "\n__ggml_vocab_test__\n";
        let mut texts = Vec::new();
        let mut pos = 0;
        while pos < raw.len() {
            match raw[pos..].find(sep) {
                Some(i) => {
                    texts.push(&raw[pos..pos + i]);
                    pos += i + sep.len();
                }
                None => {
                    texts.push(&raw[pos..]);
                    break;
                }
            }
        }
        let out = std::fs::read_to_string(inp.with_extension("out")).unwrap();
        let expected: Vec<Vec<u32>> = out
            .lines()
            .map(|l| l.split_whitespace().map(|t| t.parse().unwrap()).collect())
            .collect();
        assert_eq!(
            texts.len(),
            expected.len(),
            "{name}: .inp and .out disagree on the number of tests"
        );
        let mut ok = 0;
        for (text, want) in texts.iter().zip(&expected) {
            let got = tok.encode(text, false, false);
            if &got == want {
                ok += 1;
            } else {
                failures.push(format!("{name}: {text:?}\n  want {want:?}\n  got  {got:?}"));
            }
        }
        eprintln!("{name}: {ok}/{} match", texts.len());
    }
    assert!(
        failures.is_empty(),
        "{} mismatches:\n{}",
        failures.len(),
        failures.join("\n")
    );
}
