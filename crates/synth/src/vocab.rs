//! A stand-in vocabulary of the real model's size and special tokens, as `tokenizer.ggml.*` metadata
//! both llama.cpp and TITAN's tokenizer load.
//!
//! Byte-level BPE vocabularies hold the 256 byte characters of GPT-2's byte-to-unicode map, a handful of
//! merges (llama.cpp requires the key) with their merged tokens, pronounceable filler words up to the
//! tokenizer's size, the control tokens at their real ids, and `[PAD{id}]` tokens (type unused) up to the
//! embedding's row count, as the converter pads. The SentencePiece vocabulary (Mixtral) holds `<unk>`,
//! `<s>`, `</s>`, the 256 `<0xNN>` byte tokens and scored `▁word` pieces.

use titan_gguf::{Value, ValueType};

use crate::preset::{Preset, VocabKind};

const NORMAL: i32 = 1;
const UNKNOWN: i32 = 2;
const CONTROL: i32 = 3;
const UNUSED: i32 = 5;
const BYTE: i32 = 6;

/// The metadata entries (key, value) of the vocabulary.
pub(crate) fn metadata(p: &Preset) -> Vec<(String, Value)> {
    let n = p.n_vocab;
    let mut kv = Vec::new();
    let mut set = |k: &str, v: Value| kv.push((format!("tokenizer.ggml.{k}"), v));
    match p.vocab {
        VocabKind::Qwen2
        | VocabKind::Qwen35
        | VocabKind::Olmo
        | VocabKind::Harmony
        | VocabKind::DeepSeek
        | VocabKind::Glm
        | VocabKind::MiniMax
        | VocabKind::Llama4 => {
            // (control tokens by their offset from the first one's id, that real id): the ids between and
            // after them are the tokenizer's other added tokens, written as padding (or, for harmony, as
            // its reserved control tokens).
            let (specials, first): (&[(usize, &str)], usize) = match p.vocab {
                VocabKind::Qwen2 => (&CHATML_TOKENS, 151_643),
                VocabKind::Qwen35 => (&CHATML_TOKENS, 248_044),
                VocabKind::Harmony => (&HARMONY_TOKENS, 199_998),
                VocabKind::DeepSeek => (&DEEPSEEK_TOKENS, 100_000),
                VocabKind::Glm => (&GLM_TOKENS, 151_329),
                VocabKind::MiniMax => (&MINIMAX_TOKENS, 200_000),
                VocabKind::Llama4 => (&LLAMA4_TOKENS, 200_000),
                _ => (&[(0, "<|endoftext|>")], 50_279),
            };
            let span = specials.last().map_or(0, |s| s.0 + 1);
            // Small test presets shrink the vocabulary: keep the layout, scaled into it.
            let first_special = first.min(n - span.min(n));
            let (mut tokens, mut types) = (Vec::with_capacity(n), Vec::with_capacity(n));
            for c in byte_chars() {
                tokens.push(c.to_string());
                types.push(NORMAL);
            }
            let merges: Vec<(String, String)> = MERGES.iter().map(|(a, b)| (a.to_string(), b.to_string())).collect();
            for (a, b) in &merges {
                tokens.push(format!("{a}{b}"));
                types.push(NORMAL);
            }
            let mut word = 0usize;
            while tokens.len() < first_special {
                tokens.push(filler(word, true));
                types.push(NORMAL);
                word += 1;
            }
            while tokens.len() < n {
                let id = tokens.len();
                match specials.iter().find(|s| first_special + s.0 == id) {
                    Some(s) => {
                        tokens.push(s.1.to_string());
                        types.push(CONTROL);
                    }
                    None if p.vocab == VocabKind::Harmony => {
                        tokens.push(format!("<|reserved_{id}|>"));
                        types.push(CONTROL);
                    }
                    None => {
                        tokens.push(format!("[PAD{id}]"));
                        types.push(UNUSED);
                    }
                }
            }
            tokens.truncate(n);
            types.truncate(n);
            let eot = first_special as u32;
            set("model", Value::String("gpt2".into()));
            let pre = match p.vocab {
                VocabKind::Qwen2 => "qwen2",
                VocabKind::Qwen35 => "qwen35",
                VocabKind::Harmony => "gpt-4o",
                VocabKind::DeepSeek => "deepseek-llm",
                VocabKind::Glm => "glm4",
                VocabKind::MiniMax => "minimax-m2",
                VocabKind::Llama4 => "llama4",
                _ => "olmo",
            };
            set("pre", Value::String(pre.into()));
            set("tokens", strings(tokens));
            set(
                "token_type",
                Value::Array(ValueType::I32, types.into_iter().map(Value::I32).collect()),
            );
            set(
                "merges",
                strings(merges.iter().map(|(a, b)| format!("{a} {b}")).collect()),
            );
            // (bos, eos, padding) as offsets from the first control token, and whether BOS is added.
            let (bos, eos, pad, add_bos) = match p.vocab {
                VocabKind::Qwen2 | VocabKind::Qwen35 => (0, 2, 0, false),
                // <|startoftext|>, <|return|>, <|endoftext|>
                VocabKind::Harmony => (0, 4, 1, false),
                VocabKind::DeepSeek => (0, 1, 1, true),
                // [gMASK], <|endoftext|>, <|endoftext|>; GLM's chat template writes [gMASK] itself.
                VocabKind::Glm => (2, 0, 0, false),
                // ]~!b[, [e~[, [e~[ (the tokenizer names no padding); its chat template writes ]~!b[.
                VocabKind::MiniMax => (34, 20, 20, false),
                // <|begin_of_text|>, <|eot|>, and <|end_of_text|> for padding (the real pad token is beyond
                // the control tokens written here).
                VocabKind::Llama4 => (0, 8, 1, true),
                _ => (0, 0, 0, false),
            };
            set("bos_token_id", Value::U32(eot + bos));
            set("eos_token_id", Value::U32(eot + eos));
            // OLMoE pads with token 1.
            set(
                "padding_token_id",
                Value::U32(if p.vocab == VocabKind::Olmo { 1 } else { eot + pad }),
            );
            set("add_bos_token", Value::Bool(add_bos));
            if p.vocab == VocabKind::Llama4 {
                // <|eot|> ends a turn, <|eom|> a tool call.
                set("eot_token_id", Value::U32(eot + 8));
                set("eom_token_id", Value::U32(eot + 7));
            }
            if p.vocab == VocabKind::Glm {
                // The converter's GLM vocabulary: <|user|> ends a turn, <|observation|> a tool call.
                set("eot_token_id", Value::U32(eot + 7));
                set("eom_token_id", Value::U32(eot + 9));
            }
            if matches!(p.vocab, VocabKind::Qwen2 | VocabKind::Qwen35) {
                set("chat_template", Value::String(CHATML.into()));
            }
        }
        VocabKind::Llama => {
            let mut tokens = vec!["<unk>".to_string(), "<s>".into(), "</s>".into()];
            let mut types = vec![UNKNOWN, CONTROL, CONTROL];
            for b in 0..=255u8 {
                tokens.push(format!("<0x{b:02X}>"));
                types.push(BYTE);
            }
            tokens.push("\u{2581}".into());
            types.push(NORMAL);
            let mut word = 0usize;
            while tokens.len() < n {
                tokens.push(filler(word, false));
                types.push(NORMAL);
                word += 1;
            }
            tokens.truncate(n);
            types.truncate(n);
            // Scores: specials and bytes 0, pieces in decreasing order of preference.
            let scores: Vec<Value> = (0..tokens.len())
                .map(|i| Value::F32(if i < 259 { 0.0 } else { -((i - 259) as f32) }))
                .collect();
            set("model", Value::String("llama".into()));
            set("pre", Value::String("default".into()));
            set("tokens", strings(tokens));
            set("scores", Value::Array(ValueType::F32, scores));
            set(
                "token_type",
                Value::Array(ValueType::I32, types.into_iter().map(Value::I32).collect()),
            );
            set("bos_token_id", Value::U32(1));
            set("eos_token_id", Value::U32(2));
            set("unknown_token_id", Value::U32(0));
            set("add_bos_token", Value::Bool(true));
            set("add_eos_token", Value::Bool(false));
        }
    }
    kv
}

