//! OpenAI's Responses API (`POST /v1/responses`): its request read into a conversation for the chat
//! template and into the chat endpoint's sampling [`Params`], and the response object and its stream of
//! typed events built from the engine's output.
//!
//! Text goes in and out. Tool calls will take two places here: input items of type `function_call` and
//! `function_call_output` in [`input_item`] (refused until then), and `function_call` output items beside
//! the message in [`Reply::output`] (each with its own `output_index` in the stream).

use serde::Deserialize;
use serde_json::{json, Map, Value};
use titan_engine::SamplerOptions;

use crate::api::{from_json, Params};
use crate::error::ApiError;
use crate::fields::{self, Endpoint};
use crate::scheduler::{Finish, Usage};
use crate::template::Message;

#[derive(Deserialize)]
pub struct ResponsesRequest {
    #[serde(default)]
    pub model: Option<String>,
    /// A string (one user message) or a list of input items.
    pub input: Value,
    /// A system message placed before `input`.
    #[serde(default)]
    pub instructions: Option<String>,
    #[serde(default)]
    pub max_output_tokens: Option<i64>,
    #[serde(default)]
    pub temperature: Option<f32>,
    #[serde(default)]
    pub top_p: Option<f32>,
    /// None: a random one, given back in the response (as the chat endpoint).
    #[serde(default)]
    pub seed: Option<u64>,
    #[serde(default)]
    pub stream: Option<bool>,
    /// Refused: nothing is stored, so there is no earlier response to continue.
    #[serde(default)]
    pub previous_response_id: Option<String>,
    // Taken and given back in the response object, as OpenAI's.
    #[serde(default)]
    pub metadata: Option<Value>,
    #[serde(default)]
    pub user: Option<String>,
    #[serde(default)]
    pub parallel_tool_calls: Option<bool>,
    #[serde(default)]
    pub tool_choice: Option<Value>,
    /// The fields none of the above read: checked by [`crate::fields::check`].
    #[serde(flatten)]
    pub rest: Map<String, Value>,
}

impl ResponsesRequest {
    /// The request's model, length and sampling fields as the chat endpoint takes them.
    pub fn params(&self) -> Params {
        Params {
            model: self.model.clone(),
            max_tokens: self.max_output_tokens,
            temperature: self.temperature,
            top_p: self.top_p,
            seed: self.seed,
            stream: self.stream.unwrap_or(false),
            ..Params::default()
        }
    }
}

/// A `/v1/responses` body: the request and the conversation it asks the model to continue.
pub fn responses_body(body: &[u8]) -> Result<(ResponsesRequest, Vec<Message>), ApiError> {
    let r: ResponsesRequest = from_json(body)?;
    fields::check(Endpoint::Responses, &r.rest)?;
    // `tool_choice` is read to be given back; what it asks for is checked with the other fields.
    if let Some(choice) = &r.tool_choice {
        fields::check(
            Endpoint::Responses,
            &Map::from_iter([("tool_choice".into(), choice.clone())]),
        )?;
    }
    if r.previous_response_id.is_some() {
        return Err(ApiError::bad_request(
            "previous_response_id is not supported: this server stores no responses; send the whole conversation in input",
        )
        .param("previous_response_id")
        .code("unsupported_parameter"));
    }
    let messages = conversation(r.instructions.as_deref(), &r.input)?;
    Ok((r, messages))
}

/// The messages of `instructions` (a system message, first) and `input`.
fn conversation(instructions: Option<&str>, input: &Value) -> Result<Vec<Message>, ApiError> {
    let mut messages: Vec<Message> = instructions.map(|i| Message::text("system", i)).into_iter().collect();
    match input {
        Value::String(s) => messages.push(Message::text("user", s.clone())),
        Value::Array(items) if items.is_empty() => {
            return Err(ApiError::bad_request("input is an empty list").param("input"))
        }
        Value::Array(items) => {
            for (i, item) in items.iter().enumerate() {
                messages.push(input_item(i, item)?);
            }
        }
        _ => return Err(ApiError::bad_request("input must be a string or a list of input items").param("input")),
    }
    Ok(messages)
}

/// One item of `input`, which must be a message for now.
fn input_item(i: usize, item: &Value) -> Result<Message, ApiError> {
    let param = format!("input[{i}]");
    match item.get("type").and_then(Value::as_str) {
        // The SDK's short form of a message has no type.
        None | Some("message") => {
            message(item).map_err(|why| ApiError::bad_request(format!("{param}: {why}")).param(param))
        }
        // The model's calls and their results, given back by an agent: they become the template's tool
        // markup once the chat endpoint renders tool calls.
        Some(kind @ ("function_call" | "function_call_output")) => Err(ApiError::bad_request(format!(
            "{param} is a {kind} item: tool calls are not supported yet"
        ))
        .param(param)
        .code("unsupported_parameter")),
        Some(kind) => {
            Err(ApiError::bad_request(format!("{param} is a {kind:?} item; only messages are supported")).param(param))
        }
    }
}

