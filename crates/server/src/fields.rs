//! Which request fields the server takes beyond those its request types read. A field it does not implement
//! is refused (400, naming it) rather than ignored, so that a client never believes it got what it asked
//! for; the fields clients send as a matter of course that change nothing here are accepted.

use serde_json::{Map, Value};

use crate::api::Kind;
use crate::error::ApiError;

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
    /// Replaced by another field of the API.
    Legacy(&'static str),
    /// An OpenAI field this server has no plan for.
    NotSupported,
    /// Not a field of the endpoint at all (often a misspelling).
    Unknown,
}

/// Whether `name: value`, sent to the `kind` endpoint and not read by its request type, is refused, and why.
/// A value that asks for nothing (null, an empty list of tools) is accepted whatever the field.
fn refusal(kind: Kind, name: &str, value: &Value) -> Option<Refused> {
    if IGNORED.contains(&name) {
        return None;
    }
    let asks_nothing = match (name, value) {
        (_, Value::Null) => true,
        ("functions", Value::Array(a)) => a.is_empty(),
        ("function_call", Value::String(s)) => s == "none",
        ("modalities", Value::Array(a)) => a.len() == 1 && a[0] == "text",
        ("best_of", v) => v.as_u64() == Some(1),
        ("suffix", Value::String(s)) => s.is_empty(),
        _ => false,
    };
    match (kind, name) {
        _ if asks_nothing => None,
        (Kind::Chat, "functions") => Some(Refused::Legacy("tools")),
        (Kind::Chat, "function_call") => Some(Refused::Legacy("tool_choice")),
        (
            Kind::Chat,
            "audio" | "modalities" | "prediction" | "reasoning_effort" | "verbosity" | "web_search_options",
        )
        | (Kind::Completion, "best_of" | "suffix") => Some(Refused::NotSupported),
        _ => Some(Refused::Unknown),
    }
}

/// Checks the fields of a `kind` request that its type did not read (`rest`): a 400 naming each one refused.
pub fn check(kind: Kind, rest: &Map<String, Value>) -> Result<(), ApiError> {
    let refused: Vec<(&String, Refused)> = rest
        .iter()
        .filter_map(|(name, value)| refusal(kind, name, value).map(|r| (name, r)))
        .collect();
    let Some((first, why)) = refused.first() else {
        return Ok(());
    };
    let reasons: Vec<String> = refused
        .iter()
        .map(|(name, why)| match why {
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

    fn check_json(kind: Kind, v: Value) -> Result<(), String> {
        check(kind, v.as_object().unwrap()).map_err(|e| e.message)
    }

    #[test]
    fn harmless_fields_and_empty_values_are_taken() {
        for v in [
            json!({"user": "u1", "metadata": {"a": "b"}, "store": false, "service_tier": "auto"}),
            json!({"functions": [], "function_call": "none"}),
            json!({"functions": null, "modalities": ["text"], "audio": null}),
        ] {
            assert_eq!(check_json(Kind::Chat, v.clone()), Ok(()), "{v}");
        }
        assert_eq!(
            check_json(Kind::Completion, json!({"best_of": 1, "suffix": "", "user": "u"})),
            Ok(())
        );
    }

    #[test]
    fn unimplemented_and_unknown_fields_are_named() {
        let functions = json!({"functions": [{"name": "f"}]});
        let e = check(Kind::Chat, functions.as_object().unwrap()).unwrap_err();
        assert_eq!(e.status, 400);
        assert!(
            e.message
                .starts_with("functions is OpenAI's deprecated form; send tools"),
            "{}",
            e.message
        );
        assert_eq!(e.body()["error"]["param"], "functions");
        assert_eq!(e.body()["error"]["code"], "unsupported_parameter");
        let e = check(Kind::Completion, json!({"temprature": 0.5}).as_object().unwrap()).unwrap_err();
        assert!(
            e.message
                .starts_with("\"temprature\" is not a field this endpoint takes"),
            "{}",
            e.message
        );
        assert_eq!(e.body()["error"]["code"], "unknown_parameter");
        // Chat's fields are unknown to completions; every refused field is named.
        let both = check_json(Kind::Completion, json!({"messages": [], "best_of": 3})).unwrap_err();
        assert!(
            both.contains("best_of is not supported") && both.contains("\"messages\""),
            "{both}"
        );
    }
}
