//! `titan serve`'s prompt cache as clients see it: real server processes on loopback, raw HTTP (and the
//! official `openai` client for the usage field), and every answer compared byte for byte with a cold
//! server's. Expected token counts come from `titan tokenize`, which tokenises as the server does.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use serde_json::{json, Value};

mod common;
use common::*;

/// A `titan serve` child with the Qwen3 template of the fixtures, killed when dropped.
struct Server(serve::Server);

impl std::ops::Deref for Server {
    type Target = serve::Server;
    fn deref(&self) -> &serve::Server {
        &self.0
    }
}

impl Server {
    fn start(model: &Path, extra: &[&str]) -> Server {
        Server(serve::Server::start(model, "templates/qwen3.jinja", extra))
    }

    /// The body of a request that must answer 200.
    fn call(&self, path: &str, body: Option<&Value>) -> String {
        let (status, text) = self.send(path, body, false);
        assert_eq!(status, 200, "{path}: {text}");
        text
    }

    fn metric(&self, name: &str) -> u64 {
        let text = self.call("/metrics", None);
        text.lines()
            .find_map(|l| l.strip_prefix(&format!("{name} ")))
            .unwrap_or_else(|| panic!("no {name} in\n{text}"))
            .parse()
            .unwrap()
    }
}

/// What a request answered, streamed or not.
#[derive(Debug)]
struct Answer {
    text: String,
    finish: String,
    prompt_tokens: u64,
    cached: u64,
    completion_tokens: u64,
}

impl Answer {
    /// Text, finish and lengths: what a cold server must answer alike.
    fn same_as(&self, other: &Answer) -> bool {
        (&self.text, &self.finish, self.prompt_tokens, self.completion_tokens)
            == (&other.text, &other.finish, other.prompt_tokens, other.completion_tokens)
    }

    /// Where a recurrent state stands after this request: its prompt and what it generated, less the last
    /// token when it ended by length (sampled, never computed).
    fn stands_at(&self) -> u64 {
        self.prompt_tokens + self.completion_tokens - u64::from(self.finish == "length")
    }
}

fn usage_of(usage: &Value) -> (u64, u64, u64) {
    let n = |v: &Value| v.as_u64().unwrap_or_else(|| panic!("not a count in {usage}"));
    (
        n(&usage["prompt_tokens"]),
        n(&usage["prompt_tokens_details"]["cached_tokens"]),
        n(&usage["completion_tokens"]),
    )
}

/// A greedy request of up to `max_tokens` to `/v1/chat/completions` (when `body` has messages) or
/// `/v1/completions`, streamed (with the usage chunk) or not.
fn ask(server: &Server, mut body: Value, stream: bool) -> Answer {
    let chat = body.get("messages").is_some();
    let path = if chat {
        "/v1/chat/completions"
    } else {
        "/v1/completions"
    };
    body["temperature"] = json!(0);
    if stream {
        body["stream"] = json!(true);
        body["stream_options"] = json!({"include_usage": true});
    }
    let text = server.call(path, Some(&body));
    if !stream {
        let v: Value = serde_json::from_str(&text).unwrap();
        let choice = &v["choices"][0];
        let t = if chat {
            &choice["message"]["content"]
        } else {
            &choice["text"]
        };
        let (prompt_tokens, cached, completion_tokens) = usage_of(&v["usage"]);
        return Answer {
            text: t.as_str().unwrap().to_owned(),
            finish: choice["finish_reason"].as_str().unwrap().to_owned(),
            prompt_tokens,
            cached,
            completion_tokens,
        };
    }
    let (mut out, mut finish, mut usage) = (String::new(), String::new(), None);
    for data in text.lines().filter_map(|l| l.strip_prefix("data: ")) {
        if data == "[DONE]" {
            break;
        }
        let chunk: Value = serde_json::from_str(data).unwrap();
        if let Some(c) = chunk["choices"].get(0) {
            let piece = if chat { &c["delta"]["content"] } else { &c["text"] };
            out.push_str(piece.as_str().unwrap_or(""));
            if let Some(f) = c["finish_reason"].as_str() {
                finish = f.to_owned();
            }
        }
        if !chunk["usage"].is_null() {
            usage = Some(usage_of(&chunk["usage"]));
        }
    }
    let (prompt_tokens, cached, completion_tokens) = usage.unwrap_or_else(|| panic!("no usage chunk in {text}"));
    Answer {
        text: out,
        finish,
        prompt_tokens,
        cached,
        completion_tokens,
    }
}

/// The tokens the server makes of a prompt text.
fn tokens(model: &Path, text: &str) -> Vec<u32> {
    let o = titan()
        .args(["tokenize", "--parse-special", "-m"])
        .arg(model)
        .arg(text)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    serde_json::from_slice(&o.stdout).unwrap()
}

