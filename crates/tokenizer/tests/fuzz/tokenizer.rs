//! The `tokenizer` fuzz target's body, shared by `fuzz/fuzz_targets/tokenizer.rs` and
//! `tests/fuzz_corpus.rs`: a user's text encoded, and token ids decoded, by the tokenizers of the
//! fixture models (built as the model loader builds them) and by the demo model's vocabulary under
//! every pre-tokenizer name below. The first bytes (through `arbitrary`) choose the tokenizer and
//! the flags; the rest is the text (lossy UTF-8) and, read again, the ids.

use std::path::Path;

use arbitrary::Unstructured;
use titan_gguf::GgufFile;
use titan_tokenizer::{Tokenizer, TokenizerError, VocabSpec};

/// Models whose tokenizers are built by the engine's loader: byte-level BPE with the Qwen2 and
/// GPT-2 splitters, and SentencePiece.
const MODELS: [&str; 3] = [
    "models/demo/demo-q8_0.gguf",
    "tests/fixtures/olmoe/q8_0.gguf",
    "tests/fixtures/mixtral/q8_0.gguf",
];

/// Pre-tokenizer names given to the demo's BPE vocabulary, one or more per hand-written splitter
/// and regex family of `pretokenize::for_pre_name`.
const PRE_NAMES: [&str; 24] = [
    "default",
    "llama3",
    "falcon3",
    "dbrx",
    "deepseek-llm",
    "deepseek-coder",
    "deepseek-v3",
    "falcon",
    "starcoder",
    "gpt-2",
    "jina-es",
    "mpt",
    "jais",
    "trillion",
    "qwen2",
    "stablelm2",
    "poro-chat",
    "bloom",
    "tekken",
    "gpt-4o",
    "chatglm-bpe",
    "seed-coder",
    "kormo",
    "command-r",
];

pub struct Tokenizers(Vec<Tokenizer>);

impl Tokenizers {
    pub fn load(repo: &Path) -> Tokenizers {
        let open = |m: &str| GgufFile::open(repo.join(m)).unwrap_or_else(|e| panic!("{e}"));
        let mut all: Vec<Tokenizer> = MODELS
            .iter()
            .map(|m| titan_engine::vocab::tokenizer_from_gguf(&open(m)).unwrap_or_else(|e| panic!("{m}: {e}")))
            .collect();
        let demo = open(MODELS[0]);
        for pre in PRE_NAMES {
            let spec = VocabSpec {
                model: "gpt2".into(),
                pre: Some(pre.into()),
                tokens: demo.strings("tokenizer.ggml.tokens").unwrap().unwrap(),
                token_types: demo
                    .i64s("tokenizer.ggml.token_type")
                    .unwrap()
                    .map(|v| v.into_iter().map(|t| t as i32).collect()),
                merges: demo.strings("tokenizer.ggml.merges").unwrap(),
                eos: demo.get_u64("tokenizer.ggml.eos_token_id").unwrap().map(|v| v as u32),
                ..VocabSpec::default()
            };
            all.push(
                Tokenizer::from_spec(spec).unwrap_or_else(|e| panic!("the demo vocabulary with pre {pre:?}: {e}")),
            );
        }
        Tokenizers(all)
    }
}

pub fn run(tokenizers: &Tokenizers, data: &[u8]) {
    let mut u = Unstructured::new(data);
    let Ok(t) = u.choose(&tokenizers.0) else {
        return;
    };
    let (Ok(add_special), Ok(parse_special), Ok(ids_in_range)) = (u.arbitrary(), u.arbitrary(), u.arbitrary::<bool>())
    else {
        return;
    };
    let rest = u.take_rest();
    let n = t.vocab_size();

    let ids = t.encode(&String::from_utf8_lossy(rest), add_special, parse_special);
    assert!(
        ids.iter().all(|&id| (id as usize) < n),
        "encode gave an id past the vocabulary of {n}"
    );
    t.decode(&ids).expect("ids from encode decode");

    // Mostly valid ids, or any u32 (mostly past the vocabulary), as a client of the API may send.
    let ids: Vec<u32> = match ids_in_range {
        true => rest
            .chunks(2)
            .map(|c| c.iter().fold(0u32, |a, &b| a << 8 | b as u32) % n as u32)
            .collect(),
        false => rest
            .chunks(4)
            .map(|c| c.iter().fold(0u32, |a, &b| a << 8 | b as u32))
            .collect(),
    };
    match t.decode(&ids) {
        Ok(_) => assert!(ids.iter().all(|&id| (id as usize) < n)),
        Err(TokenizerError::IdOutOfRange { id, .. }) => {
            assert!(id as usize >= n && ids.contains(&id))
        }
        Err(e) => panic!("decode failed with {e}, not an out-of-range id"),
    }
    // Streaming gives the pieces' bytes as lossy UTF-8, however the ids cut multi-byte characters.
    let mut stream = t.stream();
    let mut streamed: String = ids.iter().map(|&id| stream.push(id)).collect();
    streamed += &stream.finish();
    let bytes: Vec<u8> = ids
        .iter()
        .filter_map(|&id| t.token_bytes(id))
        .flatten()
        .copied()
        .collect();
    assert_eq!(streamed, String::from_utf8_lossy(&bytes));
}
