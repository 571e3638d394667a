//! Whole-tokenizer tests on small hand-made vocabularies.

use super::*;

/// A byte-level BPE vocabulary: the 256 byte chars, then `merges`' results, then `extra`
/// tokens with their types.
fn bpe_spec(pre: &str, merges: &[&str], extra: &[(&str, i32)]) -> VocabSpec {
    let mut tokens: Vec<String> = unicode::byte_to_char_table().iter().map(|c| c.to_string()).collect();
    let mut types = vec![1; tokens.len()];
    for m in merges {
        let merged = m.replacen(' ', "", 1);
        if !tokens.contains(&merged) {
            tokens.push(merged);
            types.push(1);
        }
    }
    for (text, t) in extra {
        tokens.push(text.to_string());
        types.push(*t);
    }
    VocabSpec {
        model: "gpt2".into(),
        pre: Some(pre.into()),
        tokens,
        token_types: Some(types),
        merges: Some(merges.iter().map(|m| m.to_string()).collect()),
        ..VocabSpec::default()
    }
}

fn id(t: &Tokenizer, text: &str) -> u32 {
    t.vocab.id(text).unwrap_or_else(|| panic!("no token {text:?}"))
}

fn ids(t: &Tokenizer, texts: &[&str]) -> Vec<u32> {
    texts.iter().map(|s| id(t, s)).collect()
}

#[test]
fn bpe_merges_apply_by_rank() {
    let t = Tokenizer::from_spec(bpe_spec("gpt-2", &["a b", "b c"], &[])).unwrap();
    assert_eq!(t.encode("abc", false, false), ids(&t, &["ab", "c"]));
    let t = Tokenizer::from_spec(bpe_spec("gpt-2", &["b c", "a b"], &[])).unwrap();
    assert_eq!(t.encode("abc", false, false), ids(&t, &["a", "bc"]));
    // merges chain: rank 0 then rank 2 on its result
    let t = Tokenizer::from_spec(bpe_spec("gpt-2", &["b c", "x y", "a bc"], &[])).unwrap();
    assert_eq!(t.encode("abc", false, false), ids(&t, &["abc"]));
}

#[test]
fn bpe_equal_ranks_merge_leftmost_first() {
    let t = Tokenizer::from_spec(bpe_spec("gpt-2", &["a a"], &[])).unwrap();
    assert_eq!(t.encode("aaa", false, false), ids(&t, &["aa", "a"]));
    assert_eq!(t.encode("aaaa", false, false), ids(&t, &["aa", "aa"]));
}

#[test]
fn bpe_is_byte_level_and_round_trips() {
    let t = Tokenizer::from_spec(bpe_spec("qwen2", &["Ġ h", "Ġh i"], &[])).unwrap();
    let text = "hi hi\n€ 12";
    let enc = t.encode(text, false, false);
    assert_eq!(enc[..3], ids(&t, &["h", "i", "Ġhi"])[..]);
    // "€" is three byte tokens; qwen2 splits digits one by one
    assert_eq!(t.decode(&enc).unwrap(), text);
    assert_eq!(enc.len(), 3 + 1 + 3 + 1 + 2);
}

#[test]
fn llama3_ignore_merges_takes_whole_words() {
    // "abc" is a token but no merge builds it: llama3 uses it whole, gpt-2 cannot reach it.
    let spec = |pre: &str| bpe_spec(pre, &["a b"], &[("abc", 1), ("<|begin_of_text|>", 3)]);
    let gpt2 = Tokenizer::from_spec(spec("gpt-2")).unwrap();
    assert_eq!(gpt2.encode("abc", false, false), ids(&gpt2, &["ab", "c"]));
    let mut s = spec("llama-bpe");
    s.bos = Some(s.tokens.len() as u32 - 1);
    let llama3 = Tokenizer::from_spec(s).unwrap();
    // llama3 adds BOS by default
    assert_eq!(
        llama3.encode("abc", true, false),
        ids(&llama3, &["<|begin_of_text|>", "abc"])
    );
}

