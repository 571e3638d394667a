//! Grammars that force a call (`tool_choice` "required" or a named function), in llguidance's Lark dialect
//! for [`Grammars::lark`](crate::constraint::Grammars::lark): the model's own call syntax, with each tool's
//! name spelled out and its arguments held to the tool's `parameters` schema.
//!
//! Qwen's JSON form and gpt-oss's harmony are forced; the others are refused by name (a 400) rather than
//! forced into a syntax the model might not follow.

use serde_json::{json, Value};

use super::Format;
use crate::constraint::json_layout;

/// The grammar for a forced call of one of `tools` (only `named`, when given) in `format`; `parallel`: the
/// answer may hold several calls (where the syntax allows). `Err`: why this format cannot be forced.
pub fn grammar(format: Format, tools: &[Value], named: Option<&str>, parallel: bool) -> Result<String, String> {
    let tools: Vec<(&str, Value)> = tools
        .iter()
        .filter_map(|t| {
            let name = t["function"]["name"].as_str()?;
            let parameters = match &t["function"]["parameters"] {
                Value::Object(p) if !p.is_empty() => Value::Object(p.clone()),
                _ => json!({"type": "object"}),
            };
            named.is_none_or(|n| n == name).then_some((name, parameters))
        })
        .collect();
    let quote = |s: &str| Value::from(s).to_string();
    let mut rules = Vec::new();
    let start = match format {
        // `<tool_call>\n{"name": NAME, "arguments": {…}}\n</tool_call>`, calls a line apart.
        Format::Qwen => {
            for (i, (name, parameters)) in tools.iter().enumerate() {
                let call = json_layout(&json!({
                    "type": "object",
                    "properties": {"name": {"const": name}, "arguments": parameters},
                    "required": ["name", "arguments"],
                    "additionalProperties": false,
                }));
                rules.push(format!("f{i}: %json{call}"));
            }
            let more = if parallel { " (\"\\n\" call)*" } else { "" };
            rules.push(format!(
                "call: \"<tool_call>\\n\" ({}) \"\\n</tool_call>\"",
                alternatives(tools.len())
            ));
            format!("start: call{more}")
        }
        // After the prompt's `<|start|>assistant`, as the template writes a past call: the recipient in the
        // role part, then the commentary channel and the arguments. One call: a second is another message.
        Format::Harmony => {
            for (i, (name, parameters)) in tools.iter().enumerate() {
                let header = quote(&format!("{name}<|channel|>commentary json<|message|>"));
                rules.push(format!("f{i}: {header} %json{}", json_layout(parameters)));
            }
            format!("start: \" to=functions.\" ({})", alternatives(tools.len()))
        }
        Format::QwenXml | Format::DeepSeek | Format::Mistral => {
            return Err(format!(
                "forcing a call in {}'s syntax is not supported yet (only Qwen's JSON <tool_call> and gpt-oss \
                 harmony are); send tool_choice \"auto\"",
                format.name()
            ))
        }
    };
    Ok(std::iter::once(start).chain(rules).collect::<Vec<_>>().join("\n"))
}

fn alternatives(n: usize) -> String {
    (0..n).map(|i| format!("f{i}")).collect::<Vec<_>>().join(" | ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn qwen_grammar_names_each_tool_and_holds_its_schema() {
        let tools = [
            json!({"type": "function", "function": {"name": "a", "parameters": {"type": "object", "properties": {"x": {"type": "integer"}}}}}),
            json!({"type": "function", "function": {"name": "b"}}),
        ];
        let g = grammar(Format::Qwen, &tools, None, true).unwrap();
        assert!(g.starts_with("start: call (\"\\n\" call)*\n"), "{g}");
        assert!(
            g.contains(r#""name":{"const":"a"}"#) && g.contains(r#""x":{"type":"integer"}"#),
            "{g}"
        );
        assert!(
            g.contains("call: \"<tool_call>\\n\" (f0 | f1) \"\\n</tool_call>\""),
            "{g}"
        );
        let named = grammar(Format::Qwen, &tools, Some("b"), false).unwrap();
        assert!(
            named.starts_with("start: call\n") && !named.contains("\"a\""),
            "{named}"
        );
        let harmony = grammar(Format::Harmony, &tools, Some("a"), true).unwrap();
        assert!(
            harmony
                .starts_with("start: \" to=functions.\" (f0)\nf0: \"a<|channel|>commentary json<|message|>\" %json{"),
            "{harmony}"
        );
        assert!(grammar(Format::Mistral, &tools, None, true)
            .unwrap_err()
            .contains("not supported yet"));
    }
}
