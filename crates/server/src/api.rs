//! The OpenAI-shaped requests and responses: parsing and checking a body into a [`Job`], and turning the
//! engine's [`Event`]s into a completion, a chat completion, or a stream of their chunks.

use std::collections::BTreeMap;

use serde::Deserialize;
use serde_json::{json, Map, Value};
use titan_engine::sampler::{TokenLogprobs, BAN};
use titan_engine::SamplerOptions;

use crate::error::ApiError;
use crate::fields::Endpoint;
use crate::logprobs::Logprobs;
use crate::scheduler::{Event, Finish, Usage};
use crate::template::{ChatTemplate, Message};
use crate::tool_calls::{self, Format, Item, Parser};

/// The most `top_logprobs` (chat) or `logprobs` (completions) a request may ask for, as OpenAI's chat.
pub const MAX_TOP_LOGPROBS: u32 = 20;

/// What responses give as `system_fingerprint`: the server and its version.
const FINGERPRINT: &str = concat!("titan-", env!("CARGO_PKG_VERSION"));

/// Sampling and length fields common to both endpoints (names as OpenAI and llama-server take them).
#[derive(Deserialize, Default)]
#[serde(default)]
pub struct Params {
    pub model: Option<String>,
    pub max_tokens: Option<i64>,
    pub max_completion_tokens: Option<i64>,
    pub temperature: Option<f32>,
    pub top_p: Option<f32>,
    pub top_k: Option<usize>,
    pub min_p: Option<f32>,
    pub repeat_penalty: Option<f32>,
    pub frequency_penalty: Option<f32>,
    pub presence_penalty: Option<f32>,
    /// Token id (a string, as JSON keys are) → bias added to its logit.
    pub logit_bias: Option<BTreeMap<String, f32>>,
    /// None: a random one, given back in the response.
    pub seed: Option<u64>,
    pub stop: Option<Stop>,
    pub stream: bool,
    pub stream_options: Option<StreamOptions>,
    pub n: Option<u32>,
    /// Structured output: see [`crate::constraint::Grammars::response_format`].
    pub response_format: Option<Value>,
}

#[derive(Deserialize)]
#[serde(untagged)]
pub enum Stop {
    One(String),
    Many(Vec<String>),
}

#[derive(Deserialize, Default)]
#[serde(default)]
pub struct StreamOptions {
    pub include_usage: bool,
}

#[derive(Deserialize)]
pub struct ChatRequest {
    pub messages: Vec<ChatMessage>,
    /// Chat takes `logprobs: true`, and `top_logprobs: N` with it.
    #[serde(default)]
    pub logprobs: bool,
    #[serde(default)]
    pub top_logprobs: Option<u32>,
    /// OpenAI's tool objects, `{"type": "function", "function": {"name", "description", "parameters"}}`.
    #[serde(default)]
    pub tools: Option<Vec<Value>>,
    /// "none", "auto", "required", or `{"type": "function", "function": {"name": …}}`.
    #[serde(default)]
    pub tool_choice: Option<Value>,
    /// Whether a forced answer may hold more than one call (OpenAI's default: it may).
    #[serde(default)]
    pub parallel_tool_calls: Option<bool>,
    #[serde(flatten)]
    pub params: Params,
    /// The fields none of the above read: checked by [`crate::fields::check`].
    #[serde(flatten)]
    pub rest: Map<String, Value>,
}

#[derive(Deserialize)]
pub struct ChatMessage {
    pub role: String,
    /// A string, or OpenAI's list of parts (`[{"type": "text", "text": …}]`), whose texts are joined.
    #[serde(default)]
    pub content: Value,
    /// An assistant's calls, as the server gave them.
    #[serde(default)]
    pub tool_calls: Option<Vec<Value>>,
    /// A `tool` message: the call it answers.
    #[serde(default)]
    pub tool_call_id: Option<String>,
    #[serde(default)]
    pub name: Option<String>,
}