#[test]
fn special_tokens_are_matched_only_when_asked() {
    let extra = [("<|im_start|>", 3), ("<|im_end|>", 3), ("<tool>", 4)];
    let t = Tokenizer::from_spec(bpe_spec("qwen2", &[], &extra)).unwrap();
    let (start, end, tool) = (id(&t, "<|im_start|>"), id(&t, "<|im_end|>"), id(&t, "<tool>"));
    let parsed = t.encode("<|im_start|>x<tool><|im_end|>", false, true);
    assert_eq!(parsed, vec![start, id(&t, "x"), tool, end]);
    // without parse_special, control text is plain text; user-defined tokens still match
    let plain = t.encode("<|im_start|>x<tool>", false, false);
    assert!(!plain.contains(&start));
    assert_eq!(*plain.last().unwrap(), tool);
    assert_eq!(t.decode(&plain).unwrap(), "<|im_start|>x<tool>");
    // control tokens render as nothing
    assert_eq!(t.decode(&parsed).unwrap(), "x<tool>");
    assert!(t.is_eog(end) && !t.is_eog(start));
    // a grammar tells the ones that render as nothing apart by their names
    assert_eq!(t.special_text(end), Some("<|im_end|>"));
    assert_eq!((t.special_text(tool), t.special_text(id(&t, "x"))), (None, None));
    assert_eq!(t.special_text(t.vocab_size() as u32), None);
}

#[test]
fn longer_special_tokens_win() {
    let extra = [("<a>", 3), ("<a><b>", 3)];
    let t = Tokenizer::from_spec(bpe_spec("gpt-2", &[], &extra)).unwrap();
    assert_eq!(t.encode("<a><b><a>", false, true), ids(&t, &["<a><b>", "<a>"]));
}

#[test]
fn clean_spaces_applies_to_gpt2_but_not_qwen2() {
    let text = "Hello , world !";
    let gpt2 = Tokenizer::from_spec(bpe_spec("gpt-2", &[], &[])).unwrap();
    assert_eq!(gpt2.decode(&gpt2.encode(text, false, false)).unwrap(), "Hello, world!");
    let qwen = Tokenizer::from_spec(bpe_spec("qwen2", &[], &[])).unwrap();
    assert_eq!(qwen.decode(&qwen.encode(text, false, false)).unwrap(), text);
}

/// SentencePiece vocabulary: <unk> <s> </s>, the 256 byte tokens, then `pieces` with scores.
fn spm_spec(pieces: &[(&str, f32)]) -> VocabSpec {
    let mut tokens = vec!["<unk>".to_string(), "<s>".into(), "</s>".into()];
    let mut types = vec![2, 3, 3];
    let mut scores = vec![0.0, 0.0, 0.0];
    for b in 0..=255u8 {
        tokens.push(format!("<0x{b:02X}>"));
        types.push(6);
        scores.push(0.0);
    }
    for (p, s) in pieces {
        tokens.push(p.to_string());
        types.push(1);
        scores.push(*s);
    }
    VocabSpec {
        model: "llama".into(),
        tokens,
        scores: Some(scores),
        token_types: Some(types),
        ..VocabSpec::default()
    }
}

#[test]
fn spm_merges_by_score_with_space_prefix_and_bos() {
    let pieces = [
        ("▁", -1.0),
        ("h", -2.0),
        ("i", -2.0),
        ("▁h", -3.0),
        ("hi", -1.5),
        ("▁hi", -0.5),
    ];
    let t = Tokenizer::from_spec(spm_spec(&pieces)).unwrap();
    // "▁hi": "hi" (-1.5) beats "▁h" (-3.0), then "▁"+"hi" = "▁hi"
    assert_eq!(t.encode("hi", true, false), ids(&t, &["<s>", "▁hi"]));
    assert_eq!(t.decode(&t.encode("hi", false, false)).unwrap(), "hi");
    // the first token's leading space is dropped only once, and BOS (a control token) takes that turn
    assert_eq!(t.decode(&t.encode("hi hi", true, false)).unwrap(), " hi hi");
}

