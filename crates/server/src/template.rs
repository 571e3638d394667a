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

/// The name the compiled template is stored under; it appears in nothing the user sees.
const NAME: &str = "chat_template";

/// A compiled chat template with the special token texts it may print.
pub struct ChatTemplate {
    env: Environment<'static>,
    bos: String,
    eos: String,
}

/// One turn of the conversation as the template sees it (`message.role`, `message.content`).
///
/// `content` is text. OpenAI's list-of-parts form (`[{"type": "text", "text": …}]`) is flattened
/// into one string by the request parser before it gets here, as llama-server does for text-only
/// models.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Message {
    pub role: String,
    pub content: String,
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
    /// Rendering failed for another reason (an undefined attribute used, a bad `strftime_now`
    /// format, …).
    #[error("chat template failed at line {line}: {cause}")]
    Render { line: usize, cause: String },
}

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
        env.add_template_owned(NAME, without_generation_tags(source))
            .map_err(|e| TemplateError::Syntax {
                line: e.line().unwrap_or(0),
                cause: cause(&e),
            })?;
        Ok(ChatTemplate {
            env,
            bos: bos.to_owned(),
            eos: eos.to_owned(),
        })
    }

    /// The prompt text for `messages`, ending with the assistant's turn opened
    /// (add_generation_prompt = true).
    pub fn render(&self, messages: &[Message]) -> Result<String, TemplateError> {
        let template = self.env.get_template(NAME).map_err(|e| render_error(&e))?;
        // The context llama-server gives: no tools (defined, and none), and `enable_thinking` left
        // undefined so that templates with a thinking switch take their default.
        let ctx = context! {
            messages => Value::from_serialize(messages),
            tools => Value::from(()),
            add_generation_prompt => true,
            bos_token => &self.bos,
            eos_token => &self.eos,
        };
        template.render(ctx).map_err(|e| render_error(&e))
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

    #[test]
    fn real_templates_render_as_transformers_does() {
        let expected = expected();
        let templates = expected["templates"].as_object().unwrap();
        assert_eq!(templates.len(), 7, "one entry per fixture template");
        for (file, entry) in templates {
            let source = std::fs::read_to_string(format!("{FIXTURES}/{file}")).unwrap();
            let bos = entry["bos_token"].as_str().unwrap();
            let eos = entry["eos_token"].as_str().unwrap();
            let template = ChatTemplate::new(&source, bos, eos).unwrap_or_else(|e| panic!("{file}: {e}"));
            for (case, want) in entry["cases"].as_object().unwrap() {
                check(
                    template.render(&conversation(&expected, case)),
                    want,
                    &format!("{file} / {case}"),
                );
            }
        }
    }

    #[test]
    fn engine_features_match_the_reference() {
        let expected = expected();
        let messages = conversation(&expected, "system_user_assistant_user");
        for (name, want) in expected["features"].as_object().unwrap() {
            let source = want["source"].as_str().unwrap();
            let template = ChatTemplate::new(source, "<s>", "</s>").unwrap_or_else(|e| panic!("{name}: {e}"));
            check(template.render(&messages), want, name);
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
        let err = template.render(&[]).unwrap_err();
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
        let msg = Message {
            role: "user".into(),
            content: "hi".into(),
        };
        let err = template.render(&[msg]).unwrap_err();
        assert!(matches!(err, TemplateError::Render { line: 2, .. }), "{err:?}");
    }

    #[test]
    fn strftime_now_formats_local_time() {
        let template =
            ChatTemplate::new("{{ strftime_now('%Y-%m-%d') }}|{{ strftime_now('%d %b %Y') }}", "", "").unwrap();
        let out = template.render(&[]).unwrap();
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
            .render(&[])
            .unwrap_err();
        assert!(
            matches!(&bad, TemplateError::Render { cause, .. } if cause.contains("strftime_now")),
            "{bad:?}"
        );
    }

    #[test]
    fn message_deserializes_from_openai_json() {
        let m: Message = serde_json::from_str(r#"{"role":"user","content":"héllo"}"#).unwrap();
        assert_eq!(
            m,
            Message {
                role: "user".into(),
                content: "héllo".into()
            }
        );
    }
}