/// What a request asks of the model's tools.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ToolChoice {
    /// The model must not call: the tools are still rendered (as llama-server does), its answer is not
    /// parsed for calls.
    None,
    Auto,
    /// At least one call, forced by a grammar.
    Required,
    /// A call of this function, forced by a grammar.
    Named(String),
}

/// A request's tools as the answer needs them: the syntax to parse and the tools (whose schemas the
/// parser and a forcing grammar read).
pub struct ToolUse {
    pub format: Format,
    pub tools: Vec<Value>,
    pub choice: ToolChoice,
    /// `parallel_tool_calls`: a forced answer may hold several calls.
    pub parallel: bool,
}

impl ToolUse {
    /// The grammar (llguidance's Lark) that forces a call, for `tool_choice` "required" or a named function;
    /// none for "auto". A syntax the server cannot force is a 400.
    pub fn forcing(&self) -> Result<Option<String>, ApiError> {
        let named = match &self.choice {
            ToolChoice::Required => None,
            ToolChoice::Named(name) => Some(name.as_str()),
            ToolChoice::None | ToolChoice::Auto => return Ok(None),
        };
        tool_calls::forcing::grammar(self.format, &self.tools, named, self.parallel)
            .map(Some)
            .map_err(|why| {
                ApiError::bad_request(why)
                    .param("tool_choice")
                    .code("unsupported_parameter")
            })
    }
}

/// `tools`, checked: each an OpenAI function tool with a name.
fn check_tools(tools: &[Value]) -> Result<(), ApiError> {
    for (i, tool) in tools.iter().enumerate() {
        let bad = |why: &str| Err(ApiError::bad_request(format!("tools[{i}]: {why}")).param(format!("tools[{i}]")));
        if tool.get("type").and_then(Value::as_str) != Some("function") {
            return bad("only {\"type\": \"function\", \"function\": {…}} tools are supported");
        }
        let function = &tool["function"];
        match function.get("name").and_then(Value::as_str) {
            Some(name) if !name.is_empty() => {}
            _ => return bad("function.name must be a non-empty string"),
        }
        if function
            .get("parameters")
            .is_some_and(|p| !p.is_object() && !p.is_null())
        {
            return bad("function.parameters must be a JSON schema object");
        }
    }
    Ok(())
}

/// `tool_choice` against the request's `tools`.
fn tool_choice(choice: Option<&Value>, tools: &[Value]) -> Result<ToolChoice, ApiError> {
    let bad = |why: String| Err(ApiError::bad_request(why).param("tool_choice"));
    let choice = match choice {
        None | Some(Value::Null) if tools.is_empty() => ToolChoice::None,
        None | Some(Value::Null) => ToolChoice::Auto,
        Some(Value::String(s)) => match s.as_str() {
            "none" => ToolChoice::None,
            "auto" => ToolChoice::Auto,
            "required" => ToolChoice::Required,
            _ => return bad(format!("tool_choice {s:?} is none of \"none\", \"auto\", \"required\" or a function")),
        },
        Some(v) => match (v.get("type").and_then(Value::as_str), v["function"]["name"].as_str()) {
            (Some("function"), Some(name)) => {
                if !tools.iter().any(|t| t["function"]["name"] == name) {
                    return bad(format!("tool_choice names the function {name:?}, which is not among the tools"));
                }
                ToolChoice::Named(name.to_owned())
            }
            _ => return bad("tool_choice must be \"none\", \"auto\", \"required\" or {\"type\": \"function\", \"function\": {\"name\": …}}".into()),
        },
    };
    if tools.is_empty() && matches!(choice, ToolChoice::Required | ToolChoice::Named(_)) {
        return bad("tool_choice asks for a call, but the request has no tools".into());
    }
    Ok(choice)
}

