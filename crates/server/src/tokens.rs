//! llama-server's `POST /tokenize` and `POST /detokenize`: text to this model's token ids and back, in
//! llama-server's shapes. The body size limit bounds both; an id outside the vocabulary is a 400 naming it.

use serde::Deserialize;
use serde_json::{json, Value};
use titan_tokenizer::Tokenizer;

use crate::api::from_json;
use crate::error::ApiError;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct TokenizeRequest {
    content: String,
    /// Add the BOS (and EOS) tokens the vocabulary asks for.
    #[serde(default)]
    add_special: bool,
    /// Control-token text (`<|im_start|>`) becomes that token, as in a chat prompt.
    #[serde(default = "yes")]
    parse_special: bool,
    /// Each id with its text: a string, or its bytes when they are not whole UTF-8.
    #[serde(default)]
    with_pieces: bool,
}

fn yes() -> bool {
    true
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct DetokenizeRequest {
    tokens: Vec<i64>,
}

/// `{"content": TEXT, "add_special": bool, "parse_special": bool, "with_pieces": bool}` →
/// `{"tokens": [ID, …]}` (or `[{"id", "piece"}, …]` with pieces).
pub fn tokenize(tokenizer: &Tokenizer, body: &[u8]) -> Result<Value, ApiError> {
    let r: TokenizeRequest = from_json(body)?;
    let ids = tokenizer.encode(&r.content, r.add_special, r.parse_special);
    if !r.with_pieces {
        return Ok(json!({ "tokens": ids }));
    }
    let pieces: Vec<Value> = ids
        .iter()
        .map(|&id| {
            let bytes = tokenizer.token_bytes(id).unwrap_or_default();
            let piece = std::str::from_utf8(bytes).map_or_else(|_| json!(bytes), |s| json!(s));
            json!({"id": id, "piece": piece})
        })
        .collect();
    Ok(json!({ "tokens": pieces }))
}

/// `{"tokens": [ID, …]}` → `{"content": TEXT}`; every id must be in the vocabulary.
pub fn detokenize(tokenizer: &Tokenizer, body: &[u8]) -> Result<Value, ApiError> {
    let r: DetokenizeRequest = from_json(body)?;
    let n = tokenizer.vocab_size();
    let ids = r
        .tokens
        .iter()
        .map(|&id| {
            u32::try_from(id).ok().filter(|&id| (id as usize) < n).ok_or_else(|| {
                ApiError::bad_request(format!("token id {id} is outside the vocabulary (0..{n})")).param("tokens")
            })
        })
        .collect::<Result<Vec<u32>, ApiError>>()?;
    let content = tokenizer
        .decode(&ids)
        .map_err(|e| ApiError::bad_request(e.to_string()).param("tokens"))?;
    Ok(json!({ "content": content }))
}