/// A conversation as tests/fixtures/templates/qwen3.jinja renders it (no assistant turn after the last
/// user message), ready for the answer.
fn chatml(messages: &[(&str, &str)]) -> String {
    let mut s: String = messages
        .iter()
        .map(|(role, content)| format!("<|im_start|>{role}\n{content}<|im_end|>\n"))
        .collect();
    s.push_str("<|im_start|>assistant\n");
    s
}

fn chat_body(messages: &[(&str, &str)], max_tokens: usize) -> Value {
    let messages: Vec<Value> = messages
        .iter()
        .map(|(role, content)| json!({"role": role, "content": content}))
        .collect();
    json!({"messages": messages, "max_tokens": max_tokens})
}

fn common_prefix(a: &[u32], b: &[u32]) -> u64 {
    a.iter().zip(b).take_while(|(x, y)| x == y).count() as u64
}

/// The same greedy request twice, on both endpoints, streamed and not: the second reuses all of its prompt
/// but the last token (whose logits it needs), says so in `usage.prompt_tokens_details.cached_tokens`, and
/// answers the same bytes. `/metrics` counts the reused tokens.
#[test]
fn the_same_request_again_reuses_all_but_its_last_token() {
    let m = fixture("qwen3moe/q8_0.gguf");
    let server = Server::start(&m, &[]);
    let requests = [
        (
            json!({"prompt": "The quick brown fox jumps over the lazy dog", "max_tokens": 12}),
            false,
        ),
        (
            json!({"prompt": "Once upon a time, in a land far away", "max_tokens": 12}),
            true,
        ),
        (chat_body(&[("user", "Tell me about foxes.")], 12), false),
        (chat_body(&[("user", "Tell me about owls, please.")], 12), true),
    ];
    let mut reused = 0;
    for (i, (body, stream)) in requests.into_iter().enumerate() {
        let first = ask(&server, body.clone(), stream);
        let again = ask(&server, body.clone(), stream);
        println!("{body} (streamed: {stream}):\n  {first:?}\n  {again:?}");
        if i == 0 {
            assert_eq!(first.cached, 0, "a new server has nothing cached");
        }
        assert!(again.prompt_tokens > 1);
        assert_eq!(again.cached, again.prompt_tokens - 1, "{body}");
        assert!(again.same_as(&first), "{body}: {first:?} then {again:?}");
        reused += first.cached + again.cached;
    }
    assert_eq!(server.metric("titan_prompt_tokens_cached_total"), reused);

    // The official client reads the field: the same chat twice, then streamed with the usage chunk.
    let Some(python) = serve::python("the openai package") else {
        return;
    };
    let script = r#"
import sys, openai
client = openai.OpenAI(base_url=sys.argv[1] + "/v1", api_key="none", max_retries=0, timeout=60)
ask = dict(model="q8_0", messages=[{"role": "user", "content": "A question for the client"}], max_tokens=8, temperature=0)
first = client.chat.completions.create(**ask)
again = client.chat.completions.create(**ask)
usage = [c.usage for c in client.chat.completions.create(**ask, stream=True, stream_options={"include_usage": True}) if c.usage]
for u in (first.usage, again.usage, usage[0]):
    print(u.prompt_tokens, u.prompt_tokens_details.cached_tokens)
assert again.choices[0].message.content == first.choices[0].message.content
"#;
    let o = Command::new(python).args(["-c", script, &server.url]).output().unwrap();
    let out = String::from_utf8_lossy(&o.stdout);
    println!("openai client:\n{out}");
    assert!(o.status.success(), "{out}{}", stderr(&o));
    let counts: Vec<(u64, u64)> = out
        .lines()
        .map(|l| {
            let (p, c) = l.split_once(' ').unwrap();
            (p.parse().unwrap(), c.parse().unwrap())
        })
        .collect();
    let p = counts[0].0;
    assert_eq!(counts[1..], [(p, p - 1), (p, p - 1)], "{out}");
}

