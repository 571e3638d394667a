//! Tool calls in the model's own syntax: which syntax a chat template teaches (read from its text), and
//! the parser that splits what the model writes into text for the user and OpenAI `tool_calls`, piece by
//! piece as it is generated so that a stream never shows a call's markup as content.
//!
//! Each format lives in its own module and says two things: the markers a call (or other markup) may
//! start with, and what the text from such a marker on amounts to ([`Step`]). The driver here holds back
//! text that may be the start of a marker, and text that is only whitespace next to a call.

mod deepseek;
pub mod forcing;
mod harmony;
mod mistral;
mod qwen;

use serde_json::Value;

/// A tool-call syntax the server parses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    /// Qwen2.5, Qwen3 (Hermes style): `<tool_call>\n{"name": …, "arguments": {…}}\n</tool_call>`; Qwen3.5
    /// and Qwen3-Coder put `<function=NAME><parameter=KEY>\nVALUE\n</parameter></function>` inside the same
    /// tags.
    Qwen,
    /// The same, with calls written in Qwen3.5's and Qwen3-Coder's XML form (which [`forcing`] does not
    /// write).
    QwenXml,
    /// gpt-oss (OpenAI's harmony): `<|channel|>commentary to=functions.NAME <|constrain|>json<|message|>{…}<|call|>`.
    /// (Its template spells the recipient `"to=" + "functions." + name`, so `<|call|>` is what tells it.)
    Harmony,
    /// DeepSeek V3 / R1 / V3.1: `<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>…<｜tool▁call▁end｜><｜tool▁calls▁end｜>`.
    DeepSeek,
    /// Mistral: `[TOOL_CALLS][{"name": …, "arguments": {…}}]`, or (Small 3.2, Devstral) `[TOOL_CALLS]NAME[ARGS]{…}`.
    Mistral,
}

impl Format {
    /// The syntax a chat template's text teaches, if it is one of these. (GLM writes `<tool_call>` too, around
    /// `NAME<arg_key>…</arg_key><arg_value>…</arg_value>`, which is not parsed here.)
    pub fn detect(template: &str) -> Option<Format> {
        if template.contains("<tool_call>") && !template.contains("<arg_key>") {
            Some(if template.contains("<function=") {
                Format::QwenXml
            } else {
                Format::Qwen
            })
        } else if template.contains("<|channel|>") && template.contains("<|call|>") {
            Some(Format::Harmony)
        } else if template.contains("tool▁calls▁begin") {
            Some(Format::DeepSeek)
        } else if template.contains("[TOOL_CALLS]") {
            Some(Format::Mistral)
        } else {
            None
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Format::Qwen => "Qwen (<tool_call>)",
            Format::QwenXml => "Qwen XML (<tool_call><function=…>)",
            Format::Harmony => "gpt-oss harmony",
            Format::DeepSeek => "DeepSeek",
            Format::Mistral => "Mistral ([TOOL_CALLS])",
        }
    }

    /// The texts a call or other markup of this format begins with.
    fn markers(self) -> &'static [&'static str] {
        match self {
            Format::Qwen | Format::QwenXml => qwen::MARKERS,
            Format::Harmony => harmony::MARKERS,
            Format::DeepSeek => deepseek::MARKERS,
            Format::Mistral => mistral::MARKERS,
        }
    }

    /// What `text`, which begins with one of [`markers`](Self::markers), amounts to; `at_end`: no more text
    /// will come.
    fn step(self, text: &str, at_end: bool, tools: &[Value]) -> Step {
        match self {
            Format::Qwen | Format::QwenXml => qwen::step(text, at_end, tools),
            Format::Harmony => harmony::step(text, at_end),
            Format::DeepSeek => deepseek::step(text, at_end),
            Format::Mistral => mistral::step(text, at_end),
        }
    }
}

/// One call as OpenAI gives it: the function's name and its arguments as JSON text.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ToolCall {
    pub name: String,
    pub arguments: String,
}

impl ToolCall {
    /// A call whose arguments are a JSON value (an object, as the model writes it; a string that the model
    /// wrote as JSON text is taken as that text).
    fn new(name: &str, arguments: &Value) -> ToolCall {
        let arguments = match arguments {
            Value::String(s) => s.clone(),
            Value::Null => "{}".to_owned(),
            v => v.to_string(),
        };
        ToolCall {
            name: name.trim().to_owned(),
            arguments,
        }
    }
}

/// A piece of the model's answer, in order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Item {
    /// Text for the user (`content`).
    Content(String),
    /// The model's reasoning, where the format marks it apart (harmony's analysis channel):
    /// `reasoning_content`, as llama-server gives it.
    Reasoning(String),
    Call(ToolCall),
}

