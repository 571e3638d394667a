//! Tokenizers built from a GGUF vocabulary that produce exactly llama.cpp's token ids.
//!
//! - `tokenizer.ggml.model = "gpt2"`: byte-level BPE with the pre-tokenizer named by
//!   `tokenizer.ggml.pre` ([`pretokenize`]), merges by rank ([`bpe`]).
//! - `tokenizer.ggml.model = "llama"`: SentencePiece BPE by token score with byte fallback ([`spm`]).
//!
//! Both first cut special-token texts out of the input ([`special`]); decoding follows
//! llama.cpp's `token_to_piece` / `llama_detokenize` ([`decode`]). A Hugging Face
//! `tokenizer.json` with a ByteLevel BPE maps onto the same BPE path ([`hf_json`]).

mod bpe;
mod decode;
mod hf_json;
mod pretokenize;
mod special;
mod spm;
mod unicode;
mod vocab;

use std::path::Path;

pub use decode::StreamDecoder;

use bpe::Merges;
use pretokenize::PreTokenizer;
use special::Fragment;
use vocab::{attr, Kind, PreFlags, Vocab};

/// What the engine reads from GGUF metadata (keys `tokenizer.ggml.*`).
#[derive(Debug, Clone, Default)]
pub struct VocabSpec {
    /// `tokenizer.ggml.model`: "gpt2" or "llama".
    pub model: String,
    /// `tokenizer.ggml.pre`; absent means llama.cpp's "default".
    pub pre: Option<String>,
    pub tokens: Vec<String>,
    pub scores: Option<Vec<f32>>,
    /// 1 normal, 2 unknown, 3 control, 4 user defined, 5 unused, 6 byte.
    pub token_types: Option<Vec<i32>>,
    /// "left right", rank = index.
    pub merges: Option<Vec<String>>,
    pub bos: Option<u32>,
    pub eos: Option<u32>,
    pub eot: Option<u32>,
    pub eom: Option<u32>,
    pub unk: Option<u32>,
    pub pad: Option<u32>,
    pub add_bos: Option<bool>,
    pub add_eos: Option<bool>,
    pub add_space_prefix: Option<bool>,
}

/// Why a tokenizer could not be built or an id sequence not decoded.
#[derive(Debug, thiserror::Error)]
pub enum TokenizerError {
    /// `tokenizer.ggml.model` is neither "gpt2" nor "llama".
    #[error("unknown tokenizer model \"{0}\": supported are \"gpt2\" (byte-level BPE) and \"llama\" (SentencePiece)")]
    UnknownModel(String),
    /// `tokenizer.ggml.pre` names a pre-tokenizer this crate does not implement.
    #[error("unknown pre-tokenizer \"{0}\" (tokenizer.ggml.pre): not one of the pre-tokenizers llama.cpp names that titan supports")]
    UnknownPreTokenizer(String),
    /// A pre-tokenizer regex did not compile.
    #[error("pre-tokenizer regex {pattern:?} does not compile: {message}")]
    BadRegex { pattern: String, message: String },
    #[error("the vocabulary has no tokens (tokenizer.ggml.tokens is empty)")]
    EmptyVocab,
    #[error("the vocabulary has {0} tokens, more than token ids can address")]
    VocabTooLarge(usize),
    /// A per-token array is shorter than the token list.
    #[error("tokenizer.ggml.{what} has {len} entries for {n_tokens} tokens")]
    ShortArray {
        what: &'static str,
        len: usize,
        n_tokens: usize,
    },
    #[error("duplicate token {text:?} in the vocabulary (ids {first} and {second})")]
    DuplicateToken { text: String, first: u32, second: u32 },
    /// The vocabulary asks for a special token it does not define.
    #[error("{flag} is set but the vocabulary has no {token} token id")]
    MissingSpecial { flag: &'static str, token: &'static str },
    #[error("a gpt2 (BPE) vocabulary needs merges (tokenizer.ggml.merges), and there are none")]
    MissingMerges,
    #[error("merge {rank} ({merge:?}) is not of the form \"left right\"")]
    BadMerge { rank: usize, merge: String },
    #[error("merge {rank} ({merge:?}) refers to {token:?}, which is not in the vocabulary")]
    MergeTokenMissing { rank: usize, merge: String, token: String },
    #[error("token id {id} is out of range: the vocabulary has {vocab_size} tokens")]
    IdOutOfRange { id: u32, vocab_size: usize },
    #[error("cannot read {path}: {error}")]
    Io { path: String, error: std::io::Error },
    #[error("{path} is not valid tokenizer JSON: {message}")]
    Json { path: String, message: String },
    /// A tokenizer.json this crate cannot map onto its byte-level BPE.
    #[error("{path}: unsupported tokenizer.json: {what}")]
    UnsupportedJson { path: String, what: String },
}

