//! The OpenAI-shaped requests and responses: parsing and checking a body into a [`Job`], and turning the
//! engine's [`Event`]s into a completion, a chat completion, or a stream of their chunks.

use std::collections::BTreeMap;

use serde::Deserialize;
use serde_json::{json, Map, Value};
use titan_engine::sampler::{TokenLogprobs, BAN};
use titan_engine::SamplerOptions;

use crate::error::ApiError;
use crate::logprobs::Logprobs;
use crate::scheduler::{Event, Finish};
use crate::template::{ChatTemplate, Message};

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
    /// vocabulary of `n_vocab`.
    pub fn settings(&self, prompt_len: usize, ctx_size: usize, n_vocab: usize) -> Result<Settings, ApiError> {
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
                    "max_tokens is {m}; with this prompt it must be in 1..={room}"
                ))
                .param("max_tokens"))
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
    crate::fields::check(Kind::Completion, &r.rest)?;
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

/// A `/v1/chat/completions` body: the request and its prompt text, rendered by the model's `template` into
/// at most `max_bytes` bytes. A template that refuses the conversation (`raise_exception`) is the request's
/// fault (400); one that fails otherwise, runs out of fuel or writes past `max_bytes` is the server's (500).
pub fn chat_body(
    body: &[u8],
    template: Option<&ChatTemplate>,
    max_bytes: usize,
) -> Result<(ChatRequest, String), ApiError> {
    let r: ChatRequest = from_json(body)?;
    crate::fields::check(Kind::Chat, &r.rest)?;
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
    let Some(template) = template else {
        return Err(ApiError::bad_request("the model has no chat template (tokenizer.chat_template); start titan serve with --chat-template FILE, or use /v1/completions"));
    };
    if r.messages.is_empty() {
        return Err(ApiError::bad_request("messages is empty").param("messages"));
    }
    let messages = r
        .messages
        .iter()
        .map(|m| {
            Ok(Message {
                role: m.role.clone(),
                content: m.text()?,
            })
        })
        .collect::<Result<Vec<_>, ApiError>>()?;
    let text = template.render(&messages, max_bytes).map_err(|e| {
        if e.is_the_conversations() {
            ApiError::bad_request(e.to_string())
        } else {
            ApiError::internal(format!(
                "{e} ({}): a fault of the server's chat template, not of the request",
                template.origin()
            ))
        }
    })?;
    Ok((r, text))
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
}

impl Responder {
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

    /// One streamed chunk: new text (`finish` None), or the last one (empty text, `finish` set).
    pub fn chunk(&mut self, text: &str, entries: &[TokenLogprobs], finish: Option<Finish>, first: bool) -> Value {
        // A chunk without a token (the last one) has none, as OpenAI's.
        let logprobs = if entries.is_empty() {
            Value::Null
        } else {
            self.logprobs_json(entries)
        };
        let choice = match self.kind {
            Kind::Chat => {
                let delta = if first {
                    json!({"role": "assistant", "content": text})
                } else if finish.is_some() {
                    json!({})
                } else {
                    json!({"content": text})
                };
                json!({"index": 0, "delta": delta, "logprobs": logprobs, "finish_reason": finish.map(Finish::as_str)})
            }
            Kind::Completion => {
                json!({"index": 0, "text": text, "logprobs": logprobs, "finish_reason": finish.map(Finish::as_str)})
            }
        };
        Self::with(self.head(true), json!({"choices": [choice]}))
    }

    /// The usage-only chunk that `stream_options.include_usage` asks for, last before `[DONE]`.
    pub fn usage_chunk(&self, usage: &Value) -> Value {
        Self::with(self.head(true), json!({"choices": [], "usage": usage}))
    }

    /// The whole response of a request that was not streamed.
    pub fn whole(&mut self, text: &str, entries: &[TokenLogprobs], finish: Finish, usage: &Value) -> Value {
        let logprobs = self.logprobs_json(entries);
        let choice = match self.kind {
            Kind::Chat => {
                json!({"index": 0, "message": {"role": "assistant", "content": text}, "logprobs": logprobs, "finish_reason": finish.as_str()})
            }
            Kind::Completion => {
                json!({"index": 0, "text": text, "logprobs": logprobs, "finish_reason": finish.as_str()})
            }
        };
        Self::with(self.head(false), json!({"choices": [choice], "usage": usage}))
    }
}

/// `cached`: of the prompt's tokens, those a slot's cache held already (not computed again).
pub fn usage(prompt_tokens: usize, cached: usize, completion_tokens: usize) -> Value {
    json!({"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens, "total_tokens": prompt_tokens + completion_tokens, "prompt_tokens_details": {"cached_tokens": cached}})
}

/// Collects a request's events into its text, token log-probabilities and end.
pub async fn collect(
    events: &mut tokio::sync::mpsc::UnboundedReceiver<Event>,
) -> Result<(String, Vec<TokenLogprobs>, Finish, Value), ApiError> {
    let (mut text, mut entries) = (String::new(), Vec::new());
    while let Some(e) = events.recv().await {
        match e {
            Event::Text { text: t, logprob } => {
                text.push_str(&t);
                entries.extend(logprob);
            }
            Event::Done {
                finish,
                prompt_tokens,
                cached_tokens,
                completion_tokens,
            } => {
                return Ok((
                    text,
                    entries,
                    finish,
                    usage(prompt_tokens, cached_tokens, completion_tokens),
                ))
            }
            Event::Failed(why) => return Err(ApiError::internal(why)),
        }
    }
    Err(ApiError::internal("the engine stopped before the request finished"))
}
