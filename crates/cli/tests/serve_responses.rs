//! `POST /v1/responses` (OpenAI's Responses API) on a real `titan serve` process over loopback: the same
//! greedy request answered by it and by `/v1/chat/completions` gives the same text and token counts, whole and
//! streamed as typed events; the length limit makes a response incomplete; the prompt cache is reported; bad
//! requests are 400s naming the cause; and the official `openai` client reads all of it (when TITAN_PYTHON
//! names a python with it).

use serde_json::{json, Value};

mod common;
use common::*;

const KEY: &str = "serve-responses-test-key";

/// A `titan serve` child on the qwen3moe fixture with the Qwen3 template and the API key, killed when dropped.
struct Server(serve::Server);

impl std::ops::Deref for Server {
    type Target = serve::Server;
    fn deref(&self) -> &serve::Server {
        &self.0
    }
}

impl Server {
    fn start() -> Server {
        Server(serve::Server::start(
            &fixture("qwen3moe/q8_0.gguf"),
            "templates/qwen3.jinja",
            &["--api-key", KEY],
        ))
    }

    fn ok(&self, path: &str, body: &Value) -> Value {
        let (status, v) = self.post_with(path, body, true);
        assert_eq!(status, 200, "{path} {body}: {v}");
        v
    }

    /// A streamed Responses request: its events as (the `event:` line, the data).
    fn events(&self, body: &Value) -> Vec<(String, Value)> {
        let mut body = body.clone();
        body["stream"] = json!(true);
        let v = self.ok("/v1/responses", &body);
        let text = v.as_str().unwrap_or_else(|| panic!("not a stream: {v}"));
        text.split("\n\n")
            .filter(|e| !e.trim().is_empty())
            .map(|e| {
                let field = |name: &str| {
                    e.lines()
                        .find_map(|l| l.strip_prefix(name))
                        .unwrap_or_else(|| panic!("no {name} in {e:?}"))
                };
                (
                    field("event: ").to_string(),
                    serde_json::from_str(field("data: ")).unwrap(),
                )
            })
            .collect()
    }
}

/// The text of a Responses object: its message's output_text parts (what the SDK's `output_text` joins).
fn output_text(v: &Value) -> String {
    let output = v["output"].as_array().unwrap_or_else(|| panic!("no output: {v}"));
    assert_eq!(output.len(), 1, "{v}");
    assert_eq!(
        (&output[0]["type"], &output[0]["role"]),
        (&json!("message"), &json!("assistant"))
    );
    output[0]["content"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| {
            assert_eq!(p["type"], "output_text", "{v}");
            p["text"].as_str().unwrap()
        })
        .collect()
}

/// Conversations as both endpoints take them: (responses body, chat messages).
fn conversations() -> Vec<(Value, Value)> {
    vec![
        (
            json!({"input": "Tell me a story about a king."}),
            json!([{"role": "user", "content": "Tell me a story about a king."}]),
        ),
        (
            json!({"instructions": "You are terse.", "input": [
                {"role": "developer", "content": "Answer in French."},
                {"role": "user", "content": [{"type": "input_text", "text": "Hello, "}, {"type": "input_text", "text": "who are you?"}]},
                {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "A model.", "annotations": []}]},
                {"role": "user", "content": "And what do you do?"},
            ]}),
            json!([
                {"role": "system", "content": "You are terse."},
                {"role": "system", "content": "Answer in French."},
                {"role": "user", "content": "Hello, who are you?"},
                {"role": "assistant", "content": "A model."},
                {"role": "user", "content": "And what do you do?"},
            ]),
        ),
    ]
}

/// Sampling settings both endpoints take: greedy, cut by the length limit; and a seeded sample at temperature
/// 1 whose chat answer ends by itself (the fixture's near-uniform logits reach its EOS in some tens of tokens
/// for some seeds: the first of those, found through the chat endpoint).
fn settings(server: &Server, messages: &Value) -> Vec<Value> {
    let seed = (1..100)
        .find(|seed| {
            let chat = json!({"messages": messages, "max_tokens": 200, "temperature": 1, "top_p": 1, "seed": seed});
            server.ok("/v1/chat/completions", &chat)["choices"][0]["finish_reason"] == "stop"
        })
        .expect("a seed whose answer stops within 200 tokens");
    vec![
        json!({"max_tokens": 2, "temperature": 0}),
        json!({"max_tokens": 16, "temperature": 0, "seed": 3}),
        json!({"max_tokens": 200, "temperature": 1, "top_p": 1, "seed": seed}),
    ]
}

