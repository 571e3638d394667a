//! Oracle test against llama.cpp's own tokenizer test data: `models/ggml-vocab-*.gguf` with
//! `.inp` (texts separated by "\n__ggml_vocab_test__\n") and `.out` (expected ids, one line per
//! text, from `common_tokenize(text, add_special = false, parse_special = false)`).
//!
//! Looks in `$TITAN_LLAMA_VOCABS`, else in the llama.cpp source that `tools/make_fixtures.sh`
//! unpacks under `build/`; skips (with a note) when neither exists. Holds a small GGUF metadata
//! reader of its own because the GGUF crate is not a dependency of this one.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use crate::{Tokenizer, VocabSpec};

#[derive(Debug)]
enum Val {
    Int(i64),
    Float(f64),
    Bool(bool),
    Str(String),
    Arr(Vec<Val>),
}

struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl Reader<'_> {
    fn take(&mut self, n: usize) -> &[u8] {
        let s = &self.buf[self.pos..self.pos + n];
        self.pos += n;
        s
    }
    fn u32(&mut self) -> u32 {
        u32::from_le_bytes(self.take(4).try_into().unwrap())
    }
    fn u64(&mut self) -> u64 {
        u64::from_le_bytes(self.take(8).try_into().unwrap())
    }
    fn string(&mut self) -> String {
        let n = self.u64() as usize;
        String::from_utf8_lossy(self.take(n)).into_owned()
    }
    fn value(&mut self, ty: u32) -> Val {
        match ty {
            0 => Val::Int(self.take(1)[0] as i64),
            1 => Val::Int(self.take(1)[0] as i8 as i64),
            2 => Val::Int(u16::from_le_bytes(self.take(2).try_into().unwrap()) as i64),
            3 => Val::Int(i16::from_le_bytes(self.take(2).try_into().unwrap()) as i64),
            4 => Val::Int(self.u32() as i64),
            5 => Val::Int(self.u32() as i32 as i64),
            6 => Val::Float(f32::from_le_bytes(self.take(4).try_into().unwrap()) as f64),
            7 => Val::Bool(self.take(1)[0] != 0),
            8 => Val::Str(self.string()),
            9 => {
                let elem = self.u32();
                let n = self.u64() as usize;
                Val::Arr((0..n).map(|_| self.value(elem)).collect())
            }
            10 => Val::Int(self.u64() as i64),
            11 => Val::Int(self.u64() as i64),
            12 => Val::Float(f64::from_le_bytes(self.take(8).try_into().unwrap())),
            t => panic!("unknown GGUF value type {t}"),
        }
    }
}

fn read_metadata(path: &Path) -> HashMap<String, Val> {
    let data = std::fs::read(path).unwrap();
    let mut r = Reader { buf: &data, pos: 0 };
    assert_eq!(r.take(4), b"GGUF");
    let _version = r.u32();
    let _tensors = r.u64();
    let n_kv = r.u64();
    (0..n_kv)
        .map(|_| {
            let key = r.string();
            let ty = r.u32();
            (key, r.value(ty))
        })
        .collect()
}

/// The GGUF -> VocabSpec mapping the engine does, for the test only.
fn spec_from_gguf(path: &Path) -> VocabSpec {
    let kv = read_metadata(path);
    let get = |k: &str| kv.get(&format!("tokenizer.ggml.{k}"));
    let string = |k: &str| match get(k) {
        Some(Val::Str(s)) => Some(s.clone()),
        _ => None,
    };
    let id = |k: &str| match get(k) {
        Some(Val::Int(i)) => Some(*i as u32),
        _ => None,
    };
    let flag = |k: &str| match get(k) {
        Some(Val::Bool(b)) => Some(*b),
        _ => None,
    };
    let strings = |k: &str| match get(k) {
        Some(Val::Arr(a)) => Some(a.iter().map(|v| if let Val::Str(s) = v { s.clone() } else { String::new() }).collect()),
        _ => None,
    };
    VocabSpec {
        model: string("model").unwrap_or_default(),
        pre: string("pre"),
        tokens: strings("tokens").unwrap_or_default(),
        scores: match get("scores") {
            Some(Val::Arr(a)) => Some(
                a.iter()
                    .map(|v| match v {
                        Val::Float(f) => *f as f32,
                        Val::Int(i) => *i as f32,
                        _ => 0.0,
                    })
                    .collect(),
            ),
            _ => None,
        },
        token_types: match get("token_type") {
            Some(Val::Arr(a)) => Some(a.iter().map(|v| if let Val::Int(i) = v { *i as i32 } else { 0 }).collect()),
            _ => None,
        },
        merges: strings("merges"),
        bos: id("bos_token_id"),
        eos: id("eos_token_id"),
        eot: id("eot_token_id"),
        eom: id("eom_token_id"),
        unk: id("unknown_token_id"),
        pad: id("padding_token_id"),
        add_bos: flag("add_bos_token"),
        add_eos: flag("add_eos_token"),
        add_space_prefix: flag("add_space_prefix"),
    }
}

fn vocab_dir() -> Option<PathBuf> {
    let dir = std::env::var_os("TITAN_LLAMA_VOCABS").map(PathBuf::from).unwrap_or_else(|| {
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../build/sdist/llama_cpp_python-0.3.36/vendor/llama.cpp/models")
    });
    dir.is_dir().then_some(dir)
}

#[test]
fn matches_llama_cpp_tokenizer_tests() {
    let Some(dir) = vocab_dir() else {
        eprintln!("llama.cpp vocab test data not found; set TITAN_LLAMA_VOCABS to its models/ directory");
        return;
    };
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
        let spec = spec_from_gguf(&gguf);
        let (model, pre) = (spec.model.clone(), spec.pre.clone());
        let tok = match Tokenizer::from_spec(spec) {
            Ok(t) => t,
            Err(e) => {
                eprintln!("{name}: not supported ({model}/{pre:?}): {e}");
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
        let expected: Vec<Vec<u32>> =
            out.lines().map(|l| l.split_whitespace().map(|t| t.parse().unwrap()).collect()).collect();
        assert_eq!(texts.len(), expected.len(), "{name}: .inp and .out disagree on the number of tests");
        let mut ok = 0;
        for (text, want) in texts.iter().zip(&expected) {
            let got = tok.encode(text, false, false);
            // Without llama.cpp's space clean-up, decoding gives the text back byte for byte.
            if !tok.vocab.clean_spaces {
                let back = tok.decode(&got).unwrap();
                if back != *text {
                    failures.push(format!("{name}: decode(encode({text:?})) = {back:?}"));
                }
            }
            if &got == want {
                ok += 1;
            } else {
                failures.push(format!("{name}: {text:?}\n  want {want:?}\n  got  {got:?}"));
            }
        }
        eprintln!("{name} ({model}/{}): {ok}/{} match", pre.as_deref().unwrap_or("-"), texts.len());
    }
    assert!(failures.is_empty(), "{} mismatches:\n{}", failures.len(), failures.join("\n"));
}
