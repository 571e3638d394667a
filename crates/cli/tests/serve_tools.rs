//! Tool calls through `titan serve`, over real HTTP to real server processes: a two-turn round trip with the
//! official `openai` client (the model is given tools, the client answers a call with a `tool` message, the
//! model goes on), streamed and not, with Qwen3's template and with gpt-oss's harmony template; the prompt with tools against transformers' render of the same conversation
//! (`tests/fixtures/templates/expected.json`); an agent framework from PyPI (`openai-agents`) running a tool;
//! and the 400s for templates that cannot take tools.
//!
//! The fixtures' weights are random, so left to choose (`tool_choice` "auto") they never call a tool: the
//! first turn forces the call with `tool_choice` "required" (and a named function), which the server holds
//! to by a grammar of the template's call syntax, and checks that the answer is the call, parsed back; the
//! second turn answers it with a `tool` message and the model goes on. The tool's one parameter is an enum,
//! so that a random model cannot run its string on to `max_tokens`.

use std::process::Command;

use serde_json::{json, Value};

mod common;
use common::serve::Server;
use common::*;

/// Every server here runs the gpt-oss fixture, whatever the template: its tokenizer is qwen3moe's, and it is
/// the one fixture whose context (YaRN) holds Qwen3's tool preamble and two turns; qwen3moe's 512 positions
/// do not (the second turn alone is some 575 tokens).
const MODEL: &str = "gpt-oss/q8_0.gguf";
const CONTEXT: &[&str] = &["-c", "2048"];

fn weather_tool() -> Value {
    json!({"type": "function", "function": {"name": "get_weather", "description": "Weather in a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string", "enum": ["Paris", "Oslo"]}},
            "required": ["city"]}}})
}

fn time_tool() -> Value {
    // gpt-oss's template prints every tool's description (jinja2 fails on a missing one, as minijinja does).
    json!({"type": "function", "function": {"name": "get_time", "description": "The time.",
        "parameters": {"type": "object", "properties": {}}}})
}

/// The round trip, driven by the official client; prints "all checks passed".
const ROUND_TRIP: &str = r#"
import json, sys, openai
base, model = sys.argv[1:3]
tools = json.loads(sys.argv[3])
client = openai.OpenAI(base_url=base + "/v1", api_key="none", max_retries=0, timeout=120)
messages = [{"role": "user", "content": "Weather in Paris?"}]
settings = dict(model=model, max_tokens=8, temperature=0, seed=1)

# Left to choose, random weights do not call: the answer is text (or, should it call, a call).
free = client.chat.completions.create(messages=messages, tools=tools, tool_choice="auto", **settings)
assert free.choices[0].finish_reason in ("stop", "length", "tool_calls"), free

# Turn 1, forced: the grammar holds the model to its syntax, and the answer is parsed back into the call.
# One call (parallel_tool_calls false): left to add calls, random weights go on until max_tokens.
forced = dict(settings, max_tokens=400, parallel_tool_calls=False)
first = client.chat.completions.create(messages=messages, tools=tools, tool_choice="required", **forced)
choice = first.choices[0]
assert choice.finish_reason == "tool_calls" and choice.message.content is None, first
assert len(choice.message.tool_calls) == 1, first
call = choice.message.tool_calls[0]
assert call.id.startswith("call_") and call.type == "function", call
assert call.function.name in ("get_weather", "get_time"), call
args = json.loads(call.function.arguments)
assert call.function.name == "get_time" or args["city"] in ("Paris", "Oslo"), args
streamed = client.chat.completions.create(messages=messages, tools=tools, tool_choice="required", stream=True, **forced)
text, calls, finish, first_chunks = "", {}, None, {}
for chunk in streamed:
    for c in chunk.choices:
        text += c.delta.content or ""
        for d in c.delta.tool_calls or []:
            if d.index not in calls:
                first_chunks[d.index] = d
                calls[d.index] = ""
            calls[d.index] += d.function.arguments or ""
        finish = c.finish_reason or finish
