//! DeepSeek's calls, in a block of calls:
//! `<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>…<｜tool▁call▁end｜>…<｜tool▁calls▁end｜>`. Each call is, for V3
//! and R1, `function<｜tool▁sep｜>NAME\n```json\n{…}\n```` and, for V3.1 and later, `NAME<｜tool▁sep｜>{…}`.
//! (The bars are U+FF5C and the word separators U+2581, as in DeepSeek's vocabulary.)

use super::{json_prefix, Step, ToolCall};

const CALLS_BEGIN: &str = "<｜tool▁calls▁begin｜>";
const CALLS_END: &str = "<｜tool▁calls▁end｜>";
const CALL_BEGIN: &str = "<｜tool▁call▁begin｜>";
const CALL_END: &str = "<｜tool▁call▁end｜>";
const SEP: &str = "<｜tool▁sep｜>";
pub const MARKERS: &[&str] = &[CALLS_BEGIN, CALLS_END, CALL_BEGIN];

pub fn step(text: &str, at_end: bool) -> Step {
    for wrapper in [CALLS_BEGIN, CALLS_END] {
        if text.starts_with(wrapper) {
            return Step::Skip(wrapper.len());
        }
    }
    let inner = &text[CALL_BEGIN.len()..];
    let (body, len) = match inner.find(CALL_END) {
        Some(at) => (&inner[..at], CALL_BEGIN.len() + at + CALL_END.len()),
        None if at_end => (inner, text.len()),
        None => return Step::Wait,
    };
    match call(body) {
        Some(c) => Step::Calls(vec![c], len),
        None => Step::Text,
    }
}

fn call(body: &str) -> Option<ToolCall> {
    let (left, right) = body.split_once(SEP)?;
    let (name, arguments) = if left.trim() == "function" {
        let (name, rest) = right.split_once('\n')?;
        let rest = rest.trim().strip_prefix("```json")?.trim_start();
        (name, rest.trim_end().strip_suffix("```")?)
    } else {
        (left, right)
    };
    let (value, used) = json_prefix(arguments).ok()?;
    arguments[used..].trim().is_empty().then(|| ToolCall::new(name, &value))
}

#[cfg(test)]
mod tests {
    use super::super::{Format, Parser};
    use super::*;

    fn parse(text: &str) -> (Option<String>, Vec<ToolCall>) {
        let (content, _, calls) = Parser::whole(Format::DeepSeek, Vec::new(), text);
        (content, calls)
    }

    fn call(name: &str, arguments: &str) -> ToolCall {
        ToolCall {
            name: name.into(),
            arguments: arguments.into(),
        }
    }

    #[test]
    fn v3_calls_with_fenced_json() {
        let text = "Checking both.<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n{\"city\": \"Paris\"}\n```<｜tool▁call▁end｜>\n<｜tool▁call▁begin｜>function<｜tool▁sep｜>get_time\n```json\n{}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>";
        assert_eq!(
            parse(text),
            (
                Some("Checking both.".into()),
                vec![call("get_weather", r#"{"city":"Paris"}"#), call("get_time", "{}")]
            )
        );
    }

    #[test]
    fn v31_calls_and_streamed_pieces() {
        let text = "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{\"city\": \"Paris\"}<｜tool▁call▁end｜><｜tool▁calls▁end｜>";
        assert_eq!(parse(text), (None, vec![call("get_weather", r#"{"city":"Paris"}"#)]));
        assert_eq!(
            Parser::streamed(Format::DeepSeek, Vec::new(), text, 1),
            vec![super::super::Item::Call(call("get_weather", r#"{"city":"Paris"}"#))]
        );
    }
}