/// An assistant message's `tool_calls` as templates read them: `function.arguments` as the JSON object
/// its text spells. OpenAI sends the text; templates print it with `tojson` or walk it with `|items`
/// (Qwen3.5, gpt-oss), so, as llama-server does, it is parsed first. transformers would hand the text
/// through (Qwen2.5 and Qwen3 then print it as it came).
fn tool_calls_for_template(calls: &[Value], message: usize) -> Result<Vec<Value>, ApiError> {
    calls
        .iter()
        .enumerate()
        .map(|(i, call)| {
            let at = format!("messages[{message}].tool_calls[{i}]");
            let bad = |why: &str| ApiError::bad_request(format!("{at}: {why}")).param(at.clone());
            let mut call = call.clone();
            let function = call
                .get_mut("function")
                .and_then(Value::as_object_mut)
                .ok_or_else(|| bad("a call needs a function: {\"name\", \"arguments\"}"))?;
            if !function.get("name").is_some_and(Value::is_string) {
                return Err(bad("function.name must be a string"));
            }
            let arguments = match function.get("arguments") {
                None | Some(Value::Null) => Value::Object(Map::new()),
                Some(Value::String(text)) => {
                    serde_json::from_str(text).map_err(|e| bad(&format!("function.arguments is not JSON ({e})")))?
                }
                Some(v) => v.clone(),
            };
            function.insert("arguments".into(), arguments);
            if let Some(c) = call.as_object_mut() {
                c.entry("type").or_insert_with(|| "function".into());
            }
            Ok(call)
        })
        .collect()
}

#[derive(Deserialize)]
pub struct CompletionRequest {
    pub prompt: Value,
    /// Completions take `logprobs: N`: the chosen token's and the N most likely tokens'.
    #[serde(default)]
    pub logprobs: Option<u32>,
    #[serde(default)]
    pub echo: bool,
    #[serde(flatten)]
    pub params: Params,
    /// The fields none of the above read: checked by [`crate::fields::check`].
    #[serde(flatten)]
    pub rest: Map<String, Value>,
}

impl ChatMessage {
    pub fn text(&self) -> Result<String, ApiError> {
        match &self.content {
            Value::String(s) => Ok(s.clone()),
            Value::Null => Ok(String::new()),
            Value::Array(parts) => parts
                .iter()
                .map(|p| {
                    match (
                        p.get("type").and_then(Value::as_str),
                        p.get("text").and_then(Value::as_str),
                    ) {
                        (Some("text"), Some(t)) => Ok(t),
                        _ => Err(ApiError::bad_request(
                            "only text parts are supported in message content",
                        )),
                    }
                })
                .collect::<Result<Vec<_>, _>>()
                .map(|t| t.concat()),
            _ => Err(ApiError::bad_request(
                "message content must be a string or a list of text parts",
            )),
        }
    }
}

/// The prompt of a completion request: a string (a one-element list of strings, or a list of token ids,
/// as the API allows, is taken too).
pub fn completion_prompt(v: &Value) -> Result<PromptInput, ApiError> {
    match v {
        Value::String(s) => Ok(PromptInput::Text(s.clone())),
        Value::Array(a) if a.len() == 1 && a[0].is_string() => {
            Ok(PromptInput::Text(a[0].as_str().unwrap_or_default().to_string()))
        }
        Value::Array(a) if !a.is_empty() && a.iter().all(Value::is_u64) => {
            let ids = a
                .iter()
                .map(|x| x.as_u64().and_then(|x| u32::try_from(x).ok()))
                .collect::<Option<Vec<u32>>>();
            ids.map(PromptInput::Tokens)
                .ok_or_else(|| ApiError::bad_request("prompt token ids must be u32"))
        }
        _ => Err(ApiError::bad_request(
            "prompt must be a string, a list of one string, or a list of token ids",
        )),
    }
}

pub enum PromptInput {
    Text(String),
    Tokens(Vec<u32>),
}

