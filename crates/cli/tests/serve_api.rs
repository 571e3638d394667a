//! The sampling fields and the scripting endpoints of `titan serve`, over real HTTP to a real server process:
//! logit_bias, frequency and presence penalties (checked against a reference computed here from the
//! model's own log-probabilities), top_logprobs and the legacy completions logprobs, random seeds given
//! back, fields refused by name, /tokenize, /detokenize and /props; and the official `openai` client
//! reading the new fields (when TITAN_PYTHON names a python with it).

use std::collections::HashMap;

use serde_json::{json, Value};

mod common;
use common::*;

const KEY: &str = "serve-api-test-key";
const MESSAGES: &str = r#"[{"role": "user", "content": "Tell me a story about a king."}]"#;

/// A `titan serve` child on the qwen3moe fixture with the API key, killed when dropped.
struct Server(serve::Server);

impl std::ops::Deref for Server {
    type Target = serve::Server;
    fn deref(&self) -> &serve::Server {
        &self.0
    }
}

impl Server {
    fn start(extra: &[&str]) -> Server {
        let args = [&["--api-key", KEY][..], extra].concat();
        Server(serve::Server::start(
            &fixture("qwen3moe/q8_0.gguf"),
            "templates/qwen3.jinja",
            &args,
        ))
    }

    /// A request that must succeed: its body.
    fn ok(&self, path: &str, body: &Value) -> Value {
        let (status, v) = self.post(path, body);
        assert_eq!(status, 200, "{path} {body}: {v}");
        v
    }

    /// A request that must be refused with 400: its `error` object.
    fn refused(&self, path: &str, body: &Value) -> Value {
        let (status, v) = self.post(path, body);
        assert_eq!(status, 400, "{path} {body}: {v}");
        assert_eq!(v["error"]["type"], "invalid_request_error", "{v}");
        v["error"].clone()
    }

    /// The chunks of a streamed request, up to `[DONE]`.
    fn stream(&self, path: &str, body: &Value) -> Vec<Value> {
        let mut body = body.clone();
        body["stream"] = json!(true);
        let (status, v) = self.post(path, &body);
        assert_eq!(status, 200, "{v}");
        let text = v.as_str().unwrap_or_else(|| panic!("not a stream: {v}")).to_string();
        let data: Vec<&str> = text.lines().filter_map(|l| l.strip_prefix("data: ")).collect();
        assert_eq!(data.last(), Some(&"[DONE]"), "{text}");
        data[..data.len() - 1]
            .iter()
            .map(|d| serde_json::from_str(d).unwrap())
            .collect()
    }
}

/// A chat request: the story prompt, `max_tokens`, and `extra` fields.
fn chat(max_tokens: u32, extra: Value) -> Value {
    let mut body = json!({"messages": serde_json::from_str::<Value>(MESSAGES).unwrap(), "max_tokens": max_tokens});
    body.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
    body
}

/// The `logprobs.content` entries of a chat response.
fn entries(r: &Value) -> Vec<Value> {
    r["choices"][0]["logprobs"]["content"]
        .as_array()
        .unwrap_or_else(|| panic!("no logprobs in {r}"))
        .clone()
}

fn ids(entries: &[Value]) -> Vec<u64> {
    entries.iter().map(|e| e["id"].as_u64().unwrap()).collect()
}