/// What the text from a marker on amounts to.
#[derive(Debug, PartialEq)]
enum Step {
    /// Not enough text yet to tell.
    Wait,
    /// Whole calls (Mistral's list may hold several), the first `len` bytes.
    Calls(Vec<ToolCall>, usize),
    /// Markup that says nothing by itself (a wrapper around calls), `len` bytes.
    Skip(usize),
    /// A header of `len` bytes, then text of the given kind up to the first of `ends` (which is dropped).
    Body {
        len: usize,
        reasoning: bool,
        ends: &'static [&'static str],
    },
    /// The marker is not markup after all (malformed): it stays in the text.
    Text,
}

/// Where the parser stands.
enum State {
    Outside,
    Body {
        reasoning: bool,
        ends: &'static [&'static str],
    },
}

/// Splits a model's answer into [`Item`]s as its text arrives.
pub struct Parser {
    format: Format,
    /// The request's tools (the Qwen XML form reads their parameter types).
    tools: Vec<Value>,
    /// Text not yet given out.
    buf: String,
    state: State,
    /// Content that is only whitespace so far: given out before more content, dropped before a call.
    blank: String,
    calls: usize,
    /// Nothing but whitespace has come since the last call.
    after_call: bool,
}

impl Parser {
    pub fn new(format: Format, tools: Vec<Value>) -> Parser {
        Parser {
            format,
            tools,
            buf: String::new(),
            state: State::Outside,
            blank: String::new(),
            calls: 0,
            after_call: false,
        }
    }

    /// The items that `text`, the next piece of the answer, completes.
    pub fn push(&mut self, text: &str) -> Vec<Item> {
        self.buf.push_str(text);
        let mut out = Vec::new();
        self.run(false, &mut out);
        out
    }

    /// The items left once the answer has ended.
    pub fn finish(&mut self) -> Vec<Item> {
        let mut out = Vec::new();
        self.run(true, &mut out);
        // Whitespace at the end of a plain answer is the answer's; next to a call it is layout.
        if self.calls == 0 && !self.blank.is_empty() {
            out.push(Item::Content(std::mem::take(&mut self.blank)));
        }
        out
    }

    /// Parses a whole answer: its content (none when empty), reasoning and calls.
    pub fn whole(format: Format, tools: Vec<Value>, text: &str) -> (Option<String>, Option<String>, Vec<ToolCall>) {
        let mut parser = Parser::new(format, tools);
        let mut items = parser.push(text);
        items.extend(parser.finish());
        let (mut content, mut reasoning, mut calls) = (String::new(), String::new(), Vec::new());
        for item in items {
            match item {
                Item::Content(t) => content.push_str(&t),
                Item::Reasoning(t) => reasoning.push_str(&t),
                Item::Call(c) => calls.push(c),
            }
        }
        let some = |s: String| (!s.is_empty()).then_some(s);
        (some(content), some(reasoning), calls)
    }

    fn run(&mut self, at_end: bool, out: &mut Vec<Item>) {
        loop {
            match self.state {
                State::Outside => {
                    let Some((at, marker)) = earliest(&self.buf, self.format.markers()) else {
                        let keep = if at_end {
                            0
                        } else {
                            held(&self.buf, self.format.markers())
                        };
                        let text: String = self.buf.drain(..self.buf.len() - keep).collect();
                        self.content(text, out);
                        return;
                    };
                    let before: String = self.buf.drain(..at).collect();
                    self.content(before, out);
                    match self.format.step(&self.buf, at_end, &self.tools) {
                        Step::Wait if at_end => {
                            // An unfinished call (cut off by max_tokens): the user gets the text as it is.
                            let text = std::mem::take(&mut self.buf);
                            self.content(text, out);
                            return;
                        }
                        Step::Wait => return,
                        Step::Calls(calls, len) => {
                            self.buf.drain(..len);
                            self.blank.clear();
                            self.calls += calls.len();
                            self.after_call = true;
                            out.extend(calls.into_iter().map(Item::Call));
                        }
                        Step::Skip(len) => {
                            self.buf.drain(..len);
                        }
                        Step::Body { len, reasoning, ends } => {
                            self.buf.drain(..len);
                            self.state = State::Body { reasoning, ends };
                        }
                        Step::Text => {
                            let text: String = self.buf.drain(..marker.len()).collect();
                            self.content(text, out);
                        }
                    }
                }
                State::Body { reasoning, ends } => {
                    let (text, ended) = match earliest(&self.buf, ends) {
                        Some((at, end)) => {
                            let text: String = self.buf.drain(..at).collect();
                            self.buf.drain(..end.len());
                            (text, true)
                        }
                        None => {
                            let keep = if at_end { 0 } else { held(&self.buf, ends) };
                            (self.buf.drain(..self.buf.len() - keep).collect(), at_end)
                        }
                    };
                    if reasoning {
                        if !text.is_empty() {
                            out.push(Item::Reasoning(text));
                        }
                    } else {
                        self.content(text, out);
                    }
                    if !ended {
                        return;
                    }
                    self.state = State::Outside;
                }
            }
        }
    }