/// What a request asks of the engine, checked: sampler values in range, one choice, lengths that fit, a
/// seed (the one given, or a random one).
pub struct Settings {
    pub sampler: SamplerOptions,
    pub max_tokens: usize,
    pub stop: Vec<String>,
}

impl Params {
    /// The settings of a request whose prompt has `prompt_len` tokens, for a context of `ctx_size` and a
    /// vocabulary of `n_vocab`; `length` is what the request calls `max_tokens`, as errors name it.
    pub fn settings(
        &self,
        prompt_len: usize,
        ctx_size: usize,
        n_vocab: usize,
        length: &'static str,
    ) -> Result<Settings, ApiError> {
        match self.n {
            Some(0) => return Err(ApiError::bad_request("n is 0; it must be 1").param("n")),
            Some(n) if n > 1 => {
                return Err(ApiError::bad_request(format!(
                    "n is {n}: more than one choice per request is not supported yet"
                ))
                .param("n")
                .code("unsupported_parameter"))
            }
            _ => {}
        }
        if prompt_len == 0 {
            return Err(ApiError::bad_request("the prompt has no tokens").param("prompt"));
        }
        if prompt_len >= ctx_size {
            return Err(ApiError::bad_request(format!(
                "the prompt has {prompt_len} tokens; the context holds {ctx_size} (leave room for one generated token)"
            ))
            .code("context_length_exceeded"));
        }
        let room = ctx_size - prompt_len;
        let max_tokens = match self.max_completion_tokens.or(self.max_tokens) {
            None => room,
            Some(m) if m >= 1 && m as u64 <= room as u64 => m as usize,
            Some(m) => {
                return Err(ApiError::bad_request(format!(
                    "{length} is {m}; with this prompt it must be in 1..={room}"
                ))
                .param(length))
            }
        };
        let d = SamplerOptions::default();
        let sampler = SamplerOptions {
            temperature: self.temperature.unwrap_or(d.temperature),
            top_k: self.top_k.unwrap_or(d.top_k),
            top_p: self.top_p.unwrap_or(d.top_p),
            min_p: self.min_p.unwrap_or(d.min_p),
            repeat_penalty: self.repeat_penalty.unwrap_or(d.repeat_penalty),
            frequency_penalty: self.frequency_penalty.unwrap_or(d.frequency_penalty),
            presence_penalty: self.presence_penalty.unwrap_or(d.presence_penalty),
            logit_bias: self.logit_bias(n_vocab)?,
            seed: self.seed.unwrap_or_else(random_seed),
            ..d
        };
        sampler.check().map_err(ApiError::bad_request)?;
        let stop = match &self.stop {
            None => Vec::new(),
            Some(Stop::One(s)) => vec![s.clone()],
            Some(Stop::Many(v)) => v.clone(),
        };
        if stop.len() > 4 || stop.iter().any(String::is_empty) {
            return Err(ApiError::bad_request("stop takes at most 4 non-empty strings").param("stop"));
        }
        Ok(Settings {
            sampler,
            max_tokens,
            stop,
        })
    }

    /// `logit_bias` as (token id, bias) in id order; every id in the vocabulary, and not every token banned.
    fn logit_bias(&self, n_vocab: usize) -> Result<Vec<(u32, f32)>, ApiError> {
        let Some(map) = &self.logit_bias else {
            return Ok(Vec::new());
        };
        let mut bias = Vec::with_capacity(map.len());
        for (key, &b) in map {
            let id = key
                .parse::<u32>()
                .ok()
                .filter(|&id| (id as usize) < n_vocab)
                .ok_or_else(|| {
                    ApiError::bad_request(format!(
                        "logit_bias: {key:?} is not a token id of this model (0..{n_vocab})"
                    ))
                    .param("logit_bias")
                })?;
            bias.push((id, b));
        }
        bias.sort_by_key(|&(id, _)| id);
        if bias.iter().filter(|&&(_, b)| b <= BAN).count() >= n_vocab {
            return Err(ApiError::bad_request("logit_bias bans every token of the vocabulary").param("logit_bias"));
        }
        Ok(bias)
    }
}