/// (id, logprob) of an entry's `top_logprobs`.
fn top(entry: &Value) -> Vec<(u64, f64)> {
    entry["top_logprobs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| (t["id"].as_u64().unwrap(), t["logprob"].as_f64().unwrap()))
        .collect()
}

#[test]
fn logit_bias_forces_a_token_and_bans_one() {
    let server = Server::start(&[]);
    let greedy = server.ok(
        "/v1/chat/completions",
        &chat(12, json!({"temperature": 0, "logprobs": true, "top_logprobs": 2})),
    );
    let plain = entries(&greedy);
    let (first, runner_up) = (top(&plain[0])[0].0, top(&plain[0])[1].0);
    assert_eq!(
        plain[0]["id"].as_u64(),
        Some(first),
        "greedy takes the most likely token"
    );

    // +100 makes a token the choice at every step, greedy or drawn ("He", 369 in this vocabulary).
    for temperature in [0.0, 1.0] {
        let forced = server.ok(
            "/v1/chat/completions",
            &chat(
                8,
                json!({"temperature": temperature, "logit_bias": {"369": 100}, "logprobs": true}),
            ),
        );
        assert_eq!(ids(&entries(&forced)), [369; 8], "{forced}");
        assert_eq!(forced["choices"][0]["message"]["content"], "He".repeat(8));
    }

    // -100 bans: the first token becomes the runner-up the unbiased request reported, and the banned token
    // appears nowhere in the answer.
    let banned = server.ok(
        "/v1/chat/completions",
        &chat(
            12,
            json!({"temperature": 0, "logit_bias": {first.to_string(): -100}, "logprobs": true}),
        ),
    );
    let banned = ids(&entries(&banned));
    assert_eq!(banned[0], runner_up, "{banned:?}");
    assert!(!banned.contains(&first), "{banned:?}");

    // Ids outside the vocabulary, keys that are not ids and biases out of range are refused by name.
    for bias in [
        json!({"451": 1}),
        json!({"he": 1}),
        json!({"5": 101}),
        json!({"5": "x"}),
    ] {
        let e = server.refused(
            "/v1/completions",
            &json!({"prompt": "Hi", "max_tokens": 2, "logit_bias": bias}),
        );
        let message = e["message"].as_str().unwrap();
        assert!(message.contains("logit_bias") || message.contains("\"x\""), "{e}");
    }
}

/// Checks that each chosen token of a greedy request with penalties is the one OpenAI's definition picks
/// from the model's log-probabilities (reported unpenalised, top 20 at each step):
/// logprob[j] − count[j] × frequency − (count[j] > 0) × presence, counts over the tokens generated before.
/// Returns how many steps it could check: those whose penalised best is among the 20 reported. A token
/// outside them has a lower logprob than all of them, and a penalty lowers it further; a negative penalty
/// raises it, but only if it was generated before, by at most its count's worth.
fn check_penalised(entries: &[Value], frequency: f64, presence: f64) -> usize {
    let mut counts: HashMap<u64, u32> = HashMap::new();
    let mut checked = 0;
    for (step, e) in entries.iter().enumerate() {
        let chosen = e["id"].as_u64().unwrap();
        let raw = top(e);
        assert_eq!(raw.len(), 20);
        let mut scored: Vec<(u64, f64)> = raw
            .iter()
            .map(|&(id, lp)| {
                let c = counts.get(&id).copied().unwrap_or(0) as f64;
                (id, lp - c * frequency - if c > 0.0 { presence } else { 0.0 })
            })
            .collect();
        scored.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
        let boost = counts
            .iter()
            .filter(|(id, _)| !raw.iter().any(|r| r.0 == **id))
            .map(|(_, &c)| -(c as f64 * frequency + presence))
            .fold(0.0, f64::max);
        if scored[0].1 >= raw[19].1 + boost {
            // Within f32 rounding of a tie either may be the choice.
            let near: Vec<u64> = scored
                .iter()
                .take_while(|s| scored[0].1 - s.1 < 1e-4)
                .map(|s| s.0)
                .collect();
            assert!(
                near.contains(&chosen),
                "step {step}: chose {chosen}, the definition gives {near:?} (scores {scored:?}, counts {counts:?})"
            );
            checked += 1;
        }
        *counts.entry(chosen).or_default() += 1;
    }
    checked
}

#[test]
fn frequency_and_presence_penalties_change_a_greedy_answer_as_defined() {
    let server = Server::start(&[]);
    let greedy = |penalties: Value| {
        let mut extra = json!({"temperature": 0, "logprobs": true, "top_logprobs": 20});
        extra
            .as_object_mut()
            .unwrap()
            .extend(penalties.as_object().unwrap().clone());
        entries(&server.ok("/v1/chat/completions", &chat(24, extra)))
    };
    let plain = greedy(json!({}));
    assert_eq!(check_penalised(&plain, 0.0, 0.0), plain.len());
    let distinct = |e: &[Value]| ids(e).into_iter().collect::<std::collections::HashSet<_>>().len();
    assert!(
        distinct(&plain) < plain.len(),
        "the plain answer repeats no token: the penalties would change nothing"
    );
    for (frequency, presence) in [(1.5, 0.0), (0.0, 1.5), (0.8, 0.6), (-0.5, 0.0)] {
        let penalised = greedy(json!({"frequency_penalty": frequency, "presence_penalty": presence}));
        let what = format!("frequency {frequency}, presence {presence}");
        assert_ne!(ids(&penalised), ids(&plain), "{what}");
        let checked = check_penalised(&penalised, frequency, presence);
        if frequency >= 0.0 {
            assert!(
                checked * 4 >= penalised.len() * 3,
                "{what}: only {checked} of {} steps could be checked",
                penalised.len()
            );
            assert!(
                distinct(&penalised) > distinct(&plain),
                "{what}: no more tokens than without"
            );
        } else {
            // A negative penalty favours what was generated, soon beyond what the top 20 show.
            assert!(checked >= 3, "{what}: only {checked} steps could be checked");
            assert!(
                distinct(&penalised) < distinct(&plain),
                "{what}: no fewer tokens than without"
            );
        }
    }
    let e = server.refused("/v1/chat/completions", &chat(2, json!({"frequency_penalty": 2.5})));
    assert_eq!(e["message"], "frequency_penalty is 2.5; it must be in [-2, 2]", "{e}");
}

#[test]
fn top_logprobs_are_the_most_likely_tokens_in_order_streamed_or_not() {
    let server = Server::start(&[]);
    for (temperature, seed) in [(0.0, 0), (1.5, 7)] {
        let body = chat(
            16,
            json!({"temperature": temperature, "seed": seed, "logprobs": true, "top_logprobs": 5}),
        );
        let whole = server.ok("/v1/chat/completions", &body);
        let es = entries(&whole);
        assert!(!es.is_empty());
        for e in &es {
            let t = top(e);
            assert_eq!(t.len(), 5, "{e}");
            assert!(
                t.windows(2)
                    .all(|w| w[0].1 > w[1].1 || (w[0].1 == w[1].1 && w[0].0 < w[1].0)),
                "not in order: {t:?}"
            );
            assert!(t.iter().all(|x| x.1 <= 0.0) && t.iter().map(|x| x.1.exp()).sum::<f64>() <= 1.0 + 1e-5);
            let (id, lp) = (e["id"].as_u64().unwrap(), e["logprob"].as_f64().unwrap());
            match t.iter().find(|x| x.0 == id) {
                Some(x) => assert_eq!(x.1, lp, "the chosen token's logprob differs in its own top list: {e}"),
                None => assert!(lp <= t[4].1, "a token less likely than the top 5 is not in them: {e}"),
            }
            if temperature == 0.0 {
                assert_eq!(t[0].0, id, "greedy takes the most likely token: {e}");
            }
            // OpenAI's shape: the token's text and bytes beside its id.
            let bytes: Vec<u8> = serde_json::from_value(e["bytes"].clone()).unwrap();
            assert_eq!(e["token"], String::from_utf8_lossy(&bytes).as_ref());
        }
        // Streamed, the same tokens with the same log-probabilities, one token a chunk.
        let chunks = server.stream("/v1/chat/completions", &body);
        let streamed: Vec<Value> = chunks
            .iter()
            .filter(|c| !c["choices"][0]["logprobs"].is_null())
            .flat_map(|c| c["choices"][0]["logprobs"]["content"].as_array().unwrap().clone())
            .collect();
        assert_eq!(streamed, es);
        let text: String = chunks
            .iter()
            .filter_map(|c| c["choices"][0]["delta"]["content"].as_str())
            .collect();
        assert_eq!(text, whole["choices"][0]["message"]["content"].as_str().unwrap());
    }
    let zero = server.ok(
        "/v1/chat/completions",
        &chat(3, json!({"logprobs": true, "top_logprobs": 0})),
    );
    assert!(entries(&zero).iter().all(|e| top(e).is_empty()));
    let e = server.refused(
        "/v1/chat/completions",
        &chat(3, json!({"logprobs": true, "top_logprobs": 21})),
    );
    assert_eq!(e["param"], "top_logprobs");
    let e = server.refused("/v1/chat/completions", &chat(3, json!({"top_logprobs": 3})));
    assert_eq!(e["message"], "top_logprobs needs logprobs: true");
}

#[test]
fn completions_give_logprobs_n_in_the_legacy_shape() {
    let server = Server::start(&[]);
    let body = json!({"prompt": "The quick brown fox", "max_tokens": 16, "temperature": 0, "logprobs": 3});
    let r = server.ok("/v1/completions", &body);
    let lp = &r["choices"][0]["logprobs"];
    let text = r["choices"][0]["text"].as_str().unwrap();
    let tokens: Vec<&str> = lp["tokens"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_str().unwrap())
        .collect();
    let n = tokens.len();
    assert!(n > 0);
    let token_logprobs = lp["token_logprobs"].as_array().unwrap();
    let tops = lp["top_logprobs"].as_array().unwrap();
    let offsets: Vec<usize> = lp["text_offset"]
        .as_array()
        .unwrap()
        .iter()
        .map(|o| o.as_u64().unwrap() as usize)
        .collect();
    assert_eq!((token_logprobs.len(), tops.len(), offsets.len()), (n, n, n), "{lp}");
    assert_eq!(offsets[0], 0);
    assert!(offsets.windows(2).all(|w| w[0] <= w[1]), "{offsets:?}");
    for i in 0..n {
        let top = tops[i].as_object().unwrap();
        assert_eq!(top.len(), 3, "{lp}");
        // Greedy: the chosen token is the most likely one, under the same name.
        let best = top
            .values()
            .map(|v| v.as_f64().unwrap())
            .fold(f64::NEG_INFINITY, f64::max);
        assert_eq!(token_logprobs[i].as_f64(), Some(best), "token {i}: {lp}");
        assert_eq!(top[tokens[i]].as_f64(), Some(best), "token {i}: {lp}");
        // A token of whole UTF-8 is where its offset says in the text.
        if !tokens[i].starts_with("bytes:") {
            let at: String = text.chars().skip(offsets[i]).collect();
            assert!(
                at.starts_with(tokens[i]),
                "token {i} {:?} at {}: {text:?}",
                tokens[i],
                offsets[i]
            );
        }
    }
    // Streamed: the same lists, chunk after chunk.
    let chunks = server.stream("/v1/completions", &body);
    let mut joined: HashMap<&str, Vec<Value>> = HashMap::new();
    for c in chunks.iter().filter(|c| !c["choices"][0]["logprobs"].is_null()) {
        for key in ["tokens", "token_logprobs", "top_logprobs", "text_offset"] {
            joined
                .entry(key)
                .or_default()
                .extend(c["choices"][0]["logprobs"][key].as_array().unwrap().iter().cloned());
        }
    }
    for key in ["tokens", "token_logprobs", "top_logprobs", "text_offset"] {
        assert_eq!(&Value::Array(joined[key].clone()), &lp[key], "{key}");
    }
    let e = server.refused(
        "/v1/completions",
        &json!({"prompt": "Hi", "max_tokens": 2, "logprobs": 21}),
    );
    assert_eq!(e["param"], "logprobs");
}

#[test]
fn unseeded_requests_differ_and_the_seed_each_reports_repeats_it() {
    let server = Server::start(&[]);
    let body = |seed: Option<u64>| {
        let mut b = json!({"prompt": "Once upon a time", "max_tokens": 24, "temperature": 1});
        if let Some(s) = seed {
            b["seed"] = json!(s);
        }
        b
    };
    let text = |r: &Value| r["choices"][0]["text"].as_str().unwrap().to_string();
    let (a, b) = (
        server.ok("/v1/completions", &body(None)),
        server.ok("/v1/completions", &body(None)),
    );
    let (seed_a, seed_b) = (a["seed"].as_u64().unwrap(), b["seed"].as_u64().unwrap());
    assert_ne!(seed_a, seed_b);
    assert_ne!(text(&a), text(&b), "two unseeded requests gave the same text");
    assert!(
        seed_a < 1 << 53 && seed_b < 1 << 53,
        "a JavaScript number holds the seed"
    );
    for (seed, r) in [(seed_a, &a), (seed_b, &b)] {
        let again = server.ok("/v1/completions", &body(Some(seed)));
        assert_eq!(text(&again), text(r), "seed {seed}");
        assert_eq!(again["seed"].as_u64(), Some(seed));
    }
    // Streamed, every chunk carries the seed, and the text is the same.
    let chunks = server.stream("/v1/completions", &body(Some(seed_a)));
    assert!(chunks.iter().all(|c| c["seed"].as_u64() == Some(seed_a)));
    let streamed: String = chunks.iter().filter_map(|c| c["choices"][0]["text"].as_str()).collect();
    assert_eq!(streamed, text(&a));
    // A seed of any u64 is taken and given back as it was sent; chat reports its seed too.
    let big = server.ok("/v1/completions", &body(Some(u64::MAX)));
    assert_eq!(big["seed"].as_u64(), Some(u64::MAX));
    let c = server.ok("/v1/chat/completions", &chat(4, json!({})));
    assert!(c["seed"].is_u64() && c["system_fingerprint"].is_string(), "{c}");
    // The chat page shows the seed of each answer.
    let page = server.get("/", false).1;
    assert!(
        page.as_str().unwrap().contains("event.seed"),
        "the chat page does not read the seed"
    );
}

#[test]
fn fields_the_server_does_not_implement_are_refused_by_name() {
    let server = Server::start(&[]);
    let cases = [
        (
            "/v1/completions",
            json!({"prompt": "Hi", "temprature": 0.5}),
            "temprature",
            "not a field",
        ),
        (
            "/v1/completions",
            json!({"prompt": "Hi", "suffix": "!"}),
            "suffix",
            "not supported",
        ),
        (
            "/v1/chat/completions",
            chat(2, json!({"functions": [{"name": "f", "parameters": {}}]})),
            "functions",
            "deprecated form; send tools",
        ),
        (
            "/v1/chat/completions",
            chat(2, json!({"tool_choice": "required"})),
            "tool_choice",
            "the request has no tools",
        ),
        (
            "/v1/chat/completions",
            chat(2, json!({"response_format": {"type": "xml"}})),
            "response_format",
            "\"xml\"; it must be \"text\", \"json_object\" or \"json_schema\"",
        ),
        (
            "/v1/chat/completions",
            chat(2, json!({"n": 2})),
            "n",
            "not supported yet",
        ),
        (
            "/v1/chat/completions",
            chat(2, json!({"reasoning_effort": "low"})),
            "reasoning_effort",
            "not supported",
        ),
        (
            "/v1/chat/completions",
            chat(2, json!({"prompt": "Hi"})),
            "prompt",
            "not a field",
        ),
    ];
    for (path, body, field, why) in cases {
        let e = server.refused(path, &body);
        let message = e["message"].as_str().unwrap();
        assert_eq!(e["param"], field, "{e}");
        assert!(message.contains(field) && message.contains(why), "{field}: {message}");
    }
    // What clients send that asks for nothing unsupported is taken.
    let harmless = json!({
        "user": "u-1", "metadata": {"run": "a"}, "store": false, "n": 1, "tools": [], "tool_choice": "none",
        "parallel_tool_calls": false, "response_format": {"type": "text"}, "stream_options": null,
        "service_tier": "auto", "temperature": 0, "logprobs": false
    });
    server.ok("/v1/chat/completions", &chat(2, harmless));
    server.ok(
        "/v1/completions",
        &json!({"prompt": "Hi", "max_tokens": 2, "user": "u-1", "best_of": 1, "echo": false, "suffix": null}),
    );
}

#[test]
fn tokenize_and_detokenize_round_trip_and_refuse_bad_ids() {
    let server = Server::start(&["--max-body", "4096"]);
    let text = "Hello world, the quick brown fox.";
    let ids = server.ok("/tokenize", &json!({"content": text}))["tokens"].clone();
    assert!(ids.as_array().unwrap().len() > 1, "{ids}");
    assert_eq!(server.ok("/detokenize", &json!({"tokens": ids}))["content"], text);
    // The prompt of a completion is tokenised the same way (with the special tokens the vocabulary adds).
    let with_special = server.ok("/tokenize", &json!({"content": text, "add_special": true}))["tokens"].clone();
    let usage = server.ok("/v1/completions", &json!({"prompt": text, "max_tokens": 1}))["usage"].clone();
    assert_eq!(
        usage["prompt_tokens"],
        with_special.as_array().unwrap().len(),
        "{usage}"
    );
    // A prompt given as those ids is the same prompt.
    let greedy = |prompt: Value| {
        server.ok(
            "/v1/completions",
            &json!({"prompt": prompt, "max_tokens": 6, "temperature": 0}),
        )["choices"][0]["text"]
            .clone()
    };
    assert_eq!(greedy(json!(text)), greedy(with_special));
    // Control tokens' text is that token unless parse_special is false; pieces are the ids' texts.
    let special = |parse: bool| {
        server.ok(
            "/tokenize",
            &json!({"content": "<|im_start|>user", "parse_special": parse}),
        )["tokens"]
            .as_array()
            .unwrap()
            .len()
    };
    assert!(special(true) < special(false));
    let pieces = server.ok("/tokenize", &json!({"content": text, "with_pieces": true}))["tokens"].clone();
    let joined: String = pieces
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["piece"].as_str().unwrap())
        .collect();
    assert_eq!(joined, text);
    assert_eq!(pieces[0]["id"], ids[0]);
    // Ids outside the vocabulary (451 tokens), ids that are not ids, unknown fields: 400.
    for bad in [
        json!([451]),
        json!([0, -1]),
        json!([4294967296u64]),
        json!(["a"]),
        json!([1.5]),
    ] {
        let e = server.refused("/detokenize", &json!({ "tokens": bad }));
        assert!(e["message"].as_str().unwrap().contains("token") || e["message"].as_str().unwrap().contains("valid"));
    }
    let e = server.refused("/detokenize", &json!({"tokens": [451]}));
    assert_eq!(e["message"], "token id 451 is outside the vocabulary (0..451)");
    let e = server.refused("/tokenize", &json!({"text": "Hi"}));
    assert!(e["message"].as_str().unwrap().contains("unknown field `text`"), "{e}");
    // Behind the API key, like the rest of the API.
    let (status, _) = server.post_with("/tokenize", &json!({"content": "Hi"}), false);
    assert_eq!(status, 401);
    // A body over --max-body is a 413 here as everywhere (small enough to be sent whole before the answer).
    let (status, _) = server.post("/tokenize", &json!({"content": "x".repeat(8000)}));
    assert_eq!(status, 413);
}

