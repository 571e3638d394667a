//! Qwen's calls: `<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>`
//! (Qwen2.5, Qwen3, as their templates print past calls and teach in the system prompt), or inside the same
//! tags Qwen3.5's and Qwen3-Coder's XML form:
//! `<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n</function>\n</tool_call>`.
//! Several calls follow one another, usually separated by a newline.

use serde_json::{Map, Value};

use super::{json_prefix, Step, ToolCall};

const OPEN: &str = "<tool_call>";
const CLOSE: &str = "</tool_call>";
pub const MARKERS: &[&str] = &[OPEN];

pub fn step(text: &str, at_end: bool, tools: &[Value]) -> Step {
    let inner = &text[OPEN.len()..];
    let (body, len) = match inner.find(CLOSE) {
        Some(at) => (&inner[..at], OPEN.len() + at + CLOSE.len()),
        // The model may stop right after the call without closing it (a stop string, EOS).
        None if at_end => (inner, text.len()),
        None => {
            let start = inner.trim_start();
            // Text that cannot begin a call (prose that mentions the tag) is not held back.
            let may_be_call =
                start.starts_with('{') || start.starts_with("<function=") || "<function=".starts_with(start);
            return if may_be_call { Step::Wait } else { Step::Text };
        }
    };
    match call(body.trim(), tools) {
        Some(c) => Step::Calls(vec![c], len),
        None if at_end || inner.contains(CLOSE) => Step::Text,
        None => Step::Wait,
    }
}

/// The call in the text between the tags.
fn call(body: &str, tools: &[Value]) -> Option<ToolCall> {
    if let Some(xml) = body.strip_prefix("<function=") {
        return xml_call(xml, tools);
    }
    let (value, len) = json_prefix(body).ok()?;
    if !body[len..].trim().is_empty() {
        return None;
    }
    let name = value.get("name")?.as_str()?;
    let arguments = value
        .get("arguments")
        .or_else(|| value.get("parameters"))
        .unwrap_or(&Value::Null);
    Some(ToolCall::new(name, arguments))
}

/// `NAME>\n<parameter=KEY>\nVALUE\n</parameter>…</function>`: each value is JSON unless the tool's schema
/// says the parameter is a string (or the value does not parse), as the template writes strings bare and
/// everything else with `tojson`.
fn xml_call(text: &str, tools: &[Value]) -> Option<ToolCall> {
    let (name, mut rest) = text.split_once('>')?;
    let name = name.trim();
    let properties = tools
        .iter()
        .find(|t| t["function"]["name"] == name)
        .map(|t| &t["function"]["parameters"]["properties"]);
    let mut arguments = Map::new();
    while let Some(at) = rest.find("<parameter=") {
        let (key, after) = rest[at + "<parameter=".len()..].split_once('>')?;
        let end = after.find("</parameter>")?;
        let raw = &after[..end];
        let raw = raw.strip_prefix('\n').unwrap_or(raw);
        let raw = raw.strip_suffix('\n').unwrap_or(raw);
        let is_string = properties.is_some_and(|p| p[key.trim()]["type"] == "string");
        let value = match serde_json::from_str::<Value>(raw) {
            Ok(v) if !is_string => v,
            _ => Value::String(raw.to_owned()),
        };
        arguments.insert(key.trim().to_owned(), value);
        rest = &after[end + "</parameter>".len()..];
    }
    rest.trim()
        .strip_prefix("</function>")
        .map(str::trim)
        .filter(|r| r.is_empty())?;
    Some(ToolCall::new(name, &Value::Object(arguments)))
}

#[cfg(test)]
mod tests {
    use super::super::{Format, Item, Parser};
    use super::*;
    use serde_json::json;

    fn call(name: &str, arguments: &str) -> Item {
        Item::Call(ToolCall {
            name: name.into(),
            arguments: arguments.into(),
        })
    }

    fn stream(text: &str, piece: usize, tools: &[Value]) -> Vec<Item> {
        Parser::streamed(Format::Qwen, tools.to_vec(), text, piece)
    }

    #[test]
    fn qwen3_calls_after_text_whatever_the_pieces() {
        // As Qwen3 answers: thinking, a sentence, then two calls on their own lines.
        let text = "<think>\nThe user wants weather.\n</think>\n\nLet me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"unit\": \"celsius\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"get_time\", \"arguments\": {}}\n</tool_call>";
        for piece in [1, 2, 3, 7, 1000] {
            assert_eq!(
                stream(text, piece, &[]),
                vec![
                    Item::Content("<think>\nThe user wants weather.\n</think>\n\nLet me check.".into()),
                    call("get_weather", r#"{"city":"Paris","unit":"celsius"}"#),
                    call("get_time", "{}"),
                ],
                "pieces of {piece}"
            );
        }
    }

    #[test]
    fn plain_answers_and_prose_about_the_tag_stay_content() {
        for text in [
            "Hello there.\n",
            "Use <tool_call> tags, like <tool_call> this.",
            "a <tool_c",
        ] {
            for piece in [1, 4, 100] {
                assert_eq!(stream(text, piece, &[]), vec![Item::Content(text.into())], "{text:?}");
            }
        }
        // A call cut off by max_tokens is given back as text.
        let cut = "<tool_call>\n{\"name\": \"f\", \"argu";
        assert_eq!(stream(cut, 3, &[]), vec![Item::Content(cut.into())]);
    }

    #[test]
    fn a_call_without_its_closing_tag_at_the_end_counts() {
        let text = "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"x\": [1, 2]}}\n";
        assert_eq!(stream(text, 5, &[]), vec![call("f", r#"{"x":[1,2]}"#)]);
    }

    #[test]
    fn qwen35_xml_calls_take_their_types_from_the_schema() {
        let tools = [
            json!({"type": "function", "function": {"name": "search", "parameters": {"type": "object",
            "properties": {"query": {"type": "string"}, "limit": {"type": "integer"}, "filters": {"type": "object"}}}}}),
        ];
        let text = "I'll search.\n\n<tool_call>\n<function=search>\n<parameter=query>\n42\n</parameter>\n<parameter=limit>\n5\n</parameter>\n<parameter=filters>\n{\"lang\": \"fr\"}\n</parameter>\n</function>\n</tool_call>";
        for piece in [1, 6, 1000] {
            assert_eq!(
                stream(text, piece, &tools),
                vec![
                    Item::Content("I'll search.".into()),
                    call("search", r#"{"query":"42","limit":5,"filters":{"lang":"fr"}}"#)
                ]
            );
        }
        let multiline =
            "<tool_call>\n<function=write>\n<parameter=text>\nline 1\nline 2\n</parameter>\n</function>\n</tool_call>";
        assert_eq!(
            stream(multiline, 4, &[]),
            vec![call("write", r#"{"text":"line 1\nline 2"}"#)]
        );
    }

    #[test]
    fn whole_answers_give_null_content_when_there_is_only_a_call() {
        let text = "\n<tool_call>\n{\"name\": \"f\", \"arguments\": \"{\\\"a\\\": 1}\"}\n</tool_call>\n";
        let (content, reasoning, calls) = Parser::whole(Format::Qwen, Vec::new(), text);
        assert_eq!((content, reasoning), (None, None));
        assert_eq!(
            calls,
            vec![ToolCall {
                name: "f".into(),
                arguments: r#"{"a": 1}"#.into()
            }]
        );
    }
}
