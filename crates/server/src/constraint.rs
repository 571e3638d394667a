//! Constrained sampling: a grammar over a request's output, as the set of tokens allowed at each step. The
//! engine's sampler takes the set as a bit mask (`Sampler::sample_allowed`) and knows nothing of grammars;
//! the grammars are llguidance's, compiled against the model's own vocabulary.
//!
//! [`Grammars`] is built once per server; each constrained request gets a [`Constraint`] from it, from its
//! `response_format` ([`Grammars::response_format`]), a JSON schema, or a grammar in llguidance's Lark
//! dialect (`start: "<tool_call>\n" %json{…} "\n</tool_call>"`), and hands it to the engine with its
//! [`Job`](crate::scheduler::Job).

use std::sync::Arc;

use llguidance::api::TopLevelGrammar;
use llguidance::toktrie::{ApproximateTokEnv, SimpleVob, TokRxInfo, TokTrie, INVALID_TOKEN};
use llguidance::{Matcher, ParserFactory};
use serde_json::{json, Map, Value};
use titan_tokenizer::Tokenizer;

use crate::error::ApiError;

/// Why a grammar could not be compiled or followed: llguidance's own words.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct ConstraintError(String);

/// The whitespace JSON output may have between tokens: a space, or one or two line breaks and an
/// indentation of up to 20 spaces or tabs (what llama.cpp's JSON grammars allow). Bounded, so that a model
/// cannot spend its whole length on whitespace, and enough for pretty-printed JSON.
const JSON_WHITESPACE: &str = r"[ ]|\n{1,2}[ \t]{0,20}";

/// The vocabulary as llguidance sees it, shared by every request's grammar.
pub struct Grammars {
    factory: ParserFactory,
}

impl Grammars {
    /// The model's vocabulary as llguidance's token trie: each token's bytes, and the tokens that render as
    /// no text (control tokens) as `\xFF` and their name, which is how a grammar names them
    /// (`<|im_end|>`); the end-of-generation tokens are what a grammar allows where it may end.
    pub fn new(tokenizer: &Tokenizer) -> Result<Grammars, ConstraintError> {
        let n = tokenizer.vocab_size();
        let words: Vec<Vec<u8>> = (0..n as u32)
            .map(|id| match tokenizer.special_text(id) {
                Some(name) => [&[TokTrie::SPECIAL_TOKEN_MARKER][..], name.as_bytes()].concat(),
                None => tokenizer.token_bytes(id).unwrap_or_default().to_vec(),
            })
            .collect();
        let eog: Vec<u32> = (0..n as u32).filter(|&id| tokenizer.is_eog(id)).collect();
        let eos = tokenizer.eos().filter(|e| eog.contains(e)).or(eog.first().copied());
        let info = TokRxInfo {
            tok_bos: tokenizer.bos(),
            ..TokRxInfo::new(n as u32, eos.unwrap_or(INVALID_TOKEN))
        };
        let trie = TokTrie::from(&info, &words).with_eos_tokens(&eog);
        // Tokenising text for llguidance is only needed to force tokens, which the server does not do: the
        // trie's greedy tokenisation serves, and is marked as not the model's own.
        let env = Arc::new(ApproximateTokEnv::new(trie));
        let mut factory = ParserFactory::new_simple(&(env as _)).map_err(|e| ConstraintError(e.to_string()))?;
        factory.quiet();
        Ok(Grammars { factory })
    }

    /// A request's `response_format`: `None` for plain text (or none given); `{"type": "json_object"}`
    /// for any JSON object; `{"type": "json_schema", "json_schema": {"name", "schema", "strict",
    /// "description"}}` for JSON that the schema validates (strict or not: the schema is always held to). A
    /// malformed format, or a schema llguidance cannot compile, is a 400 that says why.
    pub fn response_format(&self, format: Option<&Value>) -> Result<Option<Constraint>, ApiError> {
        let bad = |why: String| ApiError::bad_request(why).param("response_format");
        let format = match format {
            None | Some(Value::Null) => return Ok(None),
            Some(Value::Object(f)) => f,
            Some(other) => {
                return Err(bad(format!(
                    "response_format is {other}; it must be an object such as {{\"type\": \"json_object\"}}"
                )))
            }
        };
        let kind = format.get("type").and_then(Value::as_str);
        let known: &[&str] = match kind {
            Some("json_schema") => &["type", "json_schema"],
            _ => &["type"],
        };
        if let Some(other) = format.keys().find(|k| !known.contains(&k.as_str())) {
            return Err(bad(format!("response_format has a field {other:?} it does not take")));
        }
        let schema = match kind {
            Some("text") => return Ok(None),
            Some("json_object") => json!({"type": "object"}),
            Some("json_schema") => schema_of(format.get("json_schema")).map_err(bad)?,
            _ => {
                return Err(bad(format!(
                    "response_format.type is {}; it must be \"text\", \"json_object\" or \"json_schema\"",
                    format.get("type").unwrap_or(&Value::Null)
                )))
            }
        };
        self.json_schema(&schema).map(Some).map_err(|e| {
            let what = if kind == Some("json_object") {
                "response_format"
            } else {
                "response_format.json_schema.schema"
            };
            bad(format!("{what} cannot be enforced: {e}"))
        })
    }

