//! gpt-oss's harmony format. The answer is a series of messages, each a header and a body:
//! `<|channel|>analysis<|message|>…<|end|>`, then `<|start|>assistant<|channel|>final<|message|>…<|return|>`
//! for an answer, or for a call `<|start|>assistant<|channel|>commentary to=functions.NAME <|constrain|>json<|message|>{…}<|call|>`.
//! The recipient (`to=functions.NAME`) may also stand in the role part of the header
//! (`<|start|>assistant to=functions.NAME<|channel|>commentary json<|message|>`), and so right at the start
//! of the answer, after the prompt's `<|start|>assistant`. The analysis channel is the model's reasoning;
//! the other channels' text is content.

use super::{json_prefix, Step, ToolCall};

const MESSAGE: &str = "<|message|>";
/// What ends a message's body. `<|call|>` and `<|return|>` are end-of-generation tokens, so the last body
/// usually ends with the text instead.
const ENDS: &[&str] = &["<|end|>", "<|call|>", "<|return|>"];
pub const MARKERS: &[&str] = &["<|start|>", "<|channel|>", " to=functions."];

pub fn step(text: &str, at_end: bool) -> Step {
    let Some(header_len) = text.find(MESSAGE) else {
        // A header is a few words; a long text without `<|message|>` is not one.
        return if at_end || text.len() > 256 {
            Step::Text
        } else {
            Step::Wait
        };
    };
    let header = &text[..header_len];
    let body_at = header_len + MESSAGE.len();
    let recipient = header
        .split_once("to=")
        .map(|(_, r)| r.split(|c: char| c.is_whitespace() || c == '<').next().unwrap_or(""));
    let channel = header
        .split_once("<|channel|>")
        .map(|(_, c)| c.split(|c: char| c.is_whitespace() || c == '<').next().unwrap_or(""));
    let Some(name) = recipient.and_then(|r| r.strip_prefix("functions.")) else {
        return Step::Body {
            len: body_at,
            reasoning: channel == Some("analysis"),
            ends: ENDS,
        };
    };
    let body = &text[body_at..];
    let (arguments, len) = match ENDS.iter().filter_map(|e| body.find(e).map(|at| (at, e.len()))).min() {
        Some((at, end)) => (&body[..at], body_at + at + end),
        None if at_end => (body, text.len()),
        None => return Step::Wait,
    };
    match json_prefix(arguments) {
        Ok((value, used)) if arguments[used..].trim().is_empty() => Step::Calls(vec![ToolCall::new(name, &value)], len),
        _ => Step::Text,
    }
}

#[cfg(test)]
mod tests {
    use super::super::{Format, Item, Parser};
    use super::*;

    fn items(text: &str, piece: usize) -> Vec<Item> {
        let mut parser = Parser::new(Format::Harmony, Vec::new());
        let chars: Vec<char> = text.chars().collect();
        let mut out: Vec<Item> = Vec::new();
        let pieces = chars
            .chunks(piece)
            .map(|c| parser.push(&c.iter().collect::<String>()))
            .collect::<Vec<_>>();
        for item in pieces.into_iter().flatten().chain(parser.finish()) {
            match (out.last_mut(), item) {
                (Some(Item::Content(a)), Item::Content(b)) | (Some(Item::Reasoning(a)), Item::Reasoning(b)) => {
                    a.push_str(&b)
                }
                (_, item) => out.push(item),
            }
        }
        out
    }

    fn call(name: &str, arguments: &str) -> Item {
        Item::Call(ToolCall {
            name: name.into(),
            arguments: arguments.into(),
        })
    }

    #[test]
    fn analysis_then_a_call_on_the_commentary_channel() {
        // As gpt-oss writes it after the prompt's `<|start|>assistant`; the call ends with `<|call|>`, or
        // with the text when that token stopped generation.
        let text = "<|channel|>analysis<|message|>Need weather for Paris.<|end|><|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{\"city\":\"Paris\"}<|call|>";
        for piece in [1, 5, 1000] {
            let want = vec![
                Item::Reasoning("Need weather for Paris.".into()),
                call("get_weather", r#"{"city":"Paris"}"#),
            ];
            assert_eq!(items(text, piece), want, "pieces of {piece}");
            assert_eq!(items(text.strip_suffix("<|call|>").unwrap(), piece), want);
        }
    }

    #[test]
    fn the_recipient_in_the_role_part_of_the_header() {
        let text = " to=functions.lookup<|channel|>commentary json<|message|>{\"q\": \"x\"}";
        assert_eq!(items(text, 3), vec![call("lookup", r#"{"q":"x"}"#)]);
        let later = "<|channel|>analysis<|message|>hm<|end|><|start|>assistant to=functions.lookup<|channel|>commentary <|constrain|>json<|message|>{}<|call|>";
        assert_eq!(
            items(later, 2),
            vec![Item::Reasoning("hm".into()), call("lookup", "{}")]
        );
    }

    #[test]
    fn a_final_answer_is_content() {
        let text = "<|channel|>analysis<|message|>Simple.<|end|><|start|>assistant<|channel|>final<|message|>It is 4.<|return|>";
        for piece in [1, 4, 1000] {
            assert_eq!(
                items(text, piece),
                vec![Item::Reasoning("Simple.".into()), Item::Content("It is 4.".into())]
            );
        }
        let (content, reasoning, calls) = Parser::whole(Format::Harmony, Vec::new(), text);
        assert_eq!(
            (content.as_deref(), reasoning.as_deref(), calls.len()),
            (Some("It is 4."), Some("Simple."), 0)
        );
    }

    #[test]
    fn arguments_that_are_not_json_stay_text() {
        let text = "<|channel|>commentary to=functions.f json<|message|>{oops<|call|>";
        let (content, _, calls) = Parser::whole(Format::Harmony, Vec::new(), text);
        assert!(calls.is_empty());
        assert!(content.is_some_and(|c| c.contains("{oops")));
    }
}
