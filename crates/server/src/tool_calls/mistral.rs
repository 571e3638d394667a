//! Mistral's calls, after the `[TOOL_CALLS]` token: a JSON list `[{"name": …, "arguments": {…}}, …]`
//! (Mistral 7B v0.3, Nemo, Small up to 3.1), or one call per marker as `NAME[ARGS]{…}` (Small 3.2,
//! Devstral, Magistral), where `[CALL_ID]ID` may stand between the name and `[ARGS]`.

use serde_json::Value;

use super::{json_prefix, Step, ToolCall};

const TOOL_CALLS: &str = "[TOOL_CALLS]";
const ARGS: &str = "[ARGS]";
pub const MARKERS: &[&str] = &[TOOL_CALLS];

pub fn step(text: &str, at_end: bool) -> Step {
    let after = &text[TOOL_CALLS.len()..];
    let rest = after.trim_start();
    let skipped = TOOL_CALLS.len() + after.len() - rest.len();
    if rest.is_empty() {
        return if at_end { Step::Text } else { Step::Wait };
    }
    if rest.starts_with('[') {
        return match json_prefix(rest) {
            Ok((Value::Array(calls), used)) => {
                let calls: Option<Vec<ToolCall>> = calls
                    .iter()
                    .map(|c| {
                        Some(ToolCall::new(
                            c.get("name")?.as_str()?,
                            c.get("arguments").unwrap_or(&Value::Null),
                        ))
                    })
                    .collect();
                match calls {
                    Some(calls) => Step::Calls(calls, skipped + used),
                    None => Step::Text,
                }
            }
            Err(true) if !at_end => Step::Wait,
            _ => Step::Text,
        };
    }
    let Some(args_at) = rest.find(ARGS) else {
        // A function name is one word.
        return if at_end || rest.contains(char::is_whitespace) {
            Step::Text
        } else {
            Step::Wait
        };
    };
    let name = rest[..args_at].split("[CALL_ID]").next().unwrap_or("");
    let arguments = &rest[args_at + ARGS.len()..];
    match json_prefix(arguments) {
        Ok((value, used)) => Step::Calls(vec![ToolCall::new(name, &value)], skipped + args_at + ARGS.len() + used),
        Err(true) if !at_end => Step::Wait,
        _ => Step::Text,
    }
}

#[cfg(test)]
mod tests {
    use super::super::{Format, Parser};
    use super::*;

    fn call(name: &str, arguments: &str) -> ToolCall {
        ToolCall {
            name: name.into(),
            arguments: arguments.into(),
        }
    }

    #[test]
    fn a_list_of_calls() {
        let text = "[TOOL_CALLS][{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}, {\"name\": \"get_time\", \"arguments\": {}}]";
        let (content, _, calls) = Parser::whole(Format::Mistral, Vec::new(), text);
        assert_eq!(content, None);
        assert_eq!(
            calls,
            vec![call("get_weather", r#"{"city":"Paris"}"#), call("get_time", "{}")]
        );
    }

    #[test]
    fn name_then_args_calls_streamed() {
        let text =
            "Sure.[TOOL_CALLS]get_weather[ARGS]{\"city\": \"Paris\"}[TOOL_CALLS]get_time[CALL_ID]abc123456[ARGS]{}";
        use super::super::Item;
        let merged = Parser::streamed(Format::Mistral, Vec::new(), text, 1);
        assert_eq!(
            merged,
            vec![
                Item::Content("Sure.".into()),
                Item::Call(call("get_weather", r#"{"city":"Paris"}"#)),
                Item::Call(call("get_time", "{}"))
            ]
        );
    }
}
