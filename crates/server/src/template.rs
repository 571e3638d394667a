//! Chat templates: a conversation becomes the prompt text the model was trained on, by the model's
//! own Jinja template (GGUF `tokenizer.chat_template`, or a `--chat-template` file), rendered the
//! way transformers' `apply_chat_template` and llama-server render it, so that a model served here
//! sees the same prompt as there.
//!
//! What that takes beyond plain minijinja: jinja2's `trim_blocks` and `lstrip_blocks` (transformers
//! turns both on and every real template is written for them), Python's string/list/dict methods
//! (`.strip()`, `.split()`, `.items()`, … from minijinja-contrib's pycompat), and the three globals
//! transformers defines itself: `raise_exception`, `strftime_now` and a `tojson` that writes what
//! Python's `json.dumps` writes.

use std::fmt::Write as _;

use minijinja::value::{Kwargs, ValueKind};
use minijinja::{context, Environment, Error, ErrorKind, Value};
use serde::{Deserialize, Serialize};

use crate::tool_calls::Format;

/// The name the compiled template is stored under; it appears in nothing the user sees.
const NAME: &str = "chat_template";

/// A compiled chat template with the special token texts it may print.
pub struct ChatTemplate {
    env: Environment<'static>,
    bos: String,
    eos: String,
    origin: String,
    /// Whether the template reads `tools` at all: one that never mentions them would drop a request's
    /// tools without a word.
    knows_tools: bool,
    /// The model's tool-call syntax, as the template writes past calls.
    tool_format: Option<Format>,
}

/// One turn of the conversation as the template sees it (`message.role`, `message.content`, and for tool
/// use `message.tool_calls`, `message.tool_call_id`, `message.name`).
///
/// `content` is text. OpenAI's list-of-parts form (`[{"type": "text", "text": …}]`) is flattened
/// into one string by the request parser before it gets here, as llama-server does for text-only
/// models. The tool fields are left out of what the template sees when absent (templates test
/// `"tool_calls" in message` and `message.tool_calls is defined`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Message {
    pub role: String,
    pub content: String,
    /// An assistant's calls, OpenAI's `{"id", "type": "function", "function": {"name", "arguments"}}`
    /// with `arguments` as the JSON object it spells (see `api::tool_calls_for_template`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<Vec<serde_json::Value>>,
    /// A `tool` message's answer to the call with this id.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
}

impl Message {
    /// A message with only a role and text.
    pub fn text(role: &str, content: impl Into<String>) -> Message {
        Message {
            role: role.to_owned(),
            content: content.into(),
            tool_calls: None,
            tool_call_id: None,
            name: None,
        }
    }
}

/// Why a chat template could not be compiled or rendered. Each message is one line.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum TemplateError {
    /// The template's Jinja text does not parse; `line` is 1-based within the template.
    #[error("chat template syntax error at line {line}: {cause}")]
    Syntax { line: usize, cause: String },
    /// The template refused the conversation with `raise_exception(message)`; the text is the
    /// template's own (e.g. "Conversation roles must alternate user/assistant/user/assistant/..."),
    /// meant for the client as is.
    #[error("{0}")]
    Raised(String),
    /// Rendering failed for another reason (an undefined attribute used, an unknown filter, a bad
    /// `strftime_now` format, …).
    #[error("chat template failed at line {line}: {cause}")]
    Render { line: usize, cause: String },
    /// The template ran [`FUEL`] instructions without finishing: a loop that never ends, or work
    /// that explodes with the conversation's length.
    #[error("chat template ran out of fuel ({FUEL} instructions) rendering {messages} messages")]
    OutOfFuel { messages: usize },
    /// The template wrote more than the bound the server set on its output.
    #[error("chat template wrote more than {limit} bytes")]
    TooLong { limit: usize },
}

impl TemplateError {
    /// Whether the fault is the conversation's (the template refused it with `raise_exception`), to be
    /// answered as a bad request; any other failure is the template's, that is the operator's.
    pub fn is_the_conversations(&self) -> bool {
        matches!(self, TemplateError::Raised(_))
    }
}

/// The instructions one rendering may run (minijinja's fuel: about one per expression, loop step or
/// piece of output). The real templates (tests/fixtures/templates, models/demo/chat.jinja) take at most
/// 77 a message and 70 to start (`fuel_covers_every_real_template` measures it): 10 million renders a
/// conversation of over 100,000 messages, more than a request body of the default 1 MiB can hold, and is
/// spent in 0.2 to 1 s of one core, which is what a template that loops without end or explodes with the
/// conversation's length costs a request.
pub const FUEL: u64 = 10_000_000;

