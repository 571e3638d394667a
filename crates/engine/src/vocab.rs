//! The tokenizer described by a GGUF file's `tokenizer.ggml.*` metadata.

use titan_gguf::GgufFile;
use titan_tokenizer::{Tokenizer, VocabSpec};

use crate::{EngineError, Result};

pub fn tokenizer_from_gguf(f: &GgufFile) -> Result<Tokenizer> {
    let key = |s: &str| format!("tokenizer.ggml.{s}");
    let id = |s: &str| -> Result<Option<u32>> { Ok(f.get_u64(&key(s))?.map(|v| v as u32)) };
    let model = f.get_str(&key("model"))?.ok_or_else(|| EngineError::Model {
        path: f.path().display().to_string(),
        what: "no tokenizer in the metadata (tokenizer.ggml.model is missing)".into(),
    })?;
    let spec = VocabSpec {
        model: model.to_string(),
        pre: f.get_str(&key("pre"))?.map(str::to_string),
        tokens: f.strings(&key("tokens"))?.unwrap_or_default(),
        scores: f.f32s(&key("scores"))?,
        token_types: f
            .i64s(&key("token_type"))?
            .map(|v| v.into_iter().map(|t| t as i32).collect()),
        merges: f.strings(&key("merges"))?,
        bos: id("bos_token_id")?,
        eos: id("eos_token_id")?,
        eot: id("eot_token_id")?,
        eom: id("eom_token_id")?,
        unk: id("unknown_token_id")?,
        pad: id("padding_token_id")?,
        add_bos: f.get_bool(&key("add_bos_token"))?,
        add_eos: f.get_bool(&key("add_eos_token"))?,
        add_space_prefix: f.get_bool(&key("add_space_prefix"))?,
    };
    Tokenizer::from_spec(spec).map_err(|e| EngineError::Model {
        path: f.path().display().to_string(),
        what: e.to_string(),
    })
}