/// A prompt that shares a beginning with an earlier one and then differs reuses exactly the common prefix
/// (in tokens), and computes the rest, in chunks of `-b 5` here, to the same bytes as a fresh server that
/// computes it all.
#[test]
fn a_shared_prefix_is_reused_and_the_rest_equals_a_cold_run() {
    let m = fixture("qwen3moe/q8_0.gguf");
    let warm = Server::start(&m, &["-b", "5"]);
    let first = "The quick brown fox jumps over the lazy dog. It was a sunny day in the forest";
    let second = "The quick brown fox jumps over the lazy dog. Then it ran home to sleep";
    let system = ("system", "You are a helpful assistant who answers in short sentences.");
    let chats = [
        [system, ("user", "What do foxes eat?")],
        [system, ("user", "Where do owls sleep?")],
    ];
    let cases = [
        (
            json!({"prompt": first, "max_tokens": 8}),
            json!({"prompt": second, "max_tokens": 16}),
            (tokens(&m, first), tokens(&m, second)),
        ),
        (
            chat_body(&chats[0], 8),
            chat_body(&chats[1], 16),
            (tokens(&m, &chatml(&chats[0])), tokens(&m, &chatml(&chats[1]))),
        ),
    ];
    let mut answers = Vec::new();
    for (stream, (earlier, later, (a, b))) in [false, true].into_iter().zip(&cases) {
        let shared = common_prefix(a, b);
        assert!(shared > 4 && shared < a.len() as u64, "{shared} of {a:?} and {b:?}");
        ask(&warm, earlier.clone(), stream);
        let got = ask(&warm, later.clone(), stream);
        println!("{later}: {got:?}, {shared} tokens shared");
        assert_eq!(got.prompt_tokens, b.len() as u64);
        assert_eq!(got.cached, shared, "{later}");
        answers.push((later, stream, got));
    }
    drop(warm);
    let cold = Server::start(&m, &[]);
    for (body, stream, warm) in answers {
        let got = ask(&cold, body.clone(), stream);
        assert_eq!(got.cached, 0);
        assert!(got.same_as(&warm), "{body}: warm {warm:?}, cold {got:?}");
    }
}