/// The same request on both endpoints: the same text, token counts and end (`length` is an incomplete
/// response, `stop` a completed one), whole and streamed; the streamed events come in the order the SDK
/// reads, numbered, each named by its `event:` line. A repeat reuses the prompt cache and says so.
#[test]
fn a_response_is_the_chat_endpoints_answer() {
    let server = Server::start();
    let mut ends = Vec::new();
    for (input, messages) in conversations() {
        for sampling in settings(&server, &messages) {
            let mut chat = sampling.clone();
            chat["messages"] = messages.clone();
            let chat = server.ok("/v1/chat/completions", &chat);
            let want = chat["choices"][0]["message"]["content"].as_str().unwrap().to_string();
            let finish = chat["choices"][0]["finish_reason"].as_str().unwrap();
            ends.push(finish.to_string());
            let mut body = input.clone();
            for (k, v) in sampling.as_object().unwrap() {
                let k = if k == "max_tokens" { "max_output_tokens" } else { k };
                body[k] = v.clone();
            }
            let r = server.ok("/v1/responses", &body);
            println!("{body}\n  chat: {want:?} ({finish})\n  responses: {r}");
            assert!(r["id"].as_str().unwrap().starts_with("resp_"), "{r}");
            assert_eq!(r["object"], "response");
            assert_eq!(output_text(&r), want);
            let (status, reason) = match finish {
                "length" => ("incomplete", json!({"reason": "max_output_tokens"})),
                _ => ("completed", Value::Null),
            };
            assert_eq!(
                (r["status"].as_str(), &r["incomplete_details"]),
                (Some(status), &reason)
            );
            assert_eq!(r["output"][0]["status"], status);
            let u = &r["usage"];
            assert_eq!(u["input_tokens"], chat["usage"]["prompt_tokens"]);
            assert_eq!(u["output_tokens"], chat["usage"]["completion_tokens"]);
            assert_eq!(u["total_tokens"], chat["usage"]["total_tokens"]);
            // The chat request before it had the same prompt: all of it but the last token was cached.
            let input_tokens = u["input_tokens"].as_u64().unwrap();
            assert_eq!(u["input_tokens_details"]["cached_tokens"], input_tokens - 1);
            assert_eq!(u["output_tokens_details"]["reasoning_tokens"], 0);
            assert!(r["seed"].is_u64(), "{r}");

            let events = server.events(&body);
            let names: Vec<&str> = events.iter().map(|(n, _)| n.as_str()).collect();
            let deltas = names.iter().filter(|&&n| n == "response.output_text.delta").count();
            let last = if status == "completed" {
                "response.completed"
            } else {
                "response.incomplete"
            };
            let mut order = vec![
                "response.created",
                "response.in_progress",
                "response.output_item.added",
                "response.content_part.added",
            ];
            order.extend(std::iter::repeat_n("response.output_text.delta", deltas));
            order.extend([
                "response.output_text.done",
                "response.content_part.done",
                "response.output_item.done",
                last,
            ]);
            assert_eq!(names, order);
            assert!(deltas >= 1);
            for (i, (name, data)) in events.iter().enumerate() {
                assert_eq!(data["type"], json!(name), "{data}");
                assert_eq!(data["sequence_number"], i, "{data}");
            }
            let id = &events[0].1["response"]["id"];
            assert_eq!(events[0].1["response"]["status"], "in_progress");
            let item = &events[2].1["item"]["id"];
            let streamed: String = events
                .iter()
                .filter(|(n, _)| n == "response.output_text.delta")
                .map(|(_, d)| {
                    assert_eq!(&d["item_id"], item);
                    d["delta"].as_str().unwrap()
                })
                .collect();
            assert_eq!(streamed, want);
            assert_eq!(events[deltas + 4].1["text"], want);
            let done = &events.last().unwrap().1["response"];
            assert_eq!(&done["id"], id);
            assert_eq!(output_text(done), want);
            assert_eq!(done["status"], status);
            assert_eq!(done["usage"]["input_tokens"], input_tokens);
            assert_eq!(done["usage"]["input_tokens_details"]["cached_tokens"], input_tokens - 1);
            assert_eq!(done["usage"]["output_tokens"], chat["usage"]["completion_tokens"]);
        }
    }
    assert!(
        ends.contains(&"stop".into()) && ends.contains(&"length".into()),
        "{ends:?}"
    );
}