    /// Gives out content, except whitespace that may yet turn out to stand next to a call.
    fn content(&mut self, text: String, out: &mut Vec<Item>) {
        if text.is_empty() {
            return;
        }
        // Whitespace right after a call is the call's layout.
        let text = if self.after_call {
            text.trim_start().to_owned()
        } else {
            text
        };
        let body = text.trim_end();
        if body.is_empty() {
            self.blank.push_str(&text);
            return;
        }
        self.after_call = false;
        let mut given = std::mem::take(&mut self.blank);
        given.push_str(body);
        self.blank.push_str(&text[body.len()..]);
        match out.last_mut() {
            Some(Item::Content(last)) => last.push_str(&given),
            _ => out.push(Item::Content(given)),
        }
    }
}

/// The first occurrence of any of `markers` in `text`: its position and the marker.
fn earliest<'a>(text: &str, markers: &[&'a str]) -> Option<(usize, &'a str)> {
    markers
        .iter()
        .filter_map(|m| text.find(m).map(|at| (at, *m)))
        .min_by_key(|&(at, m)| (at, usize::MAX - m.len()))
}

/// How many bytes at the end of `text` may be the start of one of `markers` (held back until more text
/// tells).
fn held(text: &str, markers: &[&str]) -> usize {
    markers
        .iter()
        .map(|m| {
            (1..m.len().min(text.len() + 1))
                .rev()
                .find(|&n| text.is_char_boundary(text.len() - n) && m.starts_with(&text[text.len() - n..]))
                .unwrap_or(0)
        })
        .max()
        .unwrap_or(0)
}

/// The JSON value at the start of `text` (after whitespace): the value and the bytes it took, `Err(true)`
/// when `text` ends inside it, `Err(false)` when it is not JSON.
fn json_prefix(text: &str) -> Result<(Value, usize), bool> {
    let mut values = serde_json::Deserializer::from_str(text).into_iter::<Value>();
    match values.next() {
        Some(Ok(v)) => Ok((v, values.byte_offset())),
        Some(Err(e)) => Err(e.is_eof()),
        None => Err(true),
    }
}

/// An id for a call, as OpenAI's (`call_` and 24 letters and digits), unique enough that a client can
/// match each `tool` answer to its call.
pub fn call_id() -> String {
    use std::hash::{BuildHasher, RandomState};
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(0);
    const DIGITS: &[u8] = b"0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ";
    let state = RandomState::new();
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let mut id = String::from("call_");
    for part in 0..2u64 {
        let mut h = state.hash_one((n, part));
        for _ in 0..12 {
            id.push(DIGITS[(h % 62) as usize] as char);
            h /= 62;
        }
    }
    id
}

#[cfg(test)]
impl Parser {
    /// Feeds `text` `piece` characters at a time, as tokens come, and gathers what the parser gives out,
    /// merging consecutive content.
    pub(crate) fn streamed(format: Format, tools: Vec<Value>, text: &str, piece: usize) -> Vec<Item> {
        let mut parser = Parser::new(format, tools);
        let chars: Vec<char> = text.chars().collect();
        let mut items = Vec::new();
        for chunk in chars.chunks(piece) {
            items.extend(parser.push(&chunk.iter().collect::<String>()));
        }
        items.extend(parser.finish());
        let mut merged: Vec<Item> = Vec::new();
        for item in items {
            match (merged.last_mut(), item) {
                (Some(Item::Content(a)), Item::Content(b)) => a.push_str(&b),
                (_, item) => merged.push(item),
            }
        }
        merged
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each fixture template's syntax, read from its text.
    #[test]
    fn formats_are_read_from_the_templates() {
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/fixtures/templates");
        for (file, want) in [
            ("qwen3.jinja", Some(Format::Qwen)),
            ("qwen2.5-chatml.jinja", Some(Format::Qwen)),
            ("qwen3-coder.jinja", Some(Format::QwenXml)),
            ("nemotron-3-nano-30b-a3b.jinja", Some(Format::QwenXml)),
            ("gpt-oss.jinja", Some(Format::Harmony)),
            ("glm-4.7-flash.jinja", None),
            ("lfm2.5-8b-a1b.jinja", None),
            ("mixtral-8x7b-instruct-v0.1.jinja", None),
        ] {
            let source = std::fs::read_to_string(format!("{dir}/{file}")).unwrap();
            assert_eq!(Format::detect(&source), want, "{file}");
        }
    }

    #[test]
    fn call_ids_are_openai_shaped_and_differ() {
        let (a, b) = (call_id(), call_id());
        assert!(
            a.starts_with("call_") && a.len() == 29 && a[5..].chars().all(|c| c.is_ascii_alphanumeric()),
            "{a}"
        );
        assert_ne!(a, b);
    }
}