/// A message item: its role and its text (a string, or text parts joined).
fn message(item: &Value) -> Result<Message, String> {
    let role = match item.get("role").and_then(Value::as_str) {
        Some(r @ ("user" | "system" | "assistant")) => r,
        // OpenAI's name for the system role of its newer models; chat templates know `system`.
        Some("developer") => "system",
        Some(r) => return Err(format!("role {r:?} is not one of user, system, developer, assistant")),
        None => return Err("a message needs a role".into()),
    };
    let content = match item.get("content") {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Array(parts)) => parts
            .iter()
            .map(|p| {
                match (
                    p.get("type").and_then(Value::as_str),
                    p.get("text").and_then(Value::as_str),
                ) {
                    (Some("input_text" | "output_text"), Some(t)) => Ok(t),
                    (kind, _) => Err(format!(
                        "content part of type {:?}: only input_text and output_text parts are supported",
                        kind.unwrap_or("(none)")
                    )),
                }
            })
            .collect::<Result<Vec<_>, _>>()?
            .concat(),
        _ => return Err("content must be a string or a list of text parts".into()),
    };
    Ok(Message::text(role, content))
}

/// The response object of one request, at each stage of its life.
pub struct Reply {
    id: String,
    /// The id of the one output message.
    item_id: String,
    created_at: u64,
    model: String,
    seed: u64,
    /// What the response object gives back of the request and the settings it ran with.
    echo: Value,
}

impl Reply {
    /// `id`: unique to the request; `sampler`: the settings it runs with (the seed chosen, if it gave none).
    pub fn new(r: &ResponsesRequest, id: &str, model: String, created_at: u64, sampler: &SamplerOptions) -> Reply {
        Reply {
            id: format!("resp_{id}"),
            item_id: format!("msg_{id}"),
            created_at,
            model,
            seed: sampler.seed,
            echo: json!({
                "instructions": r.instructions,
                "max_output_tokens": r.max_output_tokens,
                "metadata": r.metadata.clone().unwrap_or_else(|| json!({})),
                "parallel_tool_calls": r.parallel_tool_calls.unwrap_or(true),
                "previous_response_id": null,
                "temperature": decimal(sampler.temperature),
                "top_p": decimal(sampler.top_p),
                "text": {"format": {"type": "text"}},
                "tool_choice": r.tool_choice.clone().unwrap_or_else(|| json!("auto")),
                "tools": [],
                "truncation": "disabled",
                "user": r.user,
                // Accepted either way; nothing is kept once the response is sent.
                "store": false,
            }),
        }
    }

    /// The response object: `status`, the `output` items, `usage` once known, and why it is incomplete or
    /// failed.
    fn object(&self, status: &str, output: Vec<Value>, usage: Option<Usage>, details: Value, error: Value) -> Value {
        let mut v = json!({
            "id": self.id,
            "object": "response",
            "created_at": self.created_at,
            "status": status,
            "error": error,
            "incomplete_details": details,
            "model": self.model,
            "output": output,
            "usage": usage.map(usage_json),
            "seed": self.seed,
        });
        if let (Some(v), Some(echo)) = (v.as_object_mut(), self.echo.as_object()) {
            v.extend(echo.clone());
        }
        v
    }

    /// The output message: `text`, or no content part before the first token.
    fn message(&self, status: &str, text: Option<&str>) -> Value {
        json!({
            "type": "message",
            "id": self.item_id,
            "status": status,
            "role": "assistant",
            "content": text.map(text_part).into_iter().collect::<Vec<_>>(),
        })
    }

    /// The output items of a finished (or failed) response. Function calls will follow the message.
    fn output(&self, status: &str, text: &str) -> Vec<Value> {
        vec![self.message(status, Some(text))]
    }

    /// The whole response of a request that was not streamed.
    pub fn whole(&self, text: &str, finish: Finish, usage: Usage) -> Value {
        let (status, details) = ending(finish);
        self.object(status, self.output(status, text), Some(usage), details, Value::Null)
    }
}

/// A sampler value as the client wrote it: the f32's shortest decimal (0.95), not its widening to f64
/// (0.949999988079071).
fn decimal(x: f32) -> Value {
    x.to_string().parse::<f64>().map_or(Value::Null, Value::from)
}

fn text_part(text: &str) -> Value {
    json!({"type": "output_text", "text": text, "annotations": []})
}