const CHATML_TOKENS: [(usize, &str); 3] = [(0, "<|endoftext|>"), (1, "<|im_start|>"), (2, "<|im_end|>")];

/// o200k_harmony's named control tokens from 199998 (the ids between are reserved ones).
const HARMONY_TOKENS: [(usize, &str); 9] = [
    (0, "<|startoftext|>"),
    (1, "<|endoftext|>"),
    (4, "<|return|>"),
    (5, "<|constrain|>"),
    (7, "<|channel|>"),
    (8, "<|start|>"),
    (9, "<|end|>"),
    (10, "<|message|>"),
    (14, "<|call|>"),
];

/// DeepSeek-V2's BOS and EOS at 100000 and 100001.
const DEEPSEEK_TOKENS: [(usize, &str); 2] = [(0, "<｜begin▁of▁sentence｜>"), (1, "<｜end▁of▁sentence｜>")];

/// GLM-4.5's control tokens from `<|endoftext|>` at 151329.
/// MiniMax-M2's control tokens among its added ones, by offset from 200000.
const MINIMAX_TOKENS: [(usize, &str); 3] = [(19, "]~b]"), (20, "[e~["), (34, "]~!b[")];
/// Llama 4's first control tokens, from 200000.
const LLAMA4_TOKENS: [(usize, &str); 10] = [
    (0, "<|begin_of_text|>"),
    (1, "<|end_of_text|>"),
    (2, "<|fim_prefix|>"),
    (3, "<|fim_middle|>"),
    (4, "<|fim_suffix|>"),
    (5, "<|header_start|>"),
    (6, "<|header_end|>"),
    (7, "<|eom|>"),
    (8, "<|eot|>"),
    (9, "<|step|>"),
];