    /// Output that `schema` validates, laid out as [`json_layout`] says.
    pub fn json_schema(&self, schema: &Value) -> Result<Constraint, ConstraintError> {
        self.compile(TopLevelGrammar::from_json_schema(json_layout(schema)))
    }

    /// Output that `grammar` (llguidance's Lark dialect) derives. A schema embedded with `%json{…}` is laid
    /// out as llguidance's default (any whitespace between tokens) unless it says otherwise: embed
    /// [`json_layout`]`(schema)` for the server's own.
    pub fn lark(&self, grammar: &str) -> Result<Constraint, ConstraintError> {
        self.compile(TopLevelGrammar::from_lark(grammar.to_string()))
    }

    /// The grammar's parser, with the mask of its first token computed already: that is where a grammar
    /// that cannot be followed at all (one no token of the vocabulary starts) shows, and it is better paid
    /// for before the request is queued than on the engine's thread.
    fn compile(&self, grammar: TopLevelGrammar) -> Result<Constraint, ConstraintError> {
        let parser = self
            .factory
            .create_parser(grammar)
            .map_err(|e| ConstraintError(e.to_string()))?;
        let mut c = Constraint {
            matcher: Matcher::new(Ok(parser)),
            mask: None,
        };
        c.allowed()?;
        Ok(c)
    }
}

/// `schema` with the server's whitespace rules for JSON (at most one [`JSON_WHITESPACE`] between two
/// tokens of JSON), unless it sets llguidance's own (`x-guidance`).
pub fn json_layout(schema: &Value) -> Value {
    let mut schema = schema.clone();
    if let Some(s) = schema.as_object_mut() {
        s.entry("x-guidance")
            .or_insert_with(|| json!({"whitespace_pattern": JSON_WHITESPACE}));
    }
    schema
}

/// The schema of a `json_schema` response format, its other fields checked.
fn schema_of(v: Option<&Value>) -> Result<Value, String> {
    let Some(Value::Object(f)) = v else {
        return Err(
            "response_format.json_schema must be an object: {\"name\": …, \"schema\": {…}, \"strict\": true}".into(),
        );
    };
    let field = |name: &str, ok: fn(&Value) -> bool, what: &str| match f.get(name) {
        Some(v) if !v.is_null() && !ok(v) => Err(format!("response_format.json_schema.{name} must be {what}")),
        _ => Ok(()),
    };
    field("name", Value::is_string, "a string")?;
    field("description", Value::is_string, "a string")?;
    field("strict", Value::is_boolean, "true or false")?;
    field("schema", Value::is_object, "a JSON schema object")?;
    let known = ["name", "description", "strict", "schema"];
    if let Some(other) = f.keys().find(|k| !known.contains(&k.as_str())) {
        return Err(format!(
            "response_format.json_schema has a field {other:?} it does not take"
        ));
    }
    // No schema: any JSON value (OpenAI's is optional).
    Ok(f.get("schema")
        .filter(|s| !s.is_null())
        .cloned()
        .unwrap_or(Value::Object(Map::new())))
}

/// One request's grammar, where its output has got to: the tokens allowed next, and whether it is complete.
pub struct Constraint {
    matcher: Matcher,
    /// The allowed tokens at the current position, once computed.
    mask: Option<SimpleVob>,
}