/// The status of a response that ended so, and why it is incomplete. A context that filled up counts as the
/// length limit: the room the prompt leaves is the default `max_output_tokens`.
fn ending(finish: Finish) -> (&'static str, Value) {
    match finish {
        Finish::Stop => ("completed", Value::Null),
        Finish::Length => ("incomplete", json!({"reason": "max_output_tokens"})),
    }
}

fn usage_json(u: Usage) -> Value {
    json!({
        "input_tokens": u.prompt,
        "input_tokens_details": {"cached_tokens": u.cached},
        "output_tokens": u.completion,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": u.prompt + u.completion,
    })
}

/// The server-sent events of a streamed response, in the order the official client expects: the response
/// created and in progress, the message and its text part added, a delta per piece of text, the text, part
/// and message done, and the response completed (or incomplete, or failed). Each is (name, data).
pub struct Events {
    reply: Reply,
    sequence: u64,
    text: String,
}

pub type Named = (&'static str, Value);

impl Events {
    pub fn new(reply: Reply) -> Events {
        Events {
            reply,
            sequence: 0,
            text: String::new(),
        }
    }

    /// An event `name` with `fields`, its type and its sequence number.
    fn event(&mut self, name: &'static str, fields: Value) -> Named {
        let mut v = json!({"type": name, "sequence_number": self.sequence});
        self.sequence += 1;
        if let (Some(v), Value::Object(f)) = (v.as_object_mut(), fields) {
            v.extend(f);
        }
        (name, v)
    }

    /// Where the text goes: the one message's one part.
    fn place(&self) -> Value {
        json!({"item_id": self.reply.item_id, "output_index": 0, "content_index": 0})
    }

    fn with(mut a: Value, b: Value) -> Value {
        if let (Some(a), Value::Object(b)) = (a.as_object_mut(), b) {
            a.extend(b);
        }
        a
    }

    pub fn start(&mut self) -> Vec<Named> {
        let r = &self.reply;
        let open = r.object("in_progress", Vec::new(), None, Value::Null, Value::Null);
        let item = r.message("in_progress", None);
        let part = Self::with(self.place(), json!({"part": text_part("")}));
        vec![
            self.event("response.created", json!({"response": open})),
            self.event("response.in_progress", json!({"response": open})),
            self.event("response.output_item.added", json!({"output_index": 0, "item": item})),
            self.event("response.content_part.added", part),
        ]
    }

    pub fn delta(&mut self, text: &str) -> Named {
        self.text.push_str(text);
        let fields = Self::with(self.place(), json!({"delta": text, "logprobs": []}));
        self.event("response.output_text.delta", fields)
    }

    pub fn done(&mut self, finish: Finish, usage: Usage) -> Vec<Named> {
        let (status, _) = ending(finish);
        let text = std::mem::take(&mut self.text);
        let done = Self::with(self.place(), json!({"text": text, "logprobs": []}));
        let part = Self::with(self.place(), json!({"part": text_part(&text)}));
        let item = self.reply.message(status, Some(&text));
        let whole = self.reply.whole(&text, finish, usage);
        let last = if status == "completed" {
            "response.completed"
        } else {
            "response.incomplete"
        };
        vec![
            self.event("response.output_text.done", done),
            self.event("response.content_part.done", part),
            self.event("response.output_item.done", json!({"output_index": 0, "item": item})),
            self.event(last, json!({"response": whole})),
        ]
    }

    /// The engine failed `why` partway: the response failed, with the text so far.
    pub fn failed(&mut self, why: &str) -> Named {
        let r = &self.reply;
        let error = json!({"code": "server_error", "message": why});
        let failed = r.object("failed", r.output("incomplete", &self.text), None, Value::Null, error);
        self.event("response.failed", json!({"response": failed}))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn body(v: Value) -> Result<Vec<(String, String)>, ApiError> {
        responses_body(v.to_string().as_bytes()).map(|(_, m)| m.into_iter().map(|m| (m.role, m.content)).collect())
    }

    fn pairs(p: &[(&str, &str)]) -> Vec<(String, String)> {
        p.iter().map(|&(r, c)| (r.to_string(), c.to_string())).collect()
    }

    #[test]
    fn input_becomes_the_conversation_after_the_instructions() {
        let m = body(json!({"input": "Hi", "instructions": "Be brief."})).unwrap();
        assert_eq!(m, pairs(&[("system", "Be brief."), ("user", "Hi")]));
        let m = body(json!({"input": [
            {"role": "developer", "content": "Rules."},
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "a"}, {"type": "input_text", "text": "b"}]},
            {"role": "assistant", "content": [{"type": "output_text", "text": "c", "annotations": []}]},
        ]}))
        .unwrap();
        assert_eq!(m, pairs(&[("system", "Rules."), ("user", "ab"), ("assistant", "c")]));
    }

    #[test]
    fn bad_input_is_a_400_naming_the_item() {
        for (v, says) in [
            (json!({"input": []}), "input is an empty list"),
            (json!({"input": 3}), "input must be a string"),
            (json!({}), "missing field `input`"),
            (
                json!({"input": [{"role": "tool", "content": "x"}]}),
                "input[0]: role \"tool\"",
            ),
            (
                json!({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "u"}]}]}),
                "input_image",
            ),
            (
                json!({"input": [{"type": "function_call_output", "call_id": "c", "output": "4"}]}),
                "tool calls are not supported yet",
            ),
            (
                json!({"input": [{"type": "reasoning", "summary": []}]}),
                "only messages",
            ),
            (
                json!({"input": "x", "previous_response_id": "resp_1"}),
                "stores no responses",
            ),
            (
                json!({"input": "x", "tools": [{"type": "function", "name": "f"}]}),
                "tools is not supported yet",
            ),
            (
                json!({"input": "x", "tool_choice": "required"}),
                "tool_choice is not supported yet",
            ),
            (
                json!({"input": "x", "text": {"format": {"type": "json_object"}}}),
                "text is not supported yet (structured output",
            ),
            (
                json!({"input": "x", "truncation": "auto"}),
                "truncation is not supported",
            ),
            (json!({"input": "x", "max_tokens": 3}), "\"max_tokens\" is not a field"),
        ] {
            let e = body(v.clone()).unwrap_err();
            assert_eq!(e.status, 400, "{v}");
            assert!(e.message.contains(says), "{v}: {}", e.message);
        }
    }

    #[test]
    fn harmless_fields_are_taken() {
        let v = json!({"input": "x", "store": true, "metadata": {"a": "b"}, "user": "u", "parallel_tool_calls": false,
            "truncation": "disabled", "text": {"format": {"type": "text"}}, "tools": [], "tool_choice": "none",
            "include": [], "service_tier": "auto"});
        assert!(body(v).is_ok());
    }

    fn reply() -> Reply {
        let (r, _) = responses_body(br#"{"input": "x", "max_output_tokens": 5}"#).unwrap();
        let sampler = SamplerOptions {
            seed: 7,
            ..SamplerOptions::default()
        };
        Reply::new(&r, "abc", "m".into(), 100, &sampler)
    }

    #[test]
    fn a_whole_response_says_why_it_is_incomplete() {
        let usage = Usage {
            prompt: 10,
            cached: 4,
            completion: 5,
        };
        let v = reply().whole("Hello", Finish::Length, usage);
        assert_eq!(v["id"], "resp_abc");
        assert_eq!(v["status"], "incomplete");
        assert_eq!(v["incomplete_details"]["reason"], "max_output_tokens");
        assert_eq!(v["output"][0]["content"][0]["text"], "Hello");
        assert_eq!(v["output"][0]["status"], "incomplete");
        assert_eq!(v["usage"]["input_tokens_details"]["cached_tokens"], 4);
        assert_eq!(v["usage"]["total_tokens"], 15);
        assert_eq!(
            (v["seed"].as_u64(), v["max_output_tokens"].as_i64()),
            (Some(7), Some(5))
        );
        let v = reply().whole("Hello", Finish::Stop, usage);
        assert_eq!(
            (v["status"].as_str(), &v["incomplete_details"]),
            (Some("completed"), &Value::Null)
        );
    }

    #[test]
    fn the_stream_numbers_its_events_in_order() {
        let mut e = Events::new(reply());
        let mut all = e.start();
        all.push(e.delta("He"));
        all.push(e.delta("llo"));
        all.extend(e.done(Finish::Stop, Usage::default()));
        let names: Vec<_> = all.iter().map(|(n, _)| *n).collect();
        assert_eq!(
            names,
            [
                "response.created",
                "response.in_progress",
                "response.output_item.added",
                "response.content_part.added",
                "response.output_text.delta",
                "response.output_text.delta",
                "response.output_text.done",
                "response.content_part.done",
                "response.output_item.done",
                "response.completed",
            ]
        );
        for (i, (name, v)) in all.iter().enumerate() {
            assert_eq!(
                (v["type"].as_str(), v["sequence_number"].as_u64()),
                (Some(*name), Some(i as u64))
            );
        }
        assert_eq!(all[6].1["text"], "Hello");
        assert_eq!(all[9].1["response"]["output"][0]["content"][0]["text"], "Hello");
        assert_eq!(all[2].1["item"]["content"], json!([]));
    }
}
