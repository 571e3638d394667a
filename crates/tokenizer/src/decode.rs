//! Detokenization: each token's bytes (llama.cpp's `token_to_piece` with `special = false`),
//! whole-sequence decoding (`llama_detokenize`) and a streaming UTF-8 decoder.

use crate::unicode::char_to_byte;
use crate::vocab::{attr, Kind, Vocab};
use crate::Tokenizer;

/// Every token's piece, concatenated; `offsets[id]..offsets[id + 1]` is token `id`'s.
pub(crate) struct Pieces {
    bytes: Vec<u8>,
    offsets: Vec<usize>,
}

impl Pieces {
    pub(crate) fn build(vocab: &Vocab) -> Self {
        let mut bytes = Vec::new();
        let mut offsets = Vec::with_capacity(vocab.len() + 1);
        offsets.push(0);
        for id in 0..vocab.len() {
            append_piece(vocab, id, &mut bytes);
            offsets.push(bytes.len());
        }
        Self { bytes, offsets }
    }

    pub(crate) fn get(&self, id: u32) -> Option<&[u8]> {
        let id = id as usize;
        let (&start, &end) = (self.offsets.get(id)?, self.offsets.get(id + 1)?);
        Some(&self.bytes[start..end])
    }
}

fn append_piece(vocab: &Vocab, id: usize, out: &mut Vec<u8>) {
    let a = vocab.attrs[id];
    let text = &vocab.texts[id];
    if a & (attr::CONTROL | attr::UNKNOWN) != 0 {
        // rendered as nothing unless asked for special tokens
    } else if a & attr::USER_DEFINED != 0 {
        out.extend_from_slice(text.as_bytes());
    } else if a & attr::NORMAL != 0 {
        match vocab.kind {
            Kind::Spm => out.extend_from_slice(text.replace('\u{2581}', " ").as_bytes()),
            Kind::Bpe => {
                for c in text.chars() {
                    match char_to_byte(c) {
                        Some(b) => out.push(b),
                        // llama.cpp's llama_decode_text marks chars outside GPT-2's byte table.
                        None => {
                            out.extend_from_slice(b"[UNK_BYTE_0x");
                            let mut buf = [0u8; 4];
                            for b in c.encode_utf8(&mut buf).bytes() {
                                out.extend_from_slice(format!("{b:02x}").as_bytes());
                            }
                            out.extend_from_slice(text.as_bytes());
                            out.push(b']');
                        }
                    }
                }
            }
        }
    } else if a & attr::BYTE != 0 {
        // "<0xXX>"
        if let Some(b) = text.get(3..5).and_then(|hex| u8::from_str_radix(hex, 16).ok()) {
            out.push(b);
        }
    }
    // UNUSED and undefined tokens render as nothing.
}

/// llama.cpp's `clean_up_tokenization_spaces` (three passes over bytes; each pass looks at its
/// own input, so a removal never creates a new match within the same pass).
pub(crate) fn clean_spaces(text: Vec<u8>) -> Vec<u8> {
    if text.is_empty() {
        return text;
    }
    // 1: " ?", " !", " .", " ,"  ->  drop the space
    let s = text;
    let mut out = vec![s[0]];
    for i in 1..s.len() {
        if s[i - 1] == b' ' && matches!(s[i], b'?' | b'!' | b'.' | b',') {
            out.pop();
        }
        out.push(s[i]);
    }
    // 2: " ' "  ->  "'"
    let s = out;
    let mut out = vec![s[0]];
    let mut i = 1;
    // llama.cpp overwrites the second space of a match with NUL, so it can't be the next "prev".
    let mut consumed = usize::MAX;
    while i < s.len() {
        let x = s[i];
        let prev_space = s[i - 1] == b' ' && i - 1 != consumed;
        if x == b'\'' && i + 1 < s.len() && prev_space && s[i + 1] == b' ' {
            out.pop();
            out.push(x);
            consumed = i + 1;
            i += 2;
            continue;
        }
        out.push(x);
        i += 1;
    }
    // 3: " 's", " 'm", " 're", " 've"  ->  drop the space (" 't", " 'd", " 'll" keep it)
    let s = out;
    let mut out = vec![s[0]];
    for i in 1..s.len() {
        let x = s[i];
        if s[i - 1] == b' ' && x == b'\'' && i + 1 < s.len() {
            let x1 = s[i + 1];
            let drop = match x1 {
                b't' | b'd' => false,
                b's' | b'm' => true,
                _ => i + 2 < s.len() && matches!((x1, s[i + 2]), (b'r', b'e') | (b'v', b'e')),
            };
            if drop {
                out.pop();
            }
        }
        out.push(x);
    }
    out
}

/// Decodes ids one at a time, returning only complete UTF-8 text: an incomplete multi-byte
/// sequence at the end is held back until the next token completes it. Byte sequences that can
/// never become valid are replaced with U+FFFD, as `String::from_utf8_lossy` would.
///
/// Pieces are streamed as llama.cpp's generation loop prints them (`token_to_piece`, no leading
/// space removed, no space clean-up): for SentencePiece models the first token's leading space
/// and for clean-up vocabularies spaces before punctuation are kept, where `decode` would not.
pub struct StreamDecoder<'a> {
    tokenizer: &'a Tokenizer,
    pending: Vec<u8>,
}

impl<'a> StreamDecoder<'a> {
    pub(crate) fn new(tokenizer: &'a Tokenizer) -> Self {
        Self {
            tokenizer,
            pending: Vec::new(),
        }
    }

    /// Adds one token; returns the text that became complete. An id out of range adds nothing.
    pub fn push(&mut self, id: u32) -> String {
        if let Some(bytes) = self.tokenizer.token_bytes(id) {
            self.pending.extend_from_slice(bytes);
        }
        self.drain(false)
    }

    /// Flushes what is left; an unfinished sequence becomes U+FFFD.
    pub fn finish(mut self) -> String {
        self.drain(true)
    }

    fn drain(&mut self, at_end: bool) -> String {
        let mut out = String::new();
        let mut rest: &[u8] = &self.pending;
        loop {
            match std::str::from_utf8(rest) {
                Ok(s) => {
                    out.push_str(s);
                    rest = &[];
                    break;
                }
                Err(e) => {
                    let (valid, tail) = rest.split_at(e.valid_up_to());
                    out.push_str(std::str::from_utf8(valid).unwrap_or_default());
                    match e.error_len() {
                        Some(bad) => {
                            out.push('\u{FFFD}');
                            rest = &tail[bad..];
                        }
                        None => {
                            rest = if at_end {
                                out.push('\u{FFFD}');
                                &[]
                            } else {
                                tail
                            };
                            break;
                        }
                    }
                }
            }
        }
        self.pending = rest.to_vec();
        out
    }
}

#[cfg(test)]
mod tests {
    use super::clean_spaces;

    fn clean(s: &str) -> String {
        String::from_utf8(clean_spaces(s.as_bytes().to_vec())).unwrap()
    }

    #[test]
    fn clean_spaces_matches_llama_cpp_passes() {
        assert_eq!(clean("Hello , world !"), "Hello, world!");
        assert_eq!(clean("a  ."), "a .");
        assert_eq!(clean("don ' t"), "don't");
        assert_eq!(clean("it 's I 'm we 're they 've"), "it's I'm we're they've");
        assert_eq!(clean("can 't he 'd we 'll"), "can 't he 'd we 'll");
        assert_eq!(clean("x ' ' y"), "x'' y");
        assert_eq!(clean(""), "");
    }
}