/// The payload of a `raise_exception` call, carried as the source of minijinja's error so that
/// `render` can tell the template's own refusal from an engine failure.
#[derive(Debug)]
struct Raised(String);

impl std::fmt::Display for Raised {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Raised {}

impl ChatTemplate {
    /// `source`: the Jinja text (GGUF `tokenizer.chat_template`, or a `--chat-template` file);
    /// `bos`/`eos`: the model's special token texts.
    pub fn new(source: &str, bos: &str, eos: &str) -> Result<ChatTemplate, TemplateError> {
        let mut env = Environment::new();
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        // jinja2 calls `none` not iterable (`tools is iterable and tools | length > 0`, as
        // Qwen3-Coder and Nemotron 3 write it); minijinja iterates none as empty and would go on
        // to `none | length`.
        env.add_test("iterable", |v: &Value| !v.is_none() && v.try_iter().is_ok());
        // jinja2 prints Python's str() of a value: `True`, `False`, `None` where minijinja writes
        // `true`, `false`, `none`. (Only `{{ … }}` output; `~` and `| string` keep minijinja's
        // spelling, as do printed lists and maps.)
        env.set_formatter(|out, state, value| {
            let python = match value.kind() {
                ValueKind::Bool if value.is_true() => "True",
                ValueKind::Bool => "False",
                ValueKind::None => "None",
                _ => return minijinja::escape_formatter(out, state, value),
            };
            out.write_str(python).map_err(Error::from)
        });
        env.add_function("raise_exception", raise_exception);
        env.add_function("strftime_now", strftime_now);
        // Replaces minijinja's own, which escapes `<`, `>`, `&` and `'` for HTML and writes no
        // spaces.
        env.add_filter("tojson", tojson);
        env.set_fuel(Some(FUEL));
        env.add_template_owned(NAME, without_generation_tags(source))
            .map_err(|e| TemplateError::Syntax {
                line: e.line().unwrap_or(0),
                cause: cause(&e),
            })?;
        Ok(ChatTemplate {
            env,
            bos: bos.to_owned(),
            eos: eos.to_owned(),
            origin: "the chat template".to_owned(),
            knows_tools: source.contains("tools"),
            tool_format: Format::detect(source),
        })
    }

    /// Names where the template came from (`--chat-template FILE`, the model's), for the errors the
    /// server answers when it fails.
    pub fn with_origin(mut self, origin: impl Into<String>) -> ChatTemplate {
        self.origin = origin.into();
        self
    }

    pub fn origin(&self) -> &str {
        &self.origin
    }

    /// Whether the template renders a request's `tools` (it mentions them).
    pub fn knows_tools(&self) -> bool {
        self.knows_tools
    }

    /// The tool-call syntax the template teaches the model, when it is one the server parses.
    pub fn tool_format(&self) -> Option<Format> {
        self.tool_format
    }

    /// The prompt text for `messages`, ending with the assistant's turn opened
    /// (add_generation_prompt = true), of at most `max_bytes` bytes. `tools`: OpenAI's tool objects
    /// (`{"type": "function", "function": {"name", "description", "parameters"}}`), as transformers'
    /// `apply_chat_template(tools=…)` hands them to the template; none when empty.
    pub fn render(
        &self,
        messages: &[Message],
        tools: &[serde_json::Value],
        max_bytes: usize,
    ) -> Result<String, TemplateError> {
        self.render_counted(messages, tools, max_bytes).map(|(text, _)| text)
    }