enum Model {
    Bpe { merges: Merges, pre: PreTokenizer },
    Spm,
}

pub struct Tokenizer {
    vocab: Vocab,
    model: Model,
    pieces: decode::Pieces,
    max_token_bytes: usize,
}

impl Tokenizer {
    /// Builds the tokenizer llama.cpp would build from these GGUF metadata.
    pub fn from_spec(spec: VocabSpec) -> Result<Self, TokenizerError> {
        match spec.model.as_str() {
            "llama" => Self::build(spec, Kind::Spm, PreFlags::default(), None, true),
            "gpt2" => {
                let pre = pretokenize::for_pre_name(spec.pre.as_deref())?;
                let flags = PreFlags {
                    ignore_merges: pre.ignore_merges,
                    clean_spaces: pre.clean_spaces,
                    add_bos: pre.add_bos,
                    no_default_bos: pre.no_default_bos,
                };
                Self::build(spec, Kind::Bpe, flags, Some(pre.splitter), true)
            }
            other => Err(TokenizerError::UnknownModel(other.to_string())),
        }
    }

    /// Loads a Hugging Face `tokenizer.json` holding a byte-level BPE (with, when present, the
    /// BOS/EOS settings of a `tokenizer_config.json` beside it).
    pub fn from_tokenizer_json(path: &Path) -> Result<Self, TokenizerError> {
        let loaded = hf_json::load(path)?;
        Self::build(loaded.spec, Kind::Bpe, loaded.flags, Some(loaded.splitter), false)
    }

    fn build(
        mut spec: VocabSpec,
        kind: Kind,
        flags: PreFlags,
        splitter: Option<PreTokenizer>,
        llama_defaults: bool,
    ) -> Result<Self, TokenizerError> {
        let merge_lines = spec.merges.take();
        let vocab = Vocab::build(spec, kind, flags, llama_defaults)?;
        let model = match (kind, splitter) {
            (Kind::Bpe, Some(pre)) => {
                let lines = merge_lines.ok_or(TokenizerError::MissingMerges)?;
                Model::Bpe {
                    merges: Merges::parse(lines.iter().map(String::as_str), &vocab)?,
                    pre,
                }
            }
            _ => Model::Spm,
        };
        let pieces = decode::Pieces::build(&vocab);
        // An unknown character (up to 4 bytes of UTF-8) can become one unk token, whatever the texts.
        let max_token_bytes = vocab.texts.iter().map(String::len).max().unwrap_or(0).max(4);
        Ok(Self {
            vocab,
            model,
            pieces,
            max_token_bytes,
        })
    }

    /// Token ids for `text`. `add_special`: add BOS/EOS as the vocabulary asks;
    /// `parse_special`: literal control-token text (e.g. "<|im_start|>") becomes that token
    /// rather than being tokenized as plain text.
    pub fn encode(&self, text: &str, add_special: bool, parse_special: bool) -> Vec<u32> {
        let v = &self.vocab;
        let mut out = Vec::new();
        if add_special && v.add_bos {
            out.extend(v.bos);
        }
        let fragments = special::partition(v, text, parse_special);
        match &self.model {
            Model::Bpe { merges, pre } => {
                for fragment in fragments {
                    match fragment {
                        Fragment::Token(id) => out.push(id),
                        Fragment::Text(t) => {
                            for word in pre.split(t) {
                                merges.encode_word(v, &unicode::byte_encode(word), &mut out);
                            }
                        }
                    }
                }
            }
            Model::Spm => {
                // The space prefix goes before the first text and before any text that follows
                // a special token, as in llama.cpp.
                let mut after_special = true;
                for fragment in fragments {
                    match fragment {
                        Fragment::Token(id) => {
                            out.push(id);
                            after_special = true;
                        }
                        Fragment::Text(t) => {
                            let prefix = if v.add_space_prefix && after_special { " " } else { "" };
                            let escaped = format!("{prefix}{t}").replace(' ', "\u{2581}");
                            spm::encode(v, &escaped, &mut out);
                            after_special = false;
                        }
                    }
                }
            }
        }
        if add_special && v.add_eos {
            out.extend(v.eos);
        }
        out
    }