impl Constraint {
    /// The tokens allowed next, as the bits of `u32` words (token `t` is bit `t % 32` of word `t / 32`; ids
    /// past the vocabulary are not allowed). The end-of-generation tokens are among them only where the
    /// grammar is complete.
    pub fn allowed(&mut self) -> Result<&[u32], ConstraintError> {
        if self.mask.is_none() {
            let mask = self
                .matcher
                .compute_mask()
                .map_err(|e| ConstraintError(e.to_string()))?;
            if mask.is_zero() {
                return Err(ConstraintError(
                    "no token of the vocabulary can continue the output here".into(),
                ));
            }
            self.mask = Some(mask);
        }
        Ok(self.mask.as_ref().map_or(&[], |m| m.as_slice()))
    }

    /// Whether `token` is allowed next.
    pub fn allows(&mut self, token: u32) -> Result<bool, ConstraintError> {
        let word = self.allowed()?.get(token as usize / 32).copied().unwrap_or(0);
        Ok(word >> (token % 32) & 1 == 1)
    }

    /// Moves past `token`, which must be allowed.
    pub fn accept(&mut self, token: u32) -> Result<(), ConstraintError> {
        self.mask = None;
        self.matcher
            .consume_token(token)
            .map_err(|e| ConstraintError(e.to_string()))
    }