#[test]
fn spm_score_order_decides_the_split() {
    let t = Tokenizer::from_spec(spm_spec(&[
        ("▁", -1.0),
        ("a", -1.0),
        ("b", -1.0),
        ("▁a", -5.0),
        ("ab", -2.0),
    ]))
    .unwrap();
    assert_eq!(t.encode("ab", false, false), ids(&t, &["▁", "ab"]));
    let t = Tokenizer::from_spec(spm_spec(&[
        ("▁", -1.0),
        ("a", -1.0),
        ("b", -1.0),
        ("▁a", -1.0),
        ("ab", -2.0),
    ]))
    .unwrap();
    assert_eq!(t.encode("ab", false, false), ids(&t, &["▁a", "b"]));
}

#[test]
fn spm_byte_fallback_and_streaming_utf8() {
    let t = Tokenizer::from_spec(spm_spec(&[("▁", -1.0), ("x", -1.0)])).unwrap();
    let enc = t.encode("xé", false, false);
    assert_eq!(enc, ids(&t, &["▁", "x", "<0xC3>", "<0xA9>"]));
    assert_eq!(t.decode(&enc).unwrap(), "xé");

    let mut stream = t.stream();
    let out: Vec<String> = enc.iter().map(|&i| stream.push(i)).collect();
    // streaming keeps the leading space; "é" appears only once both bytes are in
    assert_eq!(out, [" ", "x", "", "é"]);
    assert_eq!(stream.finish(), "");

    // an unfinished sequence is flushed as U+FFFD; a broken one is replaced right away
    let mut stream = t.stream();
    assert_eq!(stream.push(id(&t, "<0xE2>")), "");
    assert_eq!(stream.push(id(&t, "<0x82>")), "");
    assert_eq!(stream.finish(), "\u{FFFD}");
    let mut stream = t.stream();
    assert_eq!(stream.push(id(&t, "<0xE2>")), "");
    assert_eq!(stream.push(id(&t, "x")), "\u{FFFD}x");
    assert_eq!(t.decode(&ids(&t, &["x", "<0xFF>"])).unwrap(), "x\u{FFFD}");
}

#[test]
fn spm_space_prefix_after_special_tokens() {
    let t = Tokenizer::from_spec(spm_spec(&[("▁", -1.0), ("x", -1.0), ("▁x", -0.5)])).unwrap();
    assert_eq!(t.encode("x</s>x", false, true), ids(&t, &["▁x", "</s>", "▁x"]));
    assert!(t.is_eog(id(&t, "</s>")));
    assert_eq!((t.bos(), t.eos()), (Some(1), Some(2)));
}

#[test]
fn errors_say_what_is_wrong() {
    let mut s = bpe_spec("gpt-2", &[], &[]);
    s.model = "bert".into();
    let e = Tokenizer::from_spec(s).err().unwrap();
    assert!(e.to_string().contains("\"bert\""), "{e}");

    let e = Tokenizer::from_spec(bpe_spec("kimi-k2", &[], &[])).err().unwrap();
    assert!(
        matches!(&e, TokenizerError::UnknownPreTokenizer(p) if p == "kimi-k2"),
        "{e}"
    );

    let mut s = bpe_spec("gpt-2", &[], &[]);
    s.merges = Some(vec!["a zz".into()]);
    let e = Tokenizer::from_spec(s).err().unwrap();
    assert!(e.to_string().contains("\"zz\""), "{e}");

    let mut s = bpe_spec("gpt-2", &[], &[]);
    s.merges = None;
    assert!(matches!(Tokenizer::from_spec(s), Err(TokenizerError::MissingMerges)));

    let mut s = bpe_spec("gpt-2", &[], &[]);
    s.tokens.push("a".into());
    s.token_types = None;
    assert!(matches!(
        Tokenizer::from_spec(s),
        Err(TokenizerError::DuplicateToken { .. })
    ));

    let mut s = bpe_spec("gpt-2", &[], &[]);
    s.add_bos = Some(true);
    s.tokens.truncate(10); // the default BOS id (11) is now out of range
    s.token_types = None;
    assert!(matches!(
        Tokenizer::from_spec(s),
        Err(TokenizerError::MissingSpecial { .. })
    ));

    let t = Tokenizer::from_spec(bpe_spec("gpt-2", &[], &[])).unwrap();
    let e = t.decode(&[5, 999_999]).err().unwrap();
    assert!(
        matches!(
            e,
            TokenizerError::IdOutOfRange {
                id: 999_999,
                vocab_size: 256
            }
        ),
        "{e}"
    );
    assert_eq!(t.token_bytes(999_999), None);
}