/// A seed for a request that gives none: different for every request and every run of the server, below
/// 2^53 so that it survives a JavaScript number (the chat page shows it, a client may send it back).
fn random_seed() -> u64 {
    use std::hash::{BuildHasher, RandomState};
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(0);
    // The standard library keys each RandomState from the operating system's random source.
    RandomState::new().hash_one(NEXT.fetch_add(1, Ordering::Relaxed)) >> 11
}

/// A body as JSON of `T`; a malformed one is a 400 that quotes serde's reason.
pub(crate) fn from_json<T: serde::de::DeserializeOwned>(body: &[u8]) -> Result<T, ApiError> {
    serde_json::from_slice(body).map_err(|e| ApiError::bad_request(format!("the body is not a valid request: {e}")))
}

/// A `/v1/completions` body, checked as far as it can be without the model: the request and its prompt.
pub fn completion_body(body: &[u8]) -> Result<(CompletionRequest, PromptInput), ApiError> {
    let r: CompletionRequest = from_json(body)?;
    crate::fields::check(Endpoint::Completions, &r.rest)?;
    if r.echo {
        return Err(ApiError::bad_request("echo is not supported")
            .param("echo")
            .code("unsupported_parameter"));
    }
    if let Some(n) = r.logprobs.filter(|&n| n > MAX_TOP_LOGPROBS) {
        return Err(
            ApiError::bad_request(format!("logprobs is {n}; it must be in 0..={MAX_TOP_LOGPROBS}")).param("logprobs"),
        );
    }
    let prompt = completion_prompt(&r.prompt)?;
    Ok((r, prompt))
}

/// A `/v1/chat/completions` body: the request, its prompt text, rendered by the model's `template` into
/// at most `max_bytes` bytes (see [`render`]), and the tools its answer is parsed for (none when it has no
/// tools or `tool_choice` is "none").
pub fn chat_body(
    body: &[u8],
    template: Option<&ChatTemplate>,
    max_bytes: usize,
) -> Result<(ChatRequest, String, Option<ToolUse>), ApiError> {
    let r: ChatRequest = from_json(body)?;
    crate::fields::check(Endpoint::Chat, &r.rest)?;
    match r.top_logprobs {
        Some(n) if n > MAX_TOP_LOGPROBS => {
            return Err(
                ApiError::bad_request(format!("top_logprobs is {n}; it must be in 0..={MAX_TOP_LOGPROBS}"))
                    .param("top_logprobs"),
            )
        }
        Some(_) if !r.logprobs => {
            return Err(ApiError::bad_request("top_logprobs needs logprobs: true").param("top_logprobs"))
        }
        _ => {}
    }
    let template = template.ok_or_else(no_template)?;
    if r.messages.is_empty() {
        return Err(ApiError::bad_request("messages is empty").param("messages"));
    }
    let tools = r.tools.clone().unwrap_or_default();
    check_tools(&tools)?;
    let choice = tool_choice(r.tool_choice.as_ref(), &tools)?;
    let mut tool_use = tool_use(template, tools.clone(), choice)?;
    if let Some(t) = tool_use.as_mut() {
        t.parallel = r.parallel_tool_calls.unwrap_or(true);
    }
    let messages = r
        .messages
        .iter()
        .enumerate()
        .map(|(i, m)| {
            Ok(Message {
                role: m.role.clone(),
                content: m.text()?,
                tool_calls: m
                    .tool_calls
                    .as_deref()
                    .map(|c| tool_calls_for_template(c, i))
                    .transpose()?,
                tool_call_id: m.tool_call_id.clone(),
                name: m.name.clone(),
            })
        })
        .collect::<Result<Vec<_>, ApiError>>()?;
    let text = render(template, &messages, &tools, max_bytes)?;
    Ok((r, text, tool_use))
}