    /// Text for `ids`, as llama.cpp's `llama_detokenize(remove_special = false,
    /// unparse_special = false)`: control tokens render as nothing, the leading space a
    /// SentencePiece vocabulary adds is removed from the first token, and vocabularies with
    /// `clean_up_tokenization_spaces` get llama.cpp's space clean-up. Bytes that are not valid
    /// UTF-8 become U+FFFD.
    pub fn decode(&self, ids: &[u32]) -> Result<String, TokenizerError> {
        let mut bytes = Vec::new();
        let mut strip_space = self.vocab.add_space_prefix;
        for &id in ids {
            let piece = self.token_bytes(id).ok_or(TokenizerError::IdOutOfRange {
                id,
                vocab_size: self.vocab_size(),
            })?;
            let piece = match piece {
                [b' ', rest @ ..] if strip_space => rest,
                _ => piece,
            };
            bytes.extend_from_slice(piece);
            strip_space = false;
        }
        if self.vocab.clean_spaces {
            bytes = decode::clean_spaces(bytes);
        }
        Ok(match String::from_utf8(bytes) {
            Ok(s) => s,
            Err(e) => String::from_utf8_lossy(e.as_bytes()).into_owned(),
        })
    }

    /// The bytes one token renders as (control tokens: empty); `None` if out of range.
    pub fn token_bytes(&self, id: u32) -> Option<&[u8]> {
        self.pieces.get(id)
    }

    /// The name of a token that renders as no text (a control, unknown or unused token, such as
    /// `<|im_end|>`); `None` for one that renders as bytes ([`token_bytes`](Self::token_bytes)) or an id
    /// out of range. A grammar over the output tells such tokens apart from text by it.
    pub fn special_text(&self, id: u32) -> Option<&str> {
        let a = *self.vocab.attrs.get(id as usize)?;
        let renders =
            a & (attr::CONTROL | attr::UNKNOWN) == 0 && a & (attr::USER_DEFINED | attr::NORMAL | attr::BYTE) != 0;
        (!renders).then(|| self.vocab.texts[id as usize].as_str())
    }

    /// The most bytes of input text one token of [`encode`](Self::encode) can stand for: the longest
    /// token text in the vocabulary (at least 4, an unknown character's). Every token matches its own
    /// text in the input as the tokenizer sees it, and that text is never shorter than the bytes it
    /// came from (byte-level BPE writes each byte as a 1- or 2-byte character, SentencePiece a space as
    /// the 3-byte `▁`, a byte token `<0xXX>` stands for one byte), so a text of L bytes encodes into at
    /// least L / max_token_bytes() tokens: a server can refuse a text that cannot fit in its context
    /// without encoding it.
    pub fn max_token_bytes(&self) -> usize {
        self.max_token_bytes
    }

    pub fn vocab_size(&self) -> usize {
        self.vocab.len()
    }

    pub fn bos(&self) -> Option<u32> {
        self.vocab.bos
    }

    /// The BOS token, when the vocabulary asks for it to start every text.
    pub fn added_bos(&self) -> Option<u32> {
        self.vocab.bos.filter(|_| self.vocab.add_bos)
    }

    pub fn eos(&self) -> Option<u32> {
        self.vocab.eos
    }

    /// End of generation: EOS, EOT, EOM and the tokens llama.cpp recognises by their text
    /// ("<|im_end|>", "<|endoftext|>", "<|eot_id|>", "</s>", …).
    pub fn is_eog(&self, id: u32) -> bool {
        self.vocab.eog.contains(&id)
    }

    pub fn stream(&self) -> StreamDecoder<'_> {
        StreamDecoder::new(self)
    }
}

#[cfg(test)]
mod tests;
