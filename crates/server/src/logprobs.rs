//! Log-probabilities in OpenAI's two shapes. Chat's: `{"content": [{"token", "logprob", "bytes",
//! "top_logprobs": [{"token", "logprob", "bytes"}, …]}, …]}`, each token with its `id` too, as llama-server
//! gives it. The legacy completions': `{"tokens": […], "token_logprobs": […], "top_logprobs": [{token:
//! logprob, …}, …], "text_offset": […]}`, where a token that is not whole UTF-8 is written `bytes:\xNN…`, so
//! that no two tokens share a key.
//!
//! The values are the model's own distribution (see [`titan_engine::sampler::logprobs`]): a logit bias or a
//! penalty changes which token is chosen, not the log-probabilities reported.

use std::fmt::Write;
use std::sync::Arc;

use serde_json::{json, Map, Value};
use titan_engine::sampler::TokenLogprobs;
use titan_engine::Model;

use crate::api::Kind;

/// Renders a request's log-probabilities, chunk after chunk.
pub struct Logprobs {
    kind: Kind,
    model: Arc<Model>,
    /// Where the next token's text begins in the completion's text (legacy `text_offset`).
    offset: TextOffset,
}

impl Logprobs {
    pub fn new(kind: Kind, model: Arc<Model>) -> Logprobs {
        Logprobs {
            kind,
            model,
            offset: TextOffset::default(),
        }
    }

    fn bytes(&self, id: u32) -> &[u8] {
        self.model.tokenizer.token_bytes(id).unwrap_or_default()
    }

    /// The `logprobs` object of the tokens in `entries`, which follow those of the earlier calls.
    pub fn json(&mut self, entries: &[TokenLogprobs]) -> Value {
        match self.kind {
            Kind::Chat => {
                let token = |id: u32, logprob: f32| {
                    let bytes = self.bytes(id);
                    json!({"id": id, "token": String::from_utf8_lossy(bytes), "bytes": bytes, "logprob": logprob})
                };
                let content: Vec<Value> = entries
                    .iter()
                    .map(|e| {
                        let mut v = token(e.token, e.logprob);
                        v["top_logprobs"] = e.top.iter().map(|&(id, l)| token(id, l)).collect();
                        v
                    })
                    .collect();
                json!({ "content": content })
            }
            Kind::Completion => {
                let mut text_offset = Vec::with_capacity(entries.len());
                for e in entries {
                    let bytes = self.model.tokenizer.token_bytes(e.token).unwrap_or_default();
                    text_offset.push(self.offset.push(bytes));
                }
                let tokens: Vec<String> = entries.iter().map(|e| legacy_token(self.bytes(e.token))).collect();
                let top: Vec<Map<String, Value>> = entries
                    .iter()
                    .map(|e| {
                        e.top
                            .iter()
                            .map(|&(id, l)| (legacy_token(self.bytes(id)), json!(l)))
                            .collect()
                    })
                    .collect();
                json!({
                    "tokens": tokens,
                    "token_logprobs": entries.iter().map(|e| e.logprob).collect::<Vec<_>>(),
                    "top_logprobs": top,
                    "text_offset": text_offset,
                })
            }
        }
    }
}

/// A token as the legacy shape writes it: its text, or `bytes:\xNN…` when it is not whole UTF-8.
fn legacy_token(bytes: &[u8]) -> String {
    match std::str::from_utf8(bytes) {
        Ok(s) => s.to_string(),
        Err(_) => bytes.iter().fold(String::from("bytes:"), |mut out, b| {
            let _ = write!(out, "\\x{b:02x}");
            out
        }),
    }
}

/// Counts the characters of a text that arrives as token bytes, as the text is decoded: a character split
/// between tokens counts once it is whole, bytes that can never be valid as one U+FFFD each time.
#[derive(Default)]
struct TextOffset {
    chars: usize,
    /// The start of a character not yet whole (at most 3 bytes).
    pending: Vec<u8>,
}

impl TextOffset {
    /// Where a token of `bytes` begins, in characters of the text: those that end before its first byte
    /// (a character it completes begins before it, and is where it begins).
    fn push(&mut self, bytes: &[u8]) -> usize {
        let before = self.pending.len();
        self.pending.extend_from_slice(bytes);
        let mut at = self.chars;
        let mut pos = 0;
        while let Some(n) = next_char(&self.pending[pos..]) {
            if pos + n <= before {
                at += 1;
            }
            self.chars += 1;
            pos += n;
        }
        self.pending.drain(..pos);
        at
    }
}

/// The length in bytes of the first character `bytes` decode to (a valid one, or a sequence that can never
/// be valid, which decodes to one U+FFFD); None when they are empty or the start of a character only.
fn next_char(bytes: &[u8]) -> Option<usize> {
    match std::str::from_utf8(bytes) {
        Ok(s) => s.chars().next().map(char::len_utf8),
        Err(e) if e.valid_up_to() > 0 => std::str::from_utf8(&bytes[..e.valid_up_to()])
            .ok()
            .and_then(|s| s.chars().next())
            .map(char::len_utf8),
        Err(e) => e.error_len(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_offsets_count_characters_as_the_text_decodes() {
        let mut o = TextOffset::default();
        // "a", "é" split over two tokens, "b", a byte that is never valid, "c".
        let tokens: [&[u8]; 5] = [b"a", &[0xc3], &[0xa9, b'b'], &[0xff], b"c"];
        let at: Vec<usize> = tokens.iter().map(|t| o.push(t)).collect();
        assert_eq!(at, [0, 1, 1, 3, 4]);
        assert_eq!(o.push(b""), 5);
        // A lead byte the next token does not continue: that token begins after its U+FFFD.
        let mut o = TextOffset::default();
        assert_eq!(o.push(&[0xee]), 0);
        assert_eq!(o.push(b"x"), 1);
    }

    #[test]
    fn tokens_that_are_not_whole_utf8_are_written_as_bytes() {
        assert_eq!(legacy_token(b" the"), " the");
        assert_eq!(legacy_token(&[0xe2, 0x80]), "bytes:\\xe2\\x80");
        assert_eq!(legacy_token(b""), "");
    }
}