    /// Whether the output is complete and nothing may follow: the request ends here.
    pub fn is_done(&self) -> bool {
        self.matcher.is_stopped()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use titan_tokenizer::VocabSpec;

    /// A byte-level BPE vocabulary: the 256 bytes (as GPT-2 writes them), `{"`, then ChatML's control
    /// tokens (the second an end of generation) and a user-defined `<tool_call>`.
    fn tokenizer() -> Tokenizer {
        let printable = |b: u8| matches!(b, b'!'..=b'~' | 0xa1..=0xac | 0xae..=0xff);
        let mut next = 256u32;
        let mut tokens: Vec<String> = (0..=255u8)
            .map(|b| {
                if printable(b) {
                    char::from(b).to_string()
                } else {
                    next += 1;
                    char::from_u32(next - 1).unwrap().to_string()
                }
            })
            .collect();
        let mut types = vec![1; 256];
        for (text, t) in [("{\"", 1), ("<|im_start|>", 3), ("<|im_end|>", 3), ("<tool_call>", 4)] {
            tokens.push(text.into());
            types.push(t);
        }
        Tokenizer::from_spec(VocabSpec {
            model: "gpt2".into(),
            pre: Some("qwen2".into()),
            tokens,
            token_types: Some(types),
            merges: Some(vec!["{ \"".into()]),
            ..VocabSpec::default()
        })
        .unwrap()
    }

    fn id(t: &Tokenizer, text: &str) -> u32 {
        let ids = t.encode(text, false, true);
        assert_eq!(ids.len(), 1, "{text:?} is {ids:?}");
        ids[0]
    }

    /// Feeds `text` a byte-token at a time (the tokens as the tokenizer splits it), checking that each is
    /// allowed; whether the grammar is then done.
    fn follow(c: &mut Constraint, t: &Tokenizer, text: &str) -> Result<bool, String> {
        for token in t.encode(text, false, true) {
            if !c.allows(token).unwrap() {
                let so_far = String::from_utf8_lossy(t.token_bytes(token).unwrap()).into_owned();
                return Err(format!("{so_far:?} is not allowed in {text:?}"));
            }
            c.accept(token).unwrap();
        }
        Ok(c.is_done())
    }

    #[test]
    fn a_schema_allows_what_it_validates_and_ends_with_it() {
        let t = tokenizer();
        let g = Grammars::new(&t).unwrap();
        let schema = json!({"type": "object", "properties": {"n": {"type": "integer"}, "s": {"enum": ["a", "b"]}},
                            "required": ["n", "s"], "additionalProperties": false});
        assert_eq!(
            follow(&mut g.json_schema(&schema).unwrap(), &t, r#"{"n": 12, "s": "b"}"#),
            Ok(true)
        );
        assert_eq!(
            follow(&mut g.json_schema(&schema).unwrap(), &t, "{\n  \"n\":-3,\"s\":\"a\"}"),
            Ok(true)
        );
        // Wrong keys, values and whitespace are refused where they start.
        for bad in [
            r#"{"s": "a", "n": 1}"#,
            r#"{"n": 1.5"#,
            r#"{"n": 1, "s": "c"}"#,
            "{ \t\"n\": 1",
            "{   \"n\"",
        ] {
            assert!(
                follow(&mut g.json_schema(&schema).unwrap(), &t, bad).is_err(),
                "{bad:?}"
            );
        }
        // The end of generation only where the output is complete; a merged token counts as its bytes.
        let end = id(&t, "<|im_end|>");
        let mut c = g.json_schema(&json!({"type": "integer"})).unwrap();
        assert!(!c.allows(end).unwrap());
        assert_eq!(follow(&mut c, &t, "42"), Ok(false));
        assert!(c.allows(end).unwrap() && c.allows(id(&t, "7")).unwrap());
        let mut c = g
            .response_format(Some(&json!({"type": "json_object"})))
            .unwrap()
            .unwrap();
        assert!(c.allows(id(&t, "{\"")).unwrap() && !c.allows(id(&t, "[")).unwrap());
        assert!(!c.allows(end).unwrap() && !c.allows(id(&t, "<tool_call>")).unwrap());
    }

    #[test]
    fn a_lark_grammar_embeds_schemas_and_names_control_tokens() {
        let t = tokenizer();
        let g = Grammars::new(&t).unwrap();
        let schema = json_layout(&json!({"type": "object", "properties": {"x": {"type": "boolean"}},
                                          "required": ["x"], "additionalProperties": false}));
        let grammar = format!("start: \"<tool_call>\\n\" %json{schema} \"\\n</tool_call>\" <|im_end|>");
        let mut c = g.lark(&grammar).unwrap();
        // The user-defined token is text: its own token or its bytes.
        assert!(c.allows(id(&t, "<tool_call>")).unwrap() && c.allows(id(&t, "<")).unwrap());
        assert_eq!(
            follow(&mut c, &t, "<tool_call>\n{\"x\": true}\n</tool_call>"),
            Ok(false)
        );
        let end = id(&t, "<|im_end|>");
        assert!(c.allows(end).unwrap() && !c.allows(id(&t, "<|im_start|>")).unwrap());
        c.accept(end).unwrap();
        assert!(c.is_done());
        let e = g.lark("start: foo").err().unwrap().to_string();
        assert!(e.contains("foo"), "{e}");
    }

    /// What a mask costs a token, on a model's own vocabulary: `TITAN_MASK_MODEL` (a GGUF; the demo model
    /// without it). Output is written from random logits at temperature 1, masked: 5 times a schema's whole
    /// output (short strings, numbers, a list; it must parse), then 5 times 200 tokens of a free string, where
    /// nearly every token is allowed. Prints the time to build the vocabulary's grammars, then per token the
    /// mask's computation, the masked draw against the plain one, and moving the grammar past the token:
    /// `cargo test --release -p titan-server mask_cost -- --nocapture`.
    #[test]
    fn mask_cost_per_token() {
        use std::time::{Duration, Instant};
        use titan_engine::{Sampler, SamplerOptions};

        let root = concat!(env!("CARGO_MANIFEST_DIR"), "/../../models/demo/demo-q8_0.gguf");
        let path = std::env::var("TITAN_MASK_MODEL").unwrap_or_else(|_| root.to_string());
        let file = titan_gguf::GgufFile::open(&path).unwrap();
        let t = titan_engine::vocab::tokenizer_from_gguf(&file).unwrap();
        let started = Instant::now();
        let g = Grammars::new(&t).unwrap();
        println!(
            "{path}: {} tokens; grammars built in {:.0} ms",
            t.vocab_size(),
            started.elapsed().as_secs_f64() * 1e3
        );
        let record = json!({"type": "object", "properties": {
            "name": {"type": "string", "maxLength": 12}, "age": {"type": "integer", "minimum": 0, "maximum": 120},
            "tags": {"type": "array", "items": {"type": "string", "maxLength": 6}, "maxItems": 3},
            "alive": {"type": "boolean"}}, "required": ["name", "age", "tags", "alive"], "additionalProperties": false});
        let free = json!({"type": "object", "properties": {"speech": {"type": "string"}}, "required": ["speech"],
                          "additionalProperties": false});
        let mut state = 0x9e37_79b9_7f4a_7c15u64;
        let mut logits = vec![0f32; t.vocab_size()];
        for (what, schema, most) in [("a record", record, 4096), ("a free string", free, 200)] {
            let (mut mask, mut masked, mut plain, mut accept) =
                (Duration::ZERO, Duration::ZERO, Duration::ZERO, Duration::ZERO);
            let mut tokens = 0u32;
            for seed in 0..5 {
                let mut c = g.json_schema(&schema).unwrap();
                let opts = SamplerOptions {
                    temperature: 1.0,
                    seed,
                    ..Default::default()
                };
                let (mut s, mut reference) = (Sampler::new(opts.clone()), Sampler::new(opts));
                let mut text = Vec::new();
                for _ in 0..most {
                    if c.is_done() {
                        break;
                    }
                    for l in logits.iter_mut() {
                        state ^= state << 13;
                        state ^= state >> 7;
                        state ^= state << 17;
                        *l = (state >> 40) as f32 / (1u64 << 24) as f32 * 8.0;
                    }
                    let t0 = Instant::now();
                    c.allowed().unwrap();
                    let t1 = Instant::now();
                    let token = s.sample_allowed(&logits, &[], c.allowed().unwrap());
                    let t2 = Instant::now();
                    reference.sample(&logits, &[]);
                    let t3 = Instant::now();
                    if t.is_eog(token) {
                        break;
                    }
                    c.accept(token).unwrap();
                    accept += t3.elapsed();
                    (mask, masked, plain) = (mask + (t1 - t0), masked + (t2 - t1), plain + (t3 - t2));
                    tokens += 1;
                    text.extend_from_slice(t.token_bytes(token).unwrap());
                }
                if most == 4096 {
                    let value: Value = serde_json::from_slice(&text).unwrap();
                    assert!(value["age"].as_u64().unwrap() <= 120, "{value}");
                }
            }
            let per = |d: Duration| format!("{:.1} µs", d.as_secs_f64() * 1e6 / f64::from(tokens));
            println!(
                "{what}, {tokens} tokens in 5 outputs: per token, the mask {}, the masked draw {} (the plain draw {}), \
                 accepting the token {}",
                per(mask),
                per(masked),
                per(plain),
                per(accept)
            );
        }
    }

    #[test]
    fn response_formats_are_read_and_bad_ones_named() {
        let t = tokenizer();
        let g = Grammars::new(&t).unwrap();
        let ok = |v: Value| g.response_format(Some(&v)).map(|c| c.is_some()).map_err(|e| e.message);
        assert_eq!(ok(json!({"type": "text"})), Ok(false));
        assert_eq!(ok(Value::Null), Ok(false));
        assert_eq!(ok(json!({"type": "json_object"})), Ok(true));
        let named = json!({"type": "json_schema", "json_schema": {"name": "n", "strict": true, "description": "d",
                                                                   "schema": {"type": "array", "items": {"type": "string"}}}});
        assert_eq!(ok(named), Ok(true));
        assert_eq!(
            ok(json!({"type": "json_schema", "json_schema": {"name": "any"}})),
            Ok(true)
        );
        let refused = |v: Value, want: &str| {
            let e = g
                .response_format(Some(&v))
                .err()
                .unwrap_or_else(|| panic!("{v} was taken"));
            assert_eq!(
                (e.status.as_u16(), e.body()["error"]["param"].clone()),
                (400, json!("response_format"))
            );
            assert!(e.message.contains(want), "{v}: {}", e.message);
        };
        refused(json!("json"), "must be an object");
        refused(
            json!({"type": "xml"}),
            "\"xml\"; it must be \"text\", \"json_object\" or \"json_schema\"",
        );
        refused(json!({"type": "text", "schema": {}}), "field \"schema\"");
        refused(json!({"type": "json_schema"}), "json_schema must be an object");
        refused(
            json!({"type": "json_schema", "json_schema": {"name": 3}}),
            "name must be a string",
        );
        refused(
            json!({"type": "json_schema", "json_schema": {"schema": {}, "strict": "yes"}}),
            "strict must be",
        );
        refused(
            json!({"type": "json_schema", "json_schema": {"schema": [], "name": "x"}}),
            "schema must be",
        );
        refused(
            json!({"type": "json_schema", "json_schema": {"schema": {}, "extra": 1}}),
            "field \"extra\"",
        );
        // What llguidance cannot compile, with its reason.
        refused(
            json!({"type": "json_schema", "json_schema": {"schema": {"type": "nonsense"}}}),
            "response_format.json_schema.schema cannot be enforced: ",
        );
        refused(
            json!({"type": "json_schema", "json_schema": {"schema": {"type": "integer", "minimum": 5, "maximum": 2}}}),
            "cannot be enforced",
        );
    }
}
