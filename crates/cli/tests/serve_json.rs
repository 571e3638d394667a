//! Structured output of `titan serve` (`response_format`), as the official `openai` client sees it against a
//! real server on a random-weight fixture: at temperature 1 such a model writes anything at all, so the
//! grammar alone keeps the text to JSON. Every answer is parsed with Python's `json` and validated with the
//! `jsonschema` package (not with anything of TITAN's); several slots decode at once, with and without a
//! format, streamed and not, and a repeated request goes through the prompt cache.

mod common;
use common::serve::Server;
use common::*;

/// Runs `script` (Python, with `openai` and `jsonschema`) against a fresh server; it prints what it checked
/// and ends with "all checks passed".
fn run_python(script: &str) {
    let Some(python) = serve::python("the openai and jsonschema packages") else {
        return;
    };
    let server = Server::start(
        &fixture("qwen3moe/q8_0.gguf"),
        "templates/qwen3.jinja",
        &["--parallel", "4"],
    );
    serve::python_checks(&python, &format!("{PRELUDE}{script}"), &[&server.url]);
}

/// The client, the schema the tests ask for, and helpers to ask for it streamed or not.
const PRELUDE: &str = r#"
import concurrent.futures, json, sys, urllib.request
import jsonschema, openai
client = openai.OpenAI(base_url=sys.argv[1] + "/v1", api_key="unused", max_retries=0, timeout=300)
MODEL = "q8_0"
MESSAGES = [{"role": "user", "content": "Describe a person as JSON."}]
SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "minLength": 1, "maxLength": 12},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "role": {"enum": ["king", "queen", "knight"]},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 6}, "maxItems": 3},
        "alive": {"type": "boolean"},
    },
    "required": ["name", "age", "role", "tags", "alive"],
    "additionalProperties": False,
}
FORMAT = {"type": "json_schema", "json_schema": {"name": "person", "schema": SCHEMA, "strict": True}}

def chat(stream, **kw):
    """The text, finish reason and usage of a chat completion, streamed or not."""
    if not stream:
        r = client.chat.completions.create(model=MODEL, messages=MESSAGES, **kw)
        return r.choices[0].message.content, r.choices[0].finish_reason, r.usage
    parts, finish, usage = [], None, None
    for chunk in client.chat.completions.create(model=MODEL, messages=MESSAGES, stream=True,
                                                stream_options={"include_usage": True}, **kw):
        usage = chunk.usage or usage
        for c in chunk.choices:
            parts.append(c.delta.content or "")
            finish = c.finish_reason or finish
    return "".join(parts), finish, usage

def token_id(text):
    """The one token of `text`, from the server's /tokenize."""
    req = urllib.request.Request(sys.argv[1] + "/tokenize", data=json.dumps({"content": text}).encode(),
                                 headers={"Content-Type": "application/json"})
    [t] = json.loads(urllib.request.urlopen(req).read())["tokens"]
    return t

# Free JSON (json_object) from a random model is a string that never ends: a bias towards the quote and the
# closing brace (which the grammar allows only where they are JSON) ends its strings and objects.
TERSE = {str(token_id('"')): 6, str(token_id("}")): 6}

def check(cond, what):
    if not cond:
        raise AssertionError(what)
    print("ok:", what)
"#;

/// Twenty seeds at temperature 1, ten streamed, ten not, four at a time beside requests without a format:
/// every text parses and the schema validates it, and each ends where its JSON does ("stop").
#[test]
fn json_schema_output_validates_for_twenty_seeds() {
    run_python(
        r#"
def constrained(seed):
    return chat(seed % 2 == 1, response_format=FORMAT, temperature=1, seed=seed, max_tokens=400)

def free(seed):
    return chat(seed % 2 == 0, temperature=1, seed=seed, max_tokens=24)

with concurrent.futures.ThreadPoolExecutor(6) as pool:
    plain = [pool.submit(free, s) for s in range(4)]
    answers = list(pool.map(constrained, range(20)))
    plain = [p.result() for p in plain]
for seed, (text, finish, usage) in enumerate(answers):
    value = json.loads(text)
    jsonschema.validate(value, SCHEMA)
    check(finish == "stop", f"seed {seed} ({'streamed' if seed % 2 else 'whole'}): {text} validates and stops there")
check(all(f in ("stop", "length") for _, f, _ in plain), "requests without a format ran beside them")
# Not JSON when nobody asks for it (the model is random): the format was what kept the texts to JSON.
def parses(t):
    try:
        json.loads(t)
        return True
    except ValueError:
        return False
check(not all(parses(t) for t, _, _ in plain), "the unconstrained texts are not JSON")
# The same request again reuses the prompt's cache and writes the same JSON.
again, finish, usage = chat(False, response_format=FORMAT, temperature=1, seed=3, max_tokens=400)
check(again == answers[3][0] and usage.prompt_tokens_details.cached_tokens > 0,
      f"seed 3 again, from the prompt cache ({usage.prompt_tokens_details.cached_tokens} tokens): the same text")
print("all checks passed")
"#,
    );
}

/// `json_object`: a JSON object, whole or streamed, on chat and on completions (through `extra_body`, as
/// the client has no `response_format` there); `max_tokens` reached first is "length".
#[test]
fn json_object_output_parses_and_max_tokens_cuts_it() {
    run_python(
        r#"
OBJECT = {"type": "json_object"}
for stream in (False, True):
    for seed in range(4):
        text, finish, _ = chat(stream, response_format=OBJECT, temperature=1, seed=seed, max_tokens=400,
                               logit_bias=TERSE)
        check(finish == "stop" and isinstance(json.loads(text), dict), f"json_object seed {seed} stream {stream}: {text}")
for seed in range(2):
    r = client.completions.create(model=MODEL, prompt="A person as JSON:", temperature=1, seed=seed, max_tokens=400,
                                  extra_body={"response_format": FORMAT})
    jsonschema.validate(json.loads(r.choices[0].text), SCHEMA)
    check(r.choices[0].finish_reason == "stop", f"completions with a schema, seed {seed}: {r.choices[0].text}")
text, finish, usage = chat(True, response_format=FORMAT, temperature=1, seed=5, max_tokens=3)
check(finish == "length" and usage.completion_tokens == 3 and text.startswith("{"), f"cut at 3 tokens: {text!r}")
print("all checks passed")
"#,
    );
}

/// What cannot be enforced is refused before it is queued: a 400 whose message names the cause and whose
/// `param` is `response_format`, streamed or not; the server serves on.
#[test]
fn a_schema_that_cannot_be_enforced_is_a_400_naming_the_cause() {
    run_python(
        r#"
bad = [
    ({"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "nonsense"}}}, "nonsense"),
    ({"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "integer", "minimum": 5, "maximum": 2}}}, "cannot be enforced"),
    ({"type": "json_schema", "json_schema": {"name": "x", "schema": "{}"}}, "schema must be a JSON schema object"),
    ({"type": "xml"}, '"xml"'),
]
for stream in (False, True):
    for fmt, cause in bad:
        try:
            chat(stream, response_format=fmt, max_tokens=8)
        except openai.BadRequestError as e:
            err = e.body
            check(err["param"] == "response_format" and cause in err["message"], f"{fmt}: 400 {err['message']}")
        else:
            raise AssertionError(f"{fmt} was taken")
text, finish, _ = chat(False, response_format={"type": "json_object"}, temperature=0, max_tokens=400, logit_bias=TERSE)
check(isinstance(json.loads(text), dict), "and the server serves on")
print("all checks passed")
"#,
    );
}