/// The answer to a chat request when the model has no chat template and none was given.
pub fn no_template() -> ApiError {
    ApiError::bad_request("the model has no chat template (tokenizer.chat_template); start titan serve with --chat-template FILE, or use /v1/completions")
}

/// A conversation rendered by the model's `template`, with `tools`, into at most `max_bytes` bytes. A
/// template that refuses the conversation (`raise_exception`) is the request's fault (400); one that fails
/// otherwise, runs out of fuel or writes past `max_bytes` is the server's (500).
pub fn render(
    template: &ChatTemplate,
    messages: &[Message],
    tools: &[Value],
    max_bytes: usize,
) -> Result<String, ApiError> {
    template.render(messages, tools, max_bytes).map_err(|e| {
        if e.is_the_conversations() {
            ApiError::bad_request(e.to_string())
        } else {
            ApiError::internal(format!(
                "{e} ({}): a fault of the server's chat template, not of the request",
                template.origin()
            ))
        }
    })
}

/// Whether and how a request's tools can be served by `template`: a template that never mentions tools
/// would drop them silently, and one whose call syntax the server does not parse would leave calls as
/// text; both are a 400 unless the request asks for no call ("none").
fn tool_use(template: &ChatTemplate, tools: Vec<Value>, choice: ToolChoice) -> Result<Option<ToolUse>, ApiError> {
    if tools.is_empty() || choice == ToolChoice::None {
        return Ok(None);
    }
    if !template.knows_tools() {
        return Err(ApiError::bad_request(format!(
            "the request has tools, but {} does not render tools (it never mentions them): start titan serve \
             with --chat-template FILE of a template that does, or send tool_choice \"none\"",
            template.origin()
        ))
        .param("tools")
        .code("unsupported_parameter"));
    }
    let Some(format) = template.tool_format() else {
        return Err(ApiError::bad_request(format!(
            "the request has tools, but {} writes tool calls in a syntax this server does not parse (it \
             parses Qwen's <tool_call>, gpt-oss harmony, DeepSeek and Mistral's [TOOL_CALLS]); send \
             tool_choice \"none\" to use it without calls",
            template.origin()
        ))
        .param("tools")
        .code("unsupported_parameter"));
    };
    Ok(Some(ToolUse {
        format,
        tools,
        choice,
        parallel: true,
    }))
}

/// Which endpoint a response is for: the shapes differ in their object names and where the text goes.
#[derive(Clone, Copy)]
pub enum Kind {
    Chat,
    Completion,
}

/// Builds the response objects of one request.
pub struct Responder {
    pub kind: Kind,
    pub id: String,
    pub model: String,
    pub created: u64,
    /// The sampler's seed, given back so that the request can be repeated.
    pub seed: u64,
    /// When the request asked for log-probabilities: their shape, and where the text has got to.
    pub logprobs: Option<Logprobs>,
    /// With tools: the syntax of the model's calls and the tools, which the answer is parsed for.
    tools: Option<(Format, Vec<Value>)>,
    /// The streamed answer's parser (with tools), the calls given out so far, whether a chunk has been
    /// sent, and log-probabilities of tokens whose text is held back.
    parser: Option<Parser>,
    calls: usize,
    started: bool,
    held_logprobs: Vec<TokenLogprobs>,
}

impl Responder {
    pub fn new(kind: Kind, id: String, model: String, created: u64, logprobs: Option<Logprobs>) -> Responder {
        Responder {
            kind,
            id,
            model,
            created,
            seed: 0,
            logprobs,
            tools: None,
            parser: None,
            calls: 0,
            started: false,
            held_logprobs: Vec::new(),
        }
    }

    /// Parses the answer for calls of these tools in the model's `format`.
    pub fn with_tools(mut self, format: Format, tools: Vec<Value>) -> Responder {
        self.parser = Some(Parser::new(format, tools.clone()));
        self.tools = Some((format, tools));
        self
    }