const GLM_TOKENS: [(usize, &str); 10] = [
    (0, "<|endoftext|>"),
    (1, "[MASK]"),
    (2, "[gMASK]"),
    (3, "[sMASK]"),
    (4, "<sop>"),
    (5, "<eop>"),
    (6, "<|system|>"),
    (7, "<|user|>"),
    (8, "<|assistant|>"),
    (9, "<|observation|>"),
];

const CHATML: &str = "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";

/// A few real GPT-2 merges, so the tokenizer has some to apply (`Ġ` is the space byte).
const MERGES: [(&str, &str); 8] = [
    ("Ġ", "t"),
    ("Ġ", "a"),
    ("h", "e"),
    ("i", "n"),
    ("r", "e"),
    ("o", "n"),
    ("Ġt", "he"),
    ("e", "r"),
];

fn strings(v: Vec<String>) -> Value {
    Value::Array(ValueType::String, v.into_iter().map(Value::String).collect())
}

/// GPT-2's byte-to-unicode map: printable bytes stand for themselves, the rest are shifted past 255.
fn byte_chars() -> impl Iterator<Item = char> {
    let printable = |b: u32| (0x21..=0x7E).contains(&b) || (0xA1..=0xAC).contains(&b) || (0xAE..=0xFF).contains(&b);
    let mut shifted = 0;
    (0u32..256).map(move |b| {
        if printable(b) {
            char::from_u32(b).unwrap()
        } else {
            shifted += 1;
            char::from_u32(255 + shifted).unwrap()
        }
    })
}

/// The `i`-th filler word: two or more consonant-vowel syllables (a bijection of `i`, so every word
/// is distinct and none is a single byte or a merge result), half of them with a leading space
/// (`Ġ` for BPE, `▁` for SentencePiece) so decoded text reads as words.
fn filler(i: usize, bpe: bool) -> String {
    const C: &[u8] = b"bdfgklmnprstvz";
    const V: &[u8] = b"aeiou";
    let syllables = C.len() * V.len();
    let (space, mut k) = (i.is_multiple_of(2), i / 2);
    let mut word = String::new();
    if space {
        word.push(if bpe { 'Ġ' } else { '\u{2581}' });
    }
    let mut n = 0;
    loop {
        let s = k % syllables;
        word.push(C[s / V.len()] as char);
        word.push(V[s % V.len()] as char);
        k /= syllables;
        n += 1;
        if k == 0 && n >= 2 {
            break;
        }
        if k == 0 {
            // One-digit indices get "ba" (digit 0) appended: a longer encoding never ends in 0, so
            // this cannot collide.
            word.push_str("ba");
            break;
        }
    }
    word
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    #[test]
    fn byte_chars_are_gpt2s() {
        let c: Vec<char> = byte_chars().collect();
        assert_eq!(c[b'a' as usize], 'a');
        assert_eq!(c[b' ' as usize], 'Ġ');
        assert_eq!(c[b'\n' as usize], 'Ċ');
        assert_eq!(c.iter().collect::<HashSet<_>>().len(), 256);
    }

    #[test]
    fn filler_words_are_distinct() {
        let mut seen = HashSet::new();
        for i in 0..200_000 {
            let w = filler(i, true);
            assert!(w.chars().count() >= 4, "{w}");
            assert!(seen.insert(w.clone()), "duplicate {w} at {i}");
        }
    }
}