#[test]
fn tokenizer_json_maps_onto_the_same_bpe() {
    let spec = bpe_spec("qwen2", &["Ġ h", "Ġh i", "h i"], &[]);
    let vocab: serde_json::Map<String, serde_json::Value> = spec
        .tokens
        .iter()
        .enumerate()
        .map(|(i, t)| (t.clone(), serde_json::json!(i)))
        .collect();
    let n = spec.tokens.len();
    let json = serde_json::json!({
        "added_tokens": [{"id": n, "content": "<|im_end|>", "special": true}],
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "behavior": "Isolated", "invert": false, "pattern": {"Regex":
                r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"}},
            {"type": "ByteLevel", "add_prefix_space": false, "use_regex": false}
        ]},
        "model": {"type": "BPE", "vocab": vocab, "merges": [["Ġ", "h"], "Ġh i", ["h", "i"]]}
    });
    let dir = std::env::temp_dir().join(format!("titan-tok-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("tokenizer.json");
    std::fs::write(&path, json.to_string()).unwrap();
    let from_json = Tokenizer::from_tokenizer_json(&path).unwrap();
    std::fs::remove_dir_all(&dir).unwrap();

    let from_spec = Tokenizer::from_spec(spec).unwrap();
    let text = "hi hi, 123 it's\n\n done";
    assert_eq!(
        from_json.encode(text, true, false),
        from_spec.encode(text, false, false)
    );
    assert_eq!(from_json.encode("hi<|im_end|>", false, true).last(), Some(&(n as u32)));
    assert!(from_json.is_eog(n as u32));
    assert_eq!(from_json.bos(), None);
}

/// `max_token_bytes` bounds from below the tokens any text encodes into, which is what lets a server
/// refuse a text too long for its context without encoding it: checked on texts made of the longest
/// tokens, of special-token texts, of spaces (a 3-byte `▁` each in SentencePiece) and of multi-byte
/// characters.
#[test]
fn no_token_stands_for_more_than_max_token_bytes() {
    let long = "abcdefghijklmnopqrstuvwxyz";
    let merges: Vec<String> = (1..long.len())
        .map(|i| format!("{} {}", &long[..i], &long[i..=i]))
        .collect();
    let merges: Vec<&str> = merges.iter().map(String::as_str).collect();
    let bpe = Tokenizer::from_spec(bpe_spec("gpt-2", &merges, &[("<|a_long_control_token|>", 3)])).unwrap();
    assert_eq!(bpe.max_token_bytes(), long.len());
    let spm = Tokenizer::from_spec(spm_spec(&[("▁", -1.0), ("x", -1.0), ("▁x", -0.5), ("xxxx", -0.1)])).unwrap();
    assert_eq!(
        spm.max_token_bytes(),
        "<0xC3>".len(),
        "the byte tokens are the longest texts"
    );
    let texts = [
        long.repeat(40),
        "<|a_long_control_token|>".repeat(30),
        " ".repeat(100),
        "x".repeat(100),
        "é€😀".repeat(30),
        format!("{long} <|a_long_control_token|>xxxx </s>xxxx"),
    ];
    for t in [&bpe, &spm] {
        for text in &texts {
            let n = t.encode(text, false, true).len();
            assert!(
                n * t.max_token_bytes() >= text.len(),
                "{n} tokens for {} bytes",
                text.len()
            );
        }
    }
}