/// A streamed request of `body` to /v1/completions, open until the connection is dropped: returned once its
/// first chunk has come, so that it holds a slot.
fn stream_open(server: &Server, body: &Value) -> TcpStream {
    let mut s = TcpStream::connect(server.url.trim_start_matches("http://")).unwrap();
    let body = body.to_string();
    write!(
        s,
        "POST /v1/completions HTTP/1.1\r\nHost: test\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut seen = Vec::new();
    let mut b = [0u8; 4096];
    while !String::from_utf8_lossy(&seen).contains("data: ") {
        let n = s.read(&mut b).unwrap();
        assert!(n > 0, "closed: {}", String::from_utf8_lossy(&seen));
        seen.extend_from_slice(&b[..n]);
    }
    s
}

/// With three slots, each keeps its own cache: a request goes to the free slot holding the longest prefix
/// of its prompt (B's, not A's shorter one), the others keep theirs; a request that shares nothing takes a
/// never-used slot, then the least recently used one, whose cache is then gone. Every answer equals that of
/// a server with `--no-prompt-cache`, which reports nothing cached.
#[test]
fn a_request_goes_to_the_free_slot_with_the_longest_prefix() {
    let m = fixture("qwen3moe/q8_0.gguf");
    let server = Server::start(&m, &["--parallel", "3"]);
    let (a, b, b1, a1, z, q, b2) = (0, 1, 2, 3, 4, 5, 6);
    let p = [
        "The cat sat on the mat and looked at the birds outside the window",
        "The cat sat on the mat and slept all afternoon in the warm sun",
        "The cat sat on the mat and slept all night in the warm sun",
        "The cat sat on the mat and looked at the birds inside the cage",
        "Zebras run across the open plain at dawn, raising dust",
        "Quietly, nothing much happens here",
        "The cat sat on the mat and slept all night in the cold rain",
    ];
    let t: Vec<Vec<u32>> = p.iter().map(|s| tokens(&m, s)).collect();
    let lcp = |i: usize, j: usize| common_prefix(&t[i], &t[j]);
    assert!(lcp(b, b1) > lcp(a, b1) && lcp(a, b1) > 0, "B's prefix is the longer");
    assert!(lcp(b1, b2) > lcp(a1, b2) && lcp(a1, b2) > 0);
    let body = |i: usize| json!({"prompt": p[i], "max_tokens": 6});
    // A slot of their own for A and B, which share a prefix: A generates (until it is dropped) while B is
    // admitted.
    let generating = stream_open(&server, &json!({"prompt": p[a], "stream": true, "temperature": 0}));
    let mut answers = vec![(b, ask(&server, body(b), false))];
    drop(generating);
    // The engine frees A's slot at its next step; let it get there.
    std::thread::sleep(Duration::from_millis(500));
    for i in [b1, a1, z, q, b2] {
        answers.push((i, ask(&server, body(i), false)));
    }
    for (i, got) in &answers {
        println!("{:?}: {got:?}", p[*i]);
    }
    let cached: Vec<u64> = answers.iter().map(|(_, got)| got.cached).collect();
    assert_eq!(cached[0], 0, "B beside A, generating");
    assert_eq!(cached[1], lcp(b, b1), "B' in B's slot");
    assert_eq!(cached[2], lcp(a, a1), "A' in A's slot, kept");
    // Z shares nothing: the third slot, never used. Q neither: the least recently used, B''s.
    assert_eq!(cached[3..5], [0, 0]);
    assert_eq!(cached[5], lcp(a1, b2), "B'' in A''s slot: B''s is gone");
    assert_eq!(
        server.metric("titan_prompt_tokens_cached_total"),
        cached.iter().sum::<u64>()
    );
    drop(server);
    let cold = Server::start(&m, &["--parallel", "3", "--no-prompt-cache"]);
    for (i, warm) in &answers {
        let got = ask(&cold, body(*i), false);
        assert_eq!(got.cached, 0);
        assert!(got.same_as(warm), "{}: warm {warm:?}, cold {got:?}", p[*i]);
    }
    assert_eq!(cold.metric("titan_prompt_tokens_cached_total"), 0);
}

/// Models with Gated DeltaNet layers: a recurrent state cannot be rewound, so a follow-up turn (turn 1, its
/// answer, a new message) reuses only where a state exists — the end of turn 1's prompt (its checkpoint) or
/// where the state stands after the answer — and answers as a cold server does. Turn 2 with an edited
/// answer reuses turn 1's prompt exactly; after it, the slot's checkpoint has moved past the unedited
/// conversation's common prefix, so that one starts cold, where the attention model reuses the prefix.
#[test]
fn a_follow_up_on_linear_attention_reuses_only_where_a_state_was_kept() {
    let turn1 = [("user", "Write a short poem about the sea and its waves.")];
    let next = ("user", "Now one about the mountains.");
    for f in ["qwen35moe/q8_0.gguf", "qwen3next/q8_0.gguf", "qwen3moe/q8_0.gguf"] {
        let m = fixture(f);
        let recurrent = !f.starts_with("qwen3moe");
        let cold = Server::start(&m, &["--no-prompt-cache"]);
        let p1 = tokens(&m, &chatml(&turn1)).len() as u64;

        let warm = Server::start(&m, &[]);
        let a1 = ask(&warm, chat_body(&turn1, 12), false);
        assert!(a1.same_as(&ask(&cold, chat_body(&turn1, 12), false)), "{f}: turn 1");
        let turn2 = [turn1[0], ("assistant", a1.text.as_str()), next];
        let a2 = ask(&warm, chat_body(&turn2, 12), true);
        let c2 = ask(&cold, chat_body(&turn2, 12), true);
        println!("{f}: turn 1 {a1:?}\n  turn 2 {a2:?}");
        assert!(a2.same_as(&c2), "{f}: turn 2 warm {a2:?}, cold {c2:?}");
        assert_eq!(c2.cached, 0);
        if recurrent {
            assert!(
                a2.cached == p1 || a2.cached == a1.stands_at(),
                "{f}: {} cached, where states exist at {p1} and {}",
                a2.cached,
                a1.stands_at()
            );
        } else {
            assert!(a2.cached >= p1, "{f}: {} cached, turn 1's prompt is {p1}", a2.cached);
        }

        // The answer edited before it is sent back: only turn 1's prompt is shared.
        let warm = Server::start(&m, &[]);
        let a1 = ask(&warm, chat_body(&turn1, 12), false);
        let edited = [turn1[0], ("assistant", "[edited]"), next];
        let t2e = tokens(&m, &chatml(&edited));
        assert_eq!(common_prefix(&tokens(&m, &chatml(&turn1)), &t2e), p1, "{f}");
        let e2 = ask(&warm, chat_body(&edited, 12), false);
        println!("  edited turn 2 {e2:?}");
        assert_eq!(e2.cached, p1, "{f}: the checkpoint at the end of turn 1's prompt");
        assert!(
            e2.same_as(&ask(&cold, chat_body(&edited, 12), false)),
            "{f}: edited turn 2"
        );
        // Then the unedited turn 2, in the same slot: it shares less than the edited turn's prompt.
        let turn2 = [turn1[0], ("assistant", a1.text.as_str()), next];
        let shared = common_prefix(&t2e, &tokens(&m, &chatml(&turn2)));
        let u2 = ask(&warm, chat_body(&turn2, 12), false);
        println!("  unedited turn 2 after it {u2:?}, {shared} tokens shared");
        assert!(shared >= p1 && shared < t2e.len() as u64);
        assert_eq!(u2.cached, if recurrent { 0 } else { shared }, "{f}");
        assert!(
            u2.same_as(&ask(&cold, chat_body(&turn2, 12), false)),
            "{f}: unedited turn 2"
        );
    }
}