/// What the endpoint cannot do is a 400 naming the cause, in the error shape of the other endpoints; the
/// endpoint is behind the API key.
#[test]
fn bad_responses_requests_are_400s_naming_the_cause() {
    let server = Server::start();
    let (status, _) = server.post_with("/v1/responses", &json!({"input": "Hi"}), false);
    assert_eq!(status, 401);
    for (body, param, says) in [
        (json!({}), Value::Null, "missing field `input`"),
        (json!({"input": 7}), json!("input"), "input must be a string or a list"),
        (json!({"input": []}), json!("input"), "input is an empty list"),
        (
            json!({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "http://x"}]}]}),
            json!("input[0]"),
            "only input_text and output_text parts",
        ),
        (
            json!({"input": [{"type": "function_call_output", "call_id": "c1", "output": "4"}]}),
            json!("input[0]"),
            "tool calls are not supported yet",
        ),
        (
            json!({"input": "Hi", "tools": [{"type": "function", "name": "add", "parameters": {}}]}),
            json!("tools"),
            "tools is not supported yet (tool calls)",
        ),
        (
            json!({"input": "Hi", "text": {"format": {"type": "json_schema", "name": "x", "schema": {}}}}),
            json!("text"),
            "text is not supported yet (structured output",
        ),
        (
            json!({"input": "Hi", "previous_response_id": "resp_1"}),
            json!("previous_response_id"),
            "this server stores no responses",
        ),
        (
            json!({"input": "Hi", "max_output_tokens": 0}),
            json!("max_output_tokens"),
            "max_output_tokens is 0",
        ),
        (json!({"input": "Hi", "temperature": -1}), Value::Null, "temperature"),
        (
            json!({"input": "Hi", "max_tokens": 5}),
            json!("max_tokens"),
            "\"max_tokens\" is not a field",
        ),
        (
            json!({"input": "Hi", "model": "gpt-4o"}),
            json!("model"),
            "does not exist",
        ),
    ] {
        let (status, v) = server.post_with("/v1/responses", &body, true);
        let e = &v["error"];
        println!("{body}: {status} {e}");
        let want_status = if param == "model" { 404 } else { 400 };
        assert_eq!(status, want_status, "{body}: {v}");
        assert_eq!(e["type"], "invalid_request_error", "{v}");
        assert!(e["message"].as_str().unwrap().contains(says), "{body}: {v}");
        if !param.is_null() {
            assert_eq!(e["param"], param, "{body}: {v}");
        }
    }
    // Bookkeeping fields and formats that ask for plain text are taken.
    let r = server.ok(
        "/v1/responses",
        &json!({"input": "Hi", "max_output_tokens": 2, "store": true, "metadata": {"run": "a"}, "user": "u",
                "parallel_tool_calls": false, "truncation": "disabled", "text": {"format": {"type": "text"}},
                "tools": [], "tool_choice": "none"}),
    );
    assert_eq!((&r["store"], &r["metadata"]["run"]), (&json!(false), &json!("a")));
}

/// The official client: `responses.create` (whole and `stream=True`) and the `responses.stream` helper give
/// the chat endpoint's greedy text, usage and status as the SDK's own types.
#[test]
fn the_openai_client_reads_responses() {
    let Some(python) = serve::python("the openai package") else {
        return;
    };
    let server = Server::start();
    let script = r#"
import sys, openai
base, key = sys.argv[1:3]
client = openai.OpenAI(base_url=base + "/v1", api_key=key, max_retries=0, timeout=120)
messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Tell me a story."}]
# A seeded sample that ends by itself within 200 tokens (the fixture's logits are near-uniform; some seeds
# reach its EOS), found through the chat endpoint; the Responses requests repeat it with the seed.
for seed in range(1, 100):
    chat = client.chat.completions.create(model="q8_0", messages=messages, max_tokens=200, temperature=1, top_p=1, seed=seed)
    if chat.choices[0].finish_reason == "stop":
        break
assert chat.choices[0].finish_reason == "stop", chat
want = chat.choices[0].message.content
ask = dict(model="q8_0", instructions="Be brief.", input="Tell me a story.", max_output_tokens=200, temperature=1,
           top_p=1, extra_body={"seed": seed})
r = client.responses.create(**ask)
assert r.output_text == want, (r.output_text, want)
assert r.status == "completed" and r.incomplete_details is None, r
assert r.usage.input_tokens == chat.usage.prompt_tokens and r.usage.output_tokens == chat.usage.completion_tokens, r.usage
assert r.usage.input_tokens_details.cached_tokens == r.usage.input_tokens - 1, r.usage
assert r.id.startswith("resp_") and r.output[0].id.startswith("msg_"), r
types = []
text = ""
for event in client.responses.create(**ask, stream=True):
    types.append(event.type)
    if event.type == "response.output_text.delta":
        text += event.delta
    last = event
assert text == want, (text, want)
assert types[:4] == ["response.created", "response.in_progress", "response.output_item.added", "response.content_part.added"], types
assert last.type == "response.completed" and last.response.output_text == want, last
assert last.response.usage.output_tokens == r.usage.output_tokens, last
with client.responses.stream(**ask) as stream:
    streamed = "".join(e.delta for e in stream if e.type == "response.output_text.delta")
    final = stream.get_final_response()
assert final.status == "completed" and final.output_text == streamed == want, final
assert final.usage.total_tokens == final.usage.input_tokens + final.usage.output_tokens, final.usage
short = client.responses.create(model="q8_0", input="Tell me a story.", max_output_tokens=1)
assert short.status == "incomplete" and short.incomplete_details.reason == "max_output_tokens", short
try:
    client.responses.create(model="q8_0", input=[{"role": "user", "content": [{"type": "input_image", "image_url": "http://x"}]}])
except openai.BadRequestError as e:
    print("refused:", e.body["message"])
else:
    raise AssertionError("an image was taken")
print("all checks passed")
"#;
    serve::python_checks(&python, script, &[&server.url, KEY]);
}