assert text == "" and finish == "tool_calls", (text, finish)
assert first_chunks[0].id.startswith("call_") and first_chunks[0].function.name == call.function.name, first_chunks
assert first_chunks[0].function.arguments == "", first_chunks
assert [json.loads(a) for a in calls.values()] == [json.loads(c.function.arguments) for c in choice.message.tool_calls]
named = client.chat.completions.create(messages=messages, tools=tools, **forced,
                                       tool_choice={"type": "function", "function": {"name": "get_time"}})
assert [c.function.name for c in named.choices[0].message.tool_calls] == ["get_time"], named
assert json.loads(named.choices[0].message.tool_calls[0].function.arguments) == {}, named

# Turn 2: the client answers the model's call and the model goes on.
replay = messages + [
    {"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
    {"role": "tool", "tool_call_id": call.id, "content": json.dumps({"temperature": 18})},
]
second = client.chat.completions.create(messages=replay, tools=tools, **settings)
assert second.choices[0].finish_reason in ("stop", "length", "tool_calls"), second
assert second.usage.prompt_tokens > first.usage.prompt_tokens, (second.usage, first.usage)
pieces = client.chat.completions.create(messages=replay, tools=tools, stream=True, **settings)
text = "".join(c.delta.content or "" for chunk in pieces for c in chunk.choices)
if not second.choices[0].message.tool_calls:
    assert text == second.choices[0].message.content, (text, second.choices[0].message.content)
print("all checks passed")
"#;

fn round_trip(template: &str) {
    let Some(python) = serve::python("the openai package") else {
        return;
    };
    let server = Server::start(&fixture(MODEL), template, CONTEXT);
    let name = std::path::Path::new(MODEL).file_stem().unwrap().to_str().unwrap();
    let tools = json!([weather_tool(), time_tool()]).to_string();
    serve::python_checks(&python, ROUND_TRIP, &[&server.url, name, &tools]);
}

#[test]
fn a_tool_round_trip_on_qwen3() {
    round_trip("templates/qwen3.jinja");
}

#[test]
fn a_tool_round_trip_on_gpt_oss() {
    round_trip("templates/gpt-oss.jinja");
}

/// An agent framework from PyPI (`openai-agents`, over the chat completions API) runs a tool: the model's
/// call (forced, as above, by `tool_choice` "required" in the agent's settings, which the framework resets to
/// "auto" once a tool has run, so the second turn is free), the framework's call of the Python function with
/// the parsed arguments, the tool's output sent back, and the model's answer as the run's final output;
/// once whole and once streamed.
const AGENT: &str = r#"
import asyncio, sys
from typing import Literal
from openai import AsyncOpenAI
from agents import (Agent, ModelSettings, OpenAIChatCompletionsModel, Runner, function_tool,
                    set_tracing_disabled)
from agents.items import MessageOutputItem, ToolCallItem, ToolCallOutputItem
set_tracing_disabled(True)  # the framework would send traces to OpenAI's servers
base, model = sys.argv[1:3]
ran = []

@function_tool
def get_weather(city: Literal["Paris", "Oslo"]) -> str:
    """Weather in a city."""
    ran.append(city)
    return f"Sunny in {city}, 21 C."

client = AsyncOpenAI(base_url=base + "/v1", api_key="none", max_retries=0, timeout=120)
agent = Agent(name="weather", instructions="Answer questions about the weather.", tools=[get_weather],
              model=OpenAIChatCompletionsModel(model=model, openai_client=client),
              model_settings=ModelSettings(tool_choice="required", parallel_tool_calls=False, temperature=0,
                                           max_tokens=400, extra_args={"seed": 1}))

def check(result):
    kinds = [type(i) for i in result.new_items]
    assert kinds == [ToolCallItem, ToolCallOutputItem, MessageOutputItem], kinds
    assert result.new_items[1].output == f"Sunny in {ran[-1]}, 21 C.", result.new_items[1]
    assert isinstance(result.final_output, str), result.final_output
    assert len(result.raw_responses) == 2, result.raw_responses

async def main():
    check(await Runner.run(agent, "Weather in Paris?", max_turns=3))
    streamed = Runner.run_streamed(agent, "Weather in Oslo?", max_turns=3)
    events = [e.type async for e in streamed.stream_events()]
    assert "run_item_stream_event" in events, events
    check(streamed)
    assert len(ran) == 2 and set(ran) <= {"Paris", "Oslo"}, ran

asyncio.run(main())
print("all checks passed")
"#;

#[test]
fn an_agent_framework_runs_a_tool() {
    let Some(python) = serve::python("the openai-agents package") else {
        return;
    };
    let server = Server::start(&fixture(MODEL), "templates/qwen3.jinja", CONTEXT);
    let name = std::path::Path::new(MODEL).file_stem().unwrap().to_str().unwrap();
    serve::python_checks(&python, AGENT, &[&server.url, name]);
}

/// The prompt the server renders with tools and past calls is transformers' (the tool conversations of
/// expected.json, sent as a client sends them: arguments as JSON text), counted in tokens against the
/// reference prompt tokenised by the same server.
#[test]
fn prompts_with_tools_are_transformers_renders() {
    let text = std::fs::read_to_string(fixture("templates/expected.json")).unwrap();
    let expected: Value = serde_json::from_str(&text).unwrap();
    let server = Server::start(&fixture(MODEL), "templates/gpt-oss.jinja", CONTEXT);
    let today = today();
    for case in expected["tool_conversations"].as_array().unwrap() {
        let case = case.as_str().unwrap();
        let mut messages = expected["conversations"][case].clone();
        for m in messages.as_array_mut().unwrap() {
            for call in m["tool_calls"].as_array_mut().into_iter().flatten() {
                let arguments = call["function"]["arguments"].to_string();
                call["function"]["arguments"] = arguments.into();
            }
        }
        let prompt = expected["templates"]["gpt-oss.jinja"]["cases"][case]["prompt"]
            .as_str()
            .unwrap()
            .replace(expected["date"].as_str().unwrap(), &today);
        let (status, tokens) = server.post(
            "/tokenize",
            &json!({"content": prompt, "add_special": true, "parse_special": true}),
        );
        assert_eq!(status, 200, "{tokens}");
        let body = json!({"messages": messages, "tools": expected["tools"], "max_tokens": 1, "temperature": 0});
        let (status, answer) = server.post("/v1/chat/completions", &body);
        assert_eq!(status, 200, "{case}: {answer}");
        assert_eq!(
            answer["usage"]["prompt_tokens"],
            tokens["tokens"].as_array().unwrap().len(),
            "{case}"
        );
    }
}

/// Today's date as the server's template prints it (`strftime_now("%Y-%m-%d")`, local time, as `date`
/// prints it).
fn today() -> String {
    let date = Command::new("date").arg("+%Y-%m-%d").output().unwrap();
    String::from_utf8_lossy(&date.stdout).trim().to_owned()
}

/// A template that never mentions tools, or writes calls in a syntax the server does not parse, cannot take
/// tools: a 400 that says so, unless the request asks for no call.
#[test]
fn templates_that_cannot_take_tools_refuse_them() {
    let tools = json!([weather_tool()]);
    let messages = json!([{"role": "user", "content": "Weather in Paris?"}]);
    for (template, why) in [
        ("templates/mixtral-8x7b-instruct-v0.1.jinja", "does not render tools"),
        ("templates/glm-4.7-flash.jinja", "syntax this server does not parse"),
    ] {
        let server = Server::start(&fixture(MODEL), template, CONTEXT);
        let (status, e) = server.post(
            "/v1/chat/completions",
            &json!({"messages": messages, "tools": tools, "max_tokens": 2}),
        );
        assert_eq!(status, 400, "{template}: {e}");
        assert_eq!(e["error"]["param"], "tools", "{e}");
        assert!(e["error"]["message"].as_str().unwrap().contains(why), "{e}");
        let (status, a) = server.post(
            "/v1/chat/completions",
            &json!({"messages": messages, "tools": tools, "tool_choice": "none", "max_tokens": 2}),
        );
        assert_eq!(status, 200, "{template}: {a}");
        assert!(a["choices"][0]["message"]["tool_calls"].is_null(), "{a}");
    }
}