    /// Whether the answer's control tokens must reach the text as their names: its tool-call syntax has
    /// markers that are control tokens in some vocabularies (gpt-oss's `<|channel|>`, `<|message|>`,
    /// `<|call|>`; Mistral's `[TOOL_CALLS]`, `[ARGS]`; DeepSeek's). Qwen's `<tool_call>` is ordinary text.
    pub fn renders_control_tokens(&self) -> bool {
        self.tools
            .as_ref()
            .is_some_and(|(f, _)| !matches!(f, Format::Qwen | Format::QwenXml))
    }

    fn object(&self, chunk: bool) -> &'static str {
        match (self.kind, chunk) {
            (Kind::Chat, false) => "chat.completion",
            (Kind::Chat, true) => "chat.completion.chunk",
            (Kind::Completion, _) => "text_completion",
        }
    }

    fn logprobs_json(&mut self, entries: &[TokenLogprobs]) -> Value {
        self.logprobs.as_mut().map_or(Value::Null, |l| l.json(entries))
    }

    /// The fields every response and chunk begins with.
    fn head(&self, chunk: bool) -> Value {
        json!({
            "id": self.id,
            "object": self.object(chunk),
            "created": self.created,
            "model": self.model,
            "system_fingerprint": FINGERPRINT,
            "seed": self.seed,
        })
    }

    fn with(mut head: Value, fields: Value) -> Value {
        if let (Some(h), Value::Object(f)) = (head.as_object_mut(), fields) {
            h.extend(f);
        }
        head
    }

    /// One chunk: a chat `delta` (the first one says the role) or a completion's text, with the
    /// log-probabilities of its tokens.
    fn chunk(&mut self, delta: Value, entries: &[TokenLogprobs], finish: Option<Finish>) -> Value {
        // A chunk without a token (the last one) has none, as OpenAI's.
        let logprobs = if entries.is_empty() {
            Value::Null
        } else {
            self.logprobs_json(entries)
        };
        let finish = finish.map(|f| if self.calls > 0 { "tool_calls" } else { f.as_str() });
        let choice = match self.kind {
            Kind::Chat => {
                let mut delta = delta;
                if !self.started {
                    if let Some(d) = delta.as_object_mut() {
                        d.shift_insert(0, "role".into(), "assistant".into());
                        d.entry("content").or_insert(Value::Null);
                    }
                }
                json!({"index": 0, "delta": delta, "logprobs": logprobs, "finish_reason": finish})
            }
            Kind::Completion => {
                json!({"index": 0, "text": delta, "logprobs": logprobs, "finish_reason": finish})
            }
        };
        self.started = true;
        Self::with(self.head(true), json!({"choices": [choice]}))
    }

    /// The chunks for newly generated `text` (none while it is held back: a multi-byte character, a
    /// possible stop string, or with tools a possible call).
    pub fn pieces(&mut self, text: &str, entries: &[TokenLogprobs]) -> Vec<Value> {
        let Some(parser) = self.parser.as_mut() else {
            if text.is_empty() && entries.is_empty() {
                return Vec::new();
            }
            let delta = match self.kind {
                Kind::Chat => json!({"content": text}),
                Kind::Completion => json!(text),
            };
            return vec![self.chunk(delta, entries, None)];
        };
        let items = parser.push(text);
        self.held_logprobs.extend_from_slice(entries);
        self.items(items)
    }

    /// The chunks of parsed items; the log-probabilities held so far go with the first.
    fn items(&mut self, items: Vec<Item>) -> Vec<Value> {
        let mut out = Vec::new();
        for item in items {
            let entries = std::mem::take(&mut self.held_logprobs);
            match item {
                Item::Content(text) => out.push(self.chunk(json!({"content": text}), &entries, None)),
                Item::Reasoning(text) => out.push(self.chunk(json!({"reasoning_content": text}), &entries, None)),
                Item::Call(call) => {
                    // As OpenAI streams a call: its id, type and name with empty arguments, then the
                    // arguments.
                    let index = self.calls;
                    self.calls += 1;
                    let head = json!({"tool_calls": [{"index": index, "id": tool_calls::call_id(), "type": "function",
                        "function": {"name": call.name, "arguments": ""}}]});
                    out.push(self.chunk(head, &entries, None));
                    let arguments =
                        json!({"tool_calls": [{"index": index, "function": {"arguments": call.arguments}}]});
                    out.push(self.chunk(arguments, &[], None));
                }
            }
        }
        out
    }

    /// The last chunks of a streamed answer: what the parser held, then the one with the finish reason
    /// ("tool_calls" when the answer made calls).
    pub fn end(&mut self, finish: Finish) -> Vec<Value> {
        let mut out = match self.parser.as_mut() {
            Some(parser) => {
                let items = parser.finish();
                self.items(items)
            }
            None => Vec::new(),
        };
        let last = match self.kind {
            Kind::Chat => json!({}),
            Kind::Completion => json!(""),
        };
        out.push(self.chunk(last, &[], Some(finish)));
        out
    }

    /// The usage-only chunk that `stream_options.include_usage` asks for, last before `[DONE]`.
    pub fn usage_chunk(&self, usage: Usage) -> Value {
        Self::with(self.head(true), json!({"choices": [], "usage": usage_json(usage)}))
    }

    /// The whole response of a request that was not streamed.
    pub fn whole(&mut self, text: &str, entries: &[TokenLogprobs], finish: Finish, usage: Usage) -> Value {
        let logprobs = self.logprobs_json(entries);
        let choice = match (self.kind, self.tools.take()) {
            (Kind::Chat, None) => {
                json!({"index": 0, "message": {"role": "assistant", "content": text}, "logprobs": logprobs, "finish_reason": finish.as_str()})
            }
            (Kind::Chat, Some((format, tools))) => {
                let (content, reasoning, calls) = Parser::whole(format, tools, text);
                let mut message = json!({"role": "assistant", "content": content});
                if let Some(r) = reasoning {
                    message["reasoning_content"] = r.into();
                }
                let finish = if calls.is_empty() {
                    finish.as_str()
                } else {
                    "tool_calls"
                };
                if !calls.is_empty() {
                    let calls: Vec<Value> = calls
                        .into_iter()
                        .map(|c| json!({"id": tool_calls::call_id(), "type": "function", "function": {"name": c.name, "arguments": c.arguments}}))
                        .collect();
                    message["tool_calls"] = calls.into();
                }
                json!({"index": 0, "message": message, "logprobs": logprobs, "finish_reason": finish})
            }
            (Kind::Completion, _) => {
                json!({"index": 0, "text": text, "logprobs": logprobs, "finish_reason": finish.as_str()})
            }
        };
        Self::with(
            self.head(false),
            json!({"choices": [choice], "usage": usage_json(usage)}),
        )
    }
}

/// A request's tokens as completions and chat completions give them.
fn usage_json(u: Usage) -> Value {
    json!({"prompt_tokens": u.prompt, "completion_tokens": u.completion, "total_tokens": u.prompt + u.completion, "prompt_tokens_details": {"cached_tokens": u.cached}})
}

/// Collects a request's events into its text, token log-probabilities and end.
pub async fn collect(
    events: &mut tokio::sync::mpsc::UnboundedReceiver<Event>,
) -> Result<(String, Vec<TokenLogprobs>, Finish, Usage), ApiError> {
    let (mut text, mut entries) = (String::new(), Vec::new());
    while let Some(e) = events.recv().await {
        match e {
            Event::Text { text: t, logprob } => {
                text.push_str(&t);
                entries.extend(logprob);
            }
            Event::Done { finish, usage } => return Ok((text, entries, finish, usage)),
            Event::Failed(why) => return Err(ApiError::internal(why)),
        }
    }
    Err(ApiError::internal("the engine stopped before the request finished"))
}