    /// [`render`](Self::render), and the fuel it took.
    fn render_counted(
        &self,
        messages: &[Message],
        tools: &[serde_json::Value],
        max_bytes: usize,
    ) -> Result<(String, u64), TemplateError> {
        let template = self.env.get_template(NAME).map_err(|e| render_error(&e))?;
        // The context llama-server gives: the tools, or none (defined, and none) when there are none,
        // and `enable_thinking` left undefined so that templates with a thinking switch take their
        // default.
        let tools = if tools.is_empty() {
            Value::from(())
        } else {
            Value::from_serialize(tools)
        };
        let ctx = context! {
            messages => Value::from_serialize(messages),
            tools => tools,
            add_generation_prompt => true,
            bos_token => &self.bos,
            eos_token => &self.eos,
        };
        // Written through a writer that refuses to grow past `max_bytes`, so that a template that
        // prints without end fails there instead of when memory runs out.
        let mut out = Capped {
            text: Vec::new(),
            limit: max_bytes,
            over: false,
        };
        let captured = template.render_captured_to(ctx, &mut out).map_err(|e| {
            if out.over {
                TemplateError::TooLong { limit: max_bytes }
            } else if e.kind() == ErrorKind::OutOfFuel {
                TemplateError::OutOfFuel {
                    messages: messages.len(),
                }
            } else {
                render_error(&e)
            }
        })?;
        let fuel = captured.state().fuel_levels().map_or(0, |(used, _)| used);
        // minijinja writes only `str`s, which are whole UTF-8 sequences.
        let text = String::from_utf8(out.text).expect("minijinja writes UTF-8");
        Ok((text, fuel))
    }
}

/// A `Vec<u8>` writer that fails (and says so in `over`) rather than hold more than `limit` bytes.
struct Capped {
    text: Vec<u8>,
    limit: usize,
    over: bool,
}

impl std::io::Write for Capped {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        if self.text.len() + bytes.len() > self.limit {
            self.over = true;
            return Err(std::io::Error::other("the chat template's output limit"));
        }
        self.text.extend_from_slice(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// `{% generation %}…{% endgeneration %}` is transformers' own tag (it marks the assistant's tokens
/// for training masks and renders its body unchanged); LFM2 and Laguna templates use it. It becomes
/// `{% if true %}…{% endif %}`, which keeps its `-`/`+` whitespace control and its place as a block
/// for trim_blocks and lstrip_blocks, so the output is what transformers renders.
fn without_generation_tags(source: &str) -> String {
    let mut out = String::with_capacity(source.len());
    let mut rest = source;
    while let Some(start) = rest.find("{%") {
        let tag = &rest[start..];
        // An unclosed tag is left as it is, for the parser to report.
        let Some(end) = tag[2..].find("%}").map(|i| i + 2) else {
            break;
        };
        out.push_str(&rest[..start]);
        let inner = &tag[2..end];
        let after_open = inner.strip_prefix(['-', '+']).unwrap_or(inner);
        let word = after_open.strip_suffix(['-', '+']).unwrap_or(after_open);
        let open = &inner[..inner.len() - after_open.len()];
        let close = &after_open[word.len()..];
        let word = word.trim();
        match word {
            "generation" => write!(out, "{{%{open} if true {close}%}}"),
            "endgeneration" => write!(out, "{{%{open} endif {close}%}}"),
            _ => write!(out, "{}", &tag[..end + 2]),
        }
        .expect("writing to a String");
        rest = &tag[end + 2..];
    }
    out.push_str(rest);
    out
}

fn render_error(e: &Error) -> TemplateError {
    let mut source: Option<&(dyn std::error::Error + 'static)> = std::error::Error::source(e);
    while let Some(s) = source {
        if let Some(Raised(message)) = s.downcast_ref::<Raised>() {
            return TemplateError::Raised(message.clone());
        }
        source = s.source();
    }
    TemplateError::Render {
        line: e.line().unwrap_or(0),
        cause: cause(e),
    }
}

/// minijinja's kind and detail ("syntax error: unexpected end of input, expected …") without its
/// own location suffix, since our messages name the line themselves.
fn cause(e: &Error) -> String {
    match e.detail() {
        Some(detail) => format!("{}: {detail}", e.kind()),
        None => e.kind().to_string(),
    }
}

fn raise_exception(message: String) -> Result<Value, Error> {
    Err(Error::new(ErrorKind::InvalidOperation, "raise_exception").with_source(Raised(message)))
}

/// `datetime.now().strftime(format)` as transformers defines it: local time, C strftime syntax.
/// Templates use it to print today's date into the system prompt (Llama 3.x: `strftime_now("%d %b
/// %Y")`).
fn strftime_now(format: &str) -> Result<String, Error> {
    let mut out = String::new();
    // chrono reports an unknown specifier as a formatting error; `to_string()` would panic on it
    // instead.
    write!(out, "{}", chrono::Local::now().format(format)).map_err(|_| {
        Error::new(
            ErrorKind::InvalidOperation,
            format!("strftime_now: invalid format {format:?}"),
        )
    })?;
    Ok(out)
}

/// transformers' `tojson` filter: `json.dumps(value, ensure_ascii=False, indent=None,
/// separators=None, sort_keys=False)` with those four keyword arguments, as real templates pass
/// them (GLM writes `tojson(ensure_ascii=False)`, Qwen `tojson`, others `tojson(indent=4)`).
/// Python's defaults are kept: non-ASCII as is, `", "` and `": "` between items without indent,
/// `","` and newlines with it, keys in insertion order. Tool schemas go through this, and the model
/// was trained on exactly that spelling.
fn tojson(value: &Value, kwargs: Kwargs) -> Result<Value, Error> {
    let indent: Option<usize> = kwargs.get("indent")?;
    let separators: Option<(String, String)> = match kwargs.get::<Option<Vec<String>>>("separators")? {
        None => None,
        Some(pair) => match <[String; 2]>::try_from(pair) {
            Ok([item, key]) => Some((item, key)),
            Err(_) => {
                return Err(Error::new(
                    ErrorKind::InvalidOperation,
                    "tojson: separators must be two strings",
                ))
            }
        },
    };
    let (item, key) = separators.unwrap_or_else(|| {
        let item = if indent.is_some() { "," } else { ", " };
        (item.to_owned(), ": ".to_owned())
    });
    let style = JsonStyle {
        indent,
        item,
        key,
        ensure_ascii: kwargs.get::<Option<bool>>("ensure_ascii")?.unwrap_or(false),
        sort_keys: kwargs.get::<Option<bool>>("sort_keys")?.unwrap_or(false),
    };
    kwargs.assert_all_used()?;
    let mut out = String::new();
    write_json(&mut out, value, &style, 0)?;
    Ok(Value::from_safe_string(out))
}

struct JsonStyle {
    indent: Option<usize>,
    /// Between items (`", "`) and between a key and its value (`": "`).
    item: String,
    key: String,
    ensure_ascii: bool,
    sort_keys: bool,
}

fn write_json(out: &mut String, value: &Value, style: &JsonStyle, depth: usize) -> Result<(), Error> {
    match value.kind() {
        ValueKind::Undefined | ValueKind::None => out.push_str("null"),
        ValueKind::Bool => out.push_str(if value.is_true() { "true" } else { "false" }),
        ValueKind::Number if value.is_integer() => write!(out, "{value}").expect("writing to a String"),
        ValueKind::Number => write_float(out, f64::try_from(value.clone())?),
        ValueKind::String => write_string(out, value.as_str().unwrap_or_default(), style.ensure_ascii),
        ValueKind::Map => {
            // Python turns non-string keys into their JSON text (1 -> "1", true -> "true") and
            // sorts after that.
            let mut entries = Vec::new();
            for key in value.try_iter()? {
                let name = match key.as_str() {
                    Some(s) => s.to_owned(),
                    None => {
                        let mut text = String::new();
                        write_json(&mut text, &key, style, depth)?;
                        text
                    }
                };
                entries.push((name, value.get_item(&key)?));
            }
            if style.sort_keys {
                entries.sort_by(|a, b| a.0.cmp(&b.0));
            }
            write_container(out, ('{', '}'), &entries, style, depth, |out, (name, item)| {
                write_string(out, name, style.ensure_ascii);
                out.push_str(&style.key);
                write_json(out, item, style, depth + 1)
            })?;
        }
        ValueKind::Seq | ValueKind::Iterable => {
            let items: Vec<Value> = value.try_iter()?.collect();
            write_container(out, ('[', ']'), &items, style, depth, |out, item| {
                write_json(out, item, style, depth + 1)
            })?;
        }
        kind => {
            return Err(Error::new(
                ErrorKind::InvalidOperation,
                format!("tojson: a {kind} is not JSON serializable"),
            ))
        }
    }
    Ok(())
}

fn write_container<T>(
    out: &mut String,
    (open, close): (char, char),
    items: &[T],
    style: &JsonStyle,
    depth: usize,
    mut write_item: impl FnMut(&mut String, &T) -> Result<(), Error>,
) -> Result<(), Error> {
    out.push(open);
    if items.is_empty() {
        out.push(close);
        return Ok(());
    }
    for (i, item) in items.iter().enumerate() {
        if i > 0 {
            out.push_str(&style.item);
        }
        if let Some(width) = style.indent {
            out.push('\n');
            out.extend(std::iter::repeat_n(' ', width * (depth + 1)));
        }
        write_item(out, item)?;
    }
    if let Some(width) = style.indent {
        out.push('\n');
        out.extend(std::iter::repeat_n(' ', width * depth));
    }
    out.push(close);
    Ok(())
}

/// serde_json escapes strings as Python does with ensure_ascii=False: `"`, `\`, `\n`, `\r`, `\t`,
/// `\b`, `\f` by name, other control characters as `\u00xx` (lowercase), everything else as is.
/// With ensure_ascii, Python also writes every non-ASCII character as `\uxxxx`, beyond the BMP as a
/// UTF-16 surrogate pair.
fn write_string(out: &mut String, s: &str, ensure_ascii: bool) {
    let json = serde_json::to_string(s).expect("a str always serializes");
    if !ensure_ascii {
        out.push_str(&json);
        return;
    }
    for c in json.chars() {
        if c.is_ascii() {
            out.push(c);
        } else {
            for unit in c.encode_utf16(&mut [0; 2]) {
                write!(out, "\\u{unit:04x}").expect("writing to a String");
            }
        }
    }
}

/// Python's float repr: shortest round-trip digits like Rust's `{}`, but whole numbers keep their
/// `.0`, and `NaN`/`Infinity` as json.dumps spells them. (Exponent forms such as `1e+20` differ;
/// tool schemas do not use them.)
fn write_float(out: &mut String, f: f64) {
    if f.is_nan() {
        out.push_str("NaN");
    } else if f.is_infinite() {
        out.push_str(if f > 0.0 { "Infinity" } else { "-Infinity" });
    } else if f.fract() == 0.0 && f.abs() < 1e16 {
        write!(out, "{f:.1}").expect("writing to a String");
    } else {
        write!(out, "{f}").expect("writing to a String");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Real templates and the prompts transformers' reference engine renders from them: see
    /// tests/fixtures/templates/README.md (`render.py` writes `expected.json`).
    const FIXTURES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/fixtures/templates");

    fn expected() -> serde_json::Value {
        let text = std::fs::read_to_string(format!("{FIXTURES}/expected.json")).expect("expected.json is committed");
        serde_json::from_str(&text).expect("expected.json parses")
    }

    fn conversation(expected: &serde_json::Value, name: &str) -> Vec<Message> {
        serde_json::from_value(expected["conversations"][name].clone()).expect("a conversation is a message list")
    }

    /// `{"prompt": …}` must come out exactly; `{"error": …}` must be the template's own
    /// raise_exception text.
    fn check(got: Result<String, TemplateError>, want: &serde_json::Value, what: &str) {
        if let Some(prompt) = want.get("prompt") {
            assert_eq!(
                got.as_deref().map_err(|e| e.to_string()),
                Ok(prompt.as_str().unwrap()),
                "{what}"
            );
        } else {
            let message = want["error"].as_str().unwrap().to_owned();
            assert_eq!(got, Err(TemplateError::Raised(message)), "{what}");
        }
    }

    /// The tool conversations render with `expected.json`'s tools (OpenAI tool objects, as transformers'
    /// `apply_chat_template(tools=…)` takes them), the others with none. gpt-oss's template prints
    /// today's date, which is put in place of the day `render.py` ran.
    #[test]
    fn real_templates_render_as_transformers_does() {
        let expected = expected();
        let templates = expected["templates"].as_object().unwrap();
        assert_eq!(templates.len(), 8, "one entry per fixture template");
        let tools: Vec<serde_json::Value> = serde_json::from_value(expected["tools"].clone()).unwrap();
        let with_tools: Vec<&str> = expected["tool_conversations"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c.as_str().unwrap())
            .collect();
        let (then, today) = (
            expected["date"].as_str().unwrap(),
            chrono::Local::now().format("%Y-%m-%d").to_string(),
        );
        let mut rendered_tools = 0;
        for (file, entry) in templates {
            let source = std::fs::read_to_string(format!("{FIXTURES}/{file}")).unwrap();
            let bos = entry["bos_token"].as_str().unwrap();
            let eos = entry["eos_token"].as_str().unwrap();
            let template = ChatTemplate::new(&source, bos, eos).unwrap_or_else(|e| panic!("{file}: {e}"));
            for (case, want) in entry["cases"].as_object().unwrap() {
                let tools = if with_tools.contains(&case.as_str()) {
                    rendered_tools += 1;
                    &tools[..]
                } else {
                    &[]
                };
                let mut want = want.clone();
                if let Some(prompt) = want.get("prompt").and_then(|p| p.as_str()) {
                    want["prompt"] = prompt
                        .replace(&format!("Current date: {then}"), &format!("Current date: {today}"))
                        .into();
                }
                check(
                    template.render(&conversation(&expected, case), tools, usize::MAX),
                    &want,
                    &format!("{file} / {case}"),
                );
            }
        }
        assert_eq!(
            rendered_tools,
            4 * with_tools.len(),
            "four templates render the tool conversations"
        );
    }

    /// A conversation of `n` messages: a system prompt, then users and assistants in turn (the
    /// assistants' with a thinking block, which some templates cut out), each a sentence long.
    fn long_conversation(n: usize, system: bool) -> Vec<Message> {
        (0..n)
            .map(|i| {
                let turn = i - usize::from(system);
                let (role, content) = match i {
                    0 if system => ("system", "You are a helpful assistant.".to_owned()),
                    _ if turn % 2 == 0 => ("user", format!("Message {i}: a question of a few words?")),
                    _ => (
                        "assistant",
                        format!("<think>\nMessage {i} thinks.\n</think>\n\nAnswer {i}, with some words."),
                    ),
                };
                Message::text(role, content)
            })
            .collect()
    }

    /// [`FUEL`] against what the real templates take: each renders conversations of 11 and 1001
    /// messages, which gives its fuel to start and per message; FUEL must cover 100,000 messages (a
    /// request body of the default 1 MiB holds at most about 36,000) for every one.
    #[test]
    fn fuel_covers_every_real_template() {
        let expected = expected();
        let mut sources: Vec<(String, String)> = expected["templates"]
            .as_object()
            .unwrap()
            .keys()
            .map(|f| (f.clone(), std::fs::read_to_string(format!("{FIXTURES}/{f}")).unwrap()))
            .collect();
        let demo = concat!(env!("CARGO_MANIFEST_DIR"), "/../../models/demo/chat.jinja");
        sources.push(("models/demo/chat.jinja".into(), std::fs::read_to_string(demo).unwrap()));
        for (file, source) in sources {
            let template = ChatTemplate::new(&source, "<s>", "</s>").unwrap();
            // Mixtral's refuses a system message, and says so.
            let system = !matches!(
                template.render(&long_conversation(3, true), &[], usize::MAX),
                Err(TemplateError::Raised(_))
            );
            let fuel = |n: usize| match template.render_counted(&long_conversation(n, system), &[], usize::MAX) {
                Ok((_, fuel)) => fuel,
                Err(e) => panic!("{file}, {n} messages: {e}"),
            };
            let (small, large) = (fuel(11), fuel(1001));
            let per_message = (large - small) / 1000;
            let start = small.saturating_sub(per_message * 11);
            println!("{file}: {start} to start, {per_message} a message");
            assert!(
                start + per_message * 100_000 < FUEL,
                "{file}: {start} + {per_message} a message leaves fewer than 100,000 messages"
            );
        }
    }

    /// A template that loops without end, or whose work is cubic in the conversation's length, stops
    /// when its fuel is spent (in about a second); one that prints without end stops at the output bound.
    #[test]
    fn runaway_templates_stop_at_the_fuel_or_the_output_bound() {
        let endless = "{% for i in range(100000) %}{% for j in range(100000) %}{{ '' }}{% endfor %}{% endfor %}";
        let cubic =
            "{% for a in messages %}{% for b in messages %}{% for c in messages %}{% endfor %}{% endfor %}{% endfor %}";
        for (source, n) in [(endless, 1), (cubic, 1000)] {
            let started = std::time::Instant::now();
            let err = ChatTemplate::new(source, "", "")
                .unwrap()
                .render(&long_conversation(n, false), &[], usize::MAX)
                .unwrap_err();
            println!("{err} after {:?}", started.elapsed());
            assert_eq!(err, TemplateError::OutOfFuel { messages: n });
            assert!(!err.is_the_conversations());
            assert!(started.elapsed() < std::time::Duration::from_secs(10), "{source}");
        }
        let flood = ChatTemplate::new("{% for i in range(100000) %}{{ 'x' * 100000 }}{% endfor %}", "", "").unwrap();
        let err = flood.render(&[], &[], 1 << 20).unwrap_err();
        assert_eq!(err, TemplateError::TooLong { limit: 1 << 20 });
        assert_eq!(err.to_string(), "chat template wrote more than 1048576 bytes");
    }

    #[test]
    fn engine_features_match_the_reference() {
        let expected = expected();
        let messages = conversation(&expected, "system_user_assistant_user");
        for (name, want) in expected["features"].as_object().unwrap() {
            let source = want["source"].as_str().unwrap();
            let template = ChatTemplate::new(source, "<s>", "</s>").unwrap_or_else(|e| panic!("{name}: {e}"));
            check(template.render(&messages, &[], usize::MAX), want, name);
        }
    }

    #[test]
    fn generation_tags_become_plain_blocks() {
        let source = "{%- generation -%}a{% endgeneration %}{%+generation+%}b{%endgeneration-%}";
        let want = "{%- if true -%}a{% endif %}{%+ if true +%}b{% endif -%}";
        assert_eq!(without_generation_tags(source), want);
        for untouched in [
            "{% if x %}{%}{{ y }}{% endif %}",
            "text {% generation",
            "{%%}",
            "{#{%#}",
        ] {
            assert_eq!(without_generation_tags(untouched), untouched);
        }
    }

    #[test]
    fn raise_exception_surfaces_the_templates_text() {
        let template = ChatTemplate::new("{{ raise_exception('System role not supported') }}", "", "").unwrap();
        let err = template.render(&[], &[], usize::MAX).unwrap_err();
        assert_eq!(err, TemplateError::Raised("System role not supported".into()));
        assert_eq!(err.to_string(), "System role not supported");
    }

    #[test]
    fn syntax_error_names_line_and_cause() {
        let source = "{% for m in messages %}\n{{ m.content }}\n{% if m.role == 'user' %}x\n{% endfor %}";
        let err = ChatTemplate::new(source, "", "")
            .err()
            .expect("an unclosed if does not parse");
        let TemplateError::Syntax { line, ref cause } = err else {
            panic!("not a syntax error: {err}")
        };
        assert_eq!(line, 4, "the endfor that meets the open if");
        assert!(cause.starts_with("syntax error: "), "{cause}");
        assert!(
            err.to_string()
                .starts_with("chat template syntax error at line 4: syntax error: "),
            "{err}"
        );
        assert!(!err.to_string().contains('\n'), "one line: {err}");
    }

    #[test]
    fn render_error_names_line() {
        let template = ChatTemplate::new("ok\n{{ messages[0].content.missing.deeper }}", "", "").unwrap();
        let msg = Message::text("user", "hi");
        let err = template.render(&[msg], &[], usize::MAX).unwrap_err();
        assert!(matches!(err, TemplateError::Render { line: 2, .. }), "{err:?}");
    }

    #[test]
    fn strftime_now_formats_local_time() {
        let template =
            ChatTemplate::new("{{ strftime_now('%Y-%m-%d') }}|{{ strftime_now('%d %b %Y') }}", "", "").unwrap();
        let out = template.render(&[], &[], usize::MAX).unwrap();
        let (iso, human) = out.split_once('|').unwrap();
        let digits = |s: &str| s.chars().all(|c| c.is_ascii_digit());
        let parts: Vec<&str> = iso.split('-').collect();
        assert!(
            parts.len() == 3 && parts.iter().all(|p| digits(p)) && parts[0].len() == 4,
            "{iso}"
        );
        let words: Vec<&str> = human.split(' ').collect();
        assert_eq!(words.len(), 3, "{human}");
        assert_eq!((words[0], words[2]), (parts[2], parts[0]), "same day: {out}");
        assert!(
            words[1].len() == 3 && words[1].chars().all(|c| c.is_ascii_alphabetic()),
            "month abbreviation: {human}"
        );

        let bad = ChatTemplate::new("{{ strftime_now('%Q') }}", "", "")
            .unwrap()
            .render(&[], &[], usize::MAX)
            .unwrap_err();
        assert!(
            matches!(&bad, TemplateError::Render { cause, .. } if cause.contains("strftime_now")),
            "{bad:?}"
        );
    }

    #[test]
    fn message_deserializes_from_openai_json() {
        let m: Message = serde_json::from_str(r#"{"role":"user","content":"héllo"}"#).unwrap();
        assert_eq!(m, Message::text("user", "héllo"));
    }
}
