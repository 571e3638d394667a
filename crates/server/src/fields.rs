//! Which request fields the server takes beyond those its request types read. A field it does not implement
//! is refused (400, naming it) rather than ignored, so that a client never believes it got what it asked
//! for; the fields clients send as a matter of course that change nothing here are accepted.

use serde_json::{Map, Value};

use crate::error::ApiError;

/// The endpoint a request was sent to: each takes its own fields.
#[derive(Clone, Copy)]
pub enum Endpoint {
    Completions,
    Chat,
    Responses,
}

/// Accepted and ignored: bookkeeping for the caller or for OpenAI's own platform, with no effect on the text.
const IGNORED: &[&str] = &[
    "user",
    "metadata",
    "store",
    "service_tier",
    "prompt_cache_key",
    "prompt_cache_retention",
    "safety_identifier",
];

/// Why a field the request types did not read is refused.
enum Refused {
    /// Planned for the Responses API: its tool calls and text formats. To lift one, read the field in
    /// `ResponsesRequest` (responses.rs) and take its arm out of [`refusal`].
    NotYet(&'static str),
    /// Replaced by another field of the API.
    Legacy(&'static str),
    /// An OpenAI field this server has no plan for.
    NotSupported,
    /// Not a field of the endpoint at all (often a misspelling).
    Unknown,
}

/// Whether `name: value`, sent to the `endpoint` and not read by its request type, is refused, and why.
/// A value that asks for nothing (null, an empty list of tools, plain text as the Responses text format) is
/// accepted whatever the field.
fn refusal(endpoint: Endpoint, name: &str, value: &Value) -> Option<Refused> {
    if IGNORED.contains(&name) {
        return None;
    }
    // The Responses API's own fields ask for nothing only there; elsewhere they are unknown.
    let responses = matches!(endpoint, Endpoint::Responses);
    let asks_nothing = match (name, value) {
        (_, Value::Null) => true,
        ("functions", Value::Array(a)) => a.is_empty(),
        ("function_call", Value::String(s)) => s == "none",
        ("tools", Value::Array(a)) if responses => a.is_empty(),
        ("tool_choice", Value::String(s)) if responses => s == "none",
        // `{"format": {"type": "text"}}`, or no format.
        ("text", v) if responses => v.as_object().is_some_and(|o| {
            o.iter()
                .all(|(k, f)| k == "format" && (f.is_null() || is_plain_text(f)))
        }),
        ("include", Value::Array(a)) if responses => a.is_empty(),
        ("truncation", Value::String(s)) if responses => s == "disabled",
        ("modalities", Value::Array(a)) => a.len() == 1 && a[0] == "text",
        ("best_of", v) => v.as_u64() == Some(1),
        ("suffix", Value::String(s)) => s.is_empty(),
        _ => false,
    };
    use Endpoint::*;
    match (endpoint, name) {
        // Meaningless without tools, which the Responses API refuses when there are any.
        (Responses, "parallel_tool_calls") => None,
        _ if asks_nothing => None,
        (Chat, "functions") => Some(Refused::Legacy("tools")),
        (Chat, "function_call") => Some(Refused::Legacy("tool_choice")),
        (Responses, "tools" | "tool_choice") => Some(Refused::NotYet("tool calls")),
        (Responses, "text") => Some(Refused::NotYet(
            "structured output; only {\"format\": {\"type\": \"text\"}} is taken",
        )),
        (Chat, "audio" | "modalities" | "prediction" | "reasoning_effort" | "verbosity" | "web_search_options")
        | (Completions, "best_of" | "suffix")
        | (
            Responses,
            "background" | "conversation" | "include" | "max_tool_calls" | "prompt" | "reasoning" | "stream_options"
            | "top_logprobs" | "truncation",
        ) => Some(Refused::NotSupported),
        _ => Some(Refused::Unknown),
    }
}

/// `{"type": "text"}`, and nothing else: a format that asks for plain text.
fn is_plain_text(v: &Value) -> bool {
    v.get("type").and_then(Value::as_str) == Some("text") && v.as_object().map_or(0, Map::len) == 1
}

/// Checks the fields of a request to `endpoint` that its type did not read (`rest`): a 400 naming each one
/// refused.
pub fn check(endpoint: Endpoint, rest: &Map<String, Value>) -> Result<(), ApiError> {
    let refused: Vec<(&String, Refused)> = rest
        .iter()
        .filter_map(|(name, value)| refusal(endpoint, name, value).map(|r| (name, r)))
        .collect();
    let Some((first, why)) = refused.first() else {
        return Ok(());
    };
    let reasons: Vec<String> = refused
        .iter()
        .map(|(name, why)| match why {
            Refused::NotYet(what) => format!("{name} is not supported yet ({what})"),
            Refused::Legacy(instead) => format!("{name} is OpenAI's deprecated form; send {instead}"),
            Refused::NotSupported => format!("{name} is not supported by this server"),
            Refused::Unknown => format!("{name:?} is not a field this endpoint takes"),
        })
        .collect();
    let code = match why {
        Refused::Unknown => "unknown_parameter",
        _ => "unsupported_parameter",
    };
    Err(ApiError::bad_request(format!(
        "{}: leave it out (this server refuses what it does not implement rather than ignore it)",
        reasons.join("; ")
    ))
    .param(first.to_string())
    .code(code))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn check_json(endpoint: Endpoint, v: Value) -> Result<(), String> {
        check(endpoint, v.as_object().unwrap()).map_err(|e| e.message)
    }

    #[test]
    fn harmless_fields_and_empty_values_are_taken() {
        for v in [
            json!({"user": "u1", "metadata": {"a": "b"}, "store": false, "service_tier": "auto"}),
            json!({"functions": [], "function_call": "none"}),
            json!({"functions": null, "modalities": ["text"], "audio": null}),
        ] {
            assert_eq!(check_json(Endpoint::Chat, v.clone()), Ok(()), "{v}");
        }
        assert_eq!(
            check_json(Endpoint::Completions, json!({"best_of": 1, "suffix": "", "user": "u"})),
            Ok(())
        );
    }

    #[test]
    fn unimplemented_and_unknown_fields_are_named() {
        let functions = json!({"functions": [{"name": "f"}]});
        let e = check(Endpoint::Chat, functions.as_object().unwrap()).unwrap_err();
        assert_eq!(e.status, 400);
        assert!(
            e.message
                .starts_with("functions is OpenAI's deprecated form; send tools"),
            "{}",
            e.message
        );
        assert_eq!(e.body()["error"]["param"], "functions");
        assert_eq!(e.body()["error"]["code"], "unsupported_parameter");
        let e = check(Endpoint::Completions, json!({"temprature": 0.5}).as_object().unwrap()).unwrap_err();
        assert!(
            e.message
                .starts_with("\"temprature\" is not a field this endpoint takes"),
            "{}",
            e.message
        );
        assert_eq!(e.body()["error"]["code"], "unknown_parameter");
        // Chat's fields are unknown to completions; every refused field is named.
        let both = check_json(Endpoint::Completions, json!({"messages": [], "best_of": 3})).unwrap_err();
        assert!(
            both.contains("best_of is not supported") && both.contains("\"messages\""),
            "{both}"
        );
        // The Responses API's empty values are its own: unknown fields elsewhere.
        let empty = json!({"tools": [], "text": {"format": {"type": "text"}}, "truncation": "disabled"});
        assert_eq!(check_json(Endpoint::Responses, empty.clone()), Ok(()));
        let e = check_json(Endpoint::Completions, empty).unwrap_err();
        assert!(
            e.contains("\"tools\" is not a field") && e.contains("\"truncation\""),
            "{e}"
        );
    }
}