#[test]
fn props_report_the_settings_slots_context_model_and_template() {
    let server = Server::start(&["--parallel", "3", "-c", "256", "--alias", "tiny"]);
    let (status, p) = server.get("/props", true);
    assert_eq!(status, 200, "{p}");
    assert_eq!(p["total_slots"], 3);
    assert_eq!(p["default_generation_settings"]["n_ctx"], 256);
    assert_eq!(p["model_alias"], "tiny");
    assert!(p["model_path"].as_str().unwrap().ends_with("qwen3moe/q8_0.gguf"), "{p}");
    assert_eq!(p["n_vocab"], 451);
    let template = std::fs::read_to_string(fixture("templates/qwen3.jinja")).unwrap();
    assert_eq!(p["chat_template"], template.as_str());
    let params = &p["default_generation_settings"]["params"];
    assert!((params["temperature"].as_f64().unwrap() - 0.8).abs() < 1e-6, "{params}");
    assert_eq!(params["top_k"], 40);
    assert_eq!(params["frequency_penalty"], 0.0);
    assert!(
        params["seed"].is_null(),
        "the default seed is a random one per request: {params}"
    );
    assert_eq!(server.get("/props", false).0, 401);
}

/// The official client reads the new fields: top_logprobs objects, the legacy logprobs, the seed; it sends
/// what it takes as it always did, and its unknown extras are refused.
#[test]
fn the_openai_client_reads_top_logprobs_logprobs_n_and_the_seed() {
    let Some(python) = serve::python("the openai package") else {
        return;
    };
    let server = Server::start(&[]);
    let script = r#"
import sys, openai
base, key = sys.argv[1:3]
client = openai.OpenAI(base_url=base + "/v1", api_key=key, max_retries=0, timeout=120)
messages = [{"role": "user", "content": "Tell me a story."}]
r = client.chat.completions.create(model="q8_0", messages=messages, max_tokens=4, temperature=0, logprobs=True,
                                   top_logprobs=3, user="u-1", metadata={"run": "a"}, stream_options=None)
first = r.choices[0].logprobs.content[0]
assert len(first.top_logprobs) == 3 and first.top_logprobs[0].token == first.token, first
assert first.top_logprobs[0].logprob == first.logprob, first
seed = r.model_extra["seed"]
assert isinstance(seed, int), r
c = client.completions.create(model="q8_0", prompt="Once upon a time", max_tokens=6, temperature=1, logprobs=2)
lp = c.choices[0].logprobs
assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == len(lp.text_offset) == 6, lp
assert all(len(t) == 2 for t in lp.top_logprobs), lp
again = client.completions.create(model="q8_0", prompt="Once upon a time", max_tokens=6, temperature=1,
                                  seed=c.model_extra["seed"])
assert again.choices[0].text == c.choices[0].text
streamed = client.chat.completions.create(model="q8_0", messages=messages, max_tokens=4, temperature=0, logprobs=True,
                                          top_logprobs=2, stream=True, stream_options={"include_usage": True})
got = [t for chunk in streamed for ch in chunk.choices if ch.logprobs for t in ch.logprobs.content]
assert [t.token for t in got] == [t.token for t in r.choices[0].logprobs.content], got
for kw in [dict(extra_body={"temprature": 1}), dict(tool_choice="required")]:
    try:
        client.chat.completions.create(model="q8_0", messages=messages, max_tokens=2, **kw)
    except openai.BadRequestError as e:
        print("refused:", e.body["message"])
    else:
        raise AssertionError(f"{kw} was taken")
print("all checks passed")
"#;
    serve::python_checks(&python, script, &[&server.url, KEY]);
}
