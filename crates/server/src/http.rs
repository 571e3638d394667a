//! The routes: the chat page, health, metrics, models, completions, chat completions and OpenAI's Responses
//! API, streamed as server-sent events or not, and llama-server's tokenize, detokenize and props, behind an
//! optional API key and a body size limit. Each request has an id (`x-request-id`), a span its log lines
//! carry, the engine's included, and one access-log line.
//!
//! What costs CPU in proportion to the request (parsing a body, rendering the chat template, tokenising)
//! runs on tokio's blocking threads, a few at a time, never on the two that serve every connection.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use axum::body::{Body, Bytes, HttpBody};
use axum::extract::rejection::BytesRejection;
use axum::extract::{DefaultBodyLimit, Request, State};
use axum::http::{header, HeaderName, HeaderValue, StatusCode};
use axum::middleware::{self, Next};
use axum::response::sse::{Event as SseEvent, Sse};
use axum::response::{Html, IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use futures_util::stream::{self, Stream, StreamExt};
use serde_json::{json, Value};
use titan_engine::Model;
use tokio::sync::{mpsc, Semaphore};
use tracing::Instrument;

use crate::api::{
    chat_body, collect, completion_body, no_template, render, Kind, Params, PromptInput, Responder, Settings, ToolUse,
};
use crate::constraint::{Constraint, Grammars};
use crate::error::ApiError;
use crate::logprobs::Logprobs;
use crate::metrics::Metrics;
use crate::responses::{responses_body, Events, Named, Reply};
use crate::scheduler::{Event, Job};
use crate::template::ChatTemplate;

/// The chat template requests are rendered with.
pub enum Template {
    Ready(Box<ChatTemplate>),
    /// Neither the model nor the operator gave one: chat requests are answered 400 (completions work).
    Missing,
    /// The model's does not parse (why, as chat requests are answered, 500).
    Broken(String),
}

pub struct AppState {
    pub model: Arc<Model>,
    /// The vocabulary for constrained sampling (`response_format`).
    pub grammars: Grammars,
    /// The model id clients name (`GET /v1/models`).
    pub name: String,
    pub template: Template,
    pub queue: mpsc::Sender<Job>,
    pub queue_len: usize,
    pub metrics: Arc<Metrics>,
    pub api_key: Option<String>,
    pub ctx_size: usize,
    pub body_limit: usize,
    pub body_timeout: Duration,
    /// Permits to parse, render and tokenise on a blocking thread (see [`prepare`]).
    pub preparing: Arc<Semaphore>,
    pub created: u64,
    /// The answer to `GET /props` (it does not change while the server runs).
    pub props: Value,
}

type Shared = Arc<AppState>;

pub fn router(state: Shared) -> Router {
    let api = Router::new()
        .route("/v1/models", get(models))
        .route("/v1/completions", post(completions))
        .route("/v1/chat/completions", post(chat))
        .route("/v1/responses", post(responses))
        .route("/tokenize", post(tokenize_text))
        .route("/detokenize", post(detokenize_ids))
        .route(
            "/props",
            get(|State(s): State<Shared>| async move { Json(s.props.clone()) }),
        )
        .route_layer(middleware::from_fn_with_state(state.clone(), require_key))
        .route_layer(middleware::from_fn_with_state(state.clone(), body_deadline));
    Router::new()
        .route("/", get(|| async { Html(include_str!("page.html")) }))
        .route("/health", get(|| async { Json(json!({"status": "ok"})) }))
        .route("/metrics", get(metrics))
        .merge(api)
        .fallback(|| async { ApiError::not_found("no such route") })
        .layer(DefaultBodyLimit::max(state.body_limit))
        .layer(middleware::from_fn(access_log))
        .with_state(state)
}

const REQUEST_ID: HeaderName = HeaderName::from_static("x-request-id");

/// Names the request (`req-N`, also sent back as `x-request-id` so that a client can quote it), runs it in
/// a span that carries the id, and logs it once its response is sent: a streamed answer's status is known
/// long before its end.
async fn access_log(req: Request, next: Next) -> Response {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    let id = format!("req-{}", NEXT.fetch_add(1, Ordering::Relaxed));
    let span = tracing::info_span!("request", id = %id, method = %req.method(), path = %req.uri().path());
    let started = Instant::now();
    let (mut parts, body) = next.run(req).instrument(span.clone()).await.into_parts();
    parts.headers.insert(
        REQUEST_ID,
        HeaderValue::try_from(id).expect("req-N is a valid header value"),
    );
    let body = Logged {
        body,
        span,
        status: parts.status,
        started,
        ended: false,
    };
    Response::from_parts(parts, Body::new(body))
}

/// A response body that writes the request's access-log line when it is dropped: sent to its end, or
/// abandoned by a client that left.
struct Logged {
    body: Body,
    span: tracing::Span,
    status: StatusCode,
    started: Instant,
    ended: bool,
}

impl HttpBody for Logged {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, axum::Error>>> {
        let this = self.get_mut();
        let frame = Pin::new(&mut this.body).poll_frame(cx);
        this.ended |= matches!(frame, Poll::Ready(None));
        frame
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.body.size_hint()
    }
}

impl Drop for Logged {
    fn drop(&mut self) {
        let _in = self.span.enter();
        let status = self.status.as_u16();
        let ms = crate::ms(self.started.elapsed());
        // hyper stops polling a body that says it has ended (a whole JSON answer) before its last `None`.
        if self.ended || self.body.is_end_stream() {
            tracing::info!(status, %ms, "answered");
        } else {
            tracing::info!(status, %ms, "abandoned by the client");
        }
    }
}

/// A request body that has not arrived whole `body_timeout` after the header is cut off there (408), so that
/// a client sending it slowly holds its connection for a bounded time.
async fn body_deadline(State(s): State<Shared>, req: Request, next: Next) -> Response {
    let (parts, body) = req.into_parts();
    let body = Body::new(Deadline {
        body,
        timer: Box::pin(tokio::time::sleep(s.body_timeout)),
    });
    next.run(Request::from_parts(parts, body)).await
}

struct Deadline {
    body: Body,
    timer: Pin<Box<tokio::time::Sleep>>,
}

/// The error a [`Deadline`] body ends with, found again in the extractor's rejection by [`bytes`].
#[derive(Debug, thiserror::Error)]
#[error("the request body did not arrive in time")]
struct BodyTimedOut;

impl HttpBody for Deadline {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, axum::Error>>> {
        let this = self.get_mut();
        match Pin::new(&mut this.body).poll_frame(cx) {
            Poll::Pending if this.timer.as_mut().poll(cx).is_ready() => {
                Poll::Ready(Some(Err(axum::Error::new(BodyTimedOut))))
            }
            frame => frame,
        }
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.body.size_hint()
    }
}

/// `/v1/*` needs `Authorization: Bearer KEY` when the server has a key; the page, health and metrics
/// do not (as llama-server).
async fn require_key(State(s): State<Shared>, req: Request, next: Next) -> Response {
    if let Some(key) = &s.api_key {
        let given = req
            .headers()
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "));
        if !given.is_some_and(|g| titan_net::secrets_equal(g.as_bytes(), key.as_bytes())) {
            return ApiError::unauthorized().into_response();
        }
    }
    next.run(req).await
}

async fn metrics(State(s): State<Shared>) -> impl IntoResponse {
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        s.metrics.render(&s.model),
    )
}

async fn models(State(s): State<Shared>) -> Json<Value> {
    Json(
        json!({"object": "list", "data": [{"id": s.name, "object": "model", "created": s.created, "owned_by": "titan"}]}),
    )
}

/// The body's bytes, or the OpenAI-shaped 4xx for a body too large, too slow or unreadable (axum's own
/// rejections are plain text).
fn bytes(s: &AppState, body: Result<Bytes, BytesRejection>) -> Result<Bytes, ApiError> {
    body.map_err(|e| {
        let mut source: Option<&(dyn std::error::Error + 'static)> = Some(&e);
        while let Some(cause) = source {
            if cause.is::<BodyTimedOut>() {
                return ApiError::body_timeout(s.body_timeout);
            }
            source = cause.source();
        }
        if e.status() == StatusCode::PAYLOAD_TOO_LARGE {
            ApiError::too_large(s.body_limit)
        } else {
            ApiError::bad_request(e.body_text())
        }
    })
}

/// Runs `work` on a blocking thread once one of the `preparing` permits is free, and waits for it without
/// holding an async thread. The permit goes with the work: work whose client left still counts until it
/// ends, so abandoned requests cannot pile up past the permits.
async fn prepare<T: Send + 'static>(
    s: &Shared,
    work: impl FnOnce(&AppState) -> Result<T, ApiError> + Send + 'static,
) -> Result<T, ApiError> {
    let permit = s
        .preparing
        .clone()
        .acquire_owned()
        .await
        .expect("the semaphore is never closed");
    let state = s.clone();
    let span = tracing::Span::current();
    tokio::task::spawn_blocking(move || {
        let _permit = permit;
        let _in = span.enter();
        work(&state)
    })
    .await
    .unwrap_or_else(|e| Err(ApiError::internal(format!("preparing the request failed: {e}"))))
}

/// The tokens of a prompt `text`, or a 400 without tokenising when it is longer (in bytes) than the context
/// could hold whatever its tokens: a token stands for at most `max_token_bytes` bytes of text, so a text of
/// more than `ctx_size × max_token_bytes` bytes has more tokens than the context has positions. Tokenising
/// allocates some 24 bytes a byte of text at once; this keeps that to what could be served.
fn tokenize(s: &AppState, text: &str, param: &'static str) -> Result<Vec<u32>, ApiError> {
    let per_token = s.model.tokenizer.max_token_bytes();
    let most = s.ctx_size.saturating_mul(per_token);
    if text.len() > most {
        return Err(ApiError::bad_request(format!(
            "the prompt is longer than the context: {} bytes, and the context's {} tokens hold at most {most} \
             bytes of text (this vocabulary's longest token is {per_token} bytes)",
            text.len(),
            s.ctx_size
        ))
        .param(param)
        .code("context_length_exceeded"));
    }
    Ok(s.model.tokenizer.encode(text, true, true))
}

fn check_model(s: &AppState, p: &Params) -> Result<(), ApiError> {
    match &p.model {
        Some(m) if m != &s.name => Err(ApiError::not_found(format!(
            "the model {m:?} does not exist; this server has {:?}",
            s.name
        ))
        .param("model")
        .code("model_not_found")),
        _ => Ok(()),
    }
}

async fn completions(State(s): State<Shared>, body: Result<Bytes, BytesRejection>) -> Result<Response, ApiError> {
    let body = bytes(&s, body)?;
    let (r, prompt, constraint) = prepare(&s, move |s| {
        let (r, prompt) = completion_body(&body)?;
        check_model(s, &r.params)?;
        let prompt = match prompt {
            PromptInput::Text(t) => tokenize(s, &t, "prompt")?,
            PromptInput::Tokens(t) => t,
        };
        let constraint = s.grammars.response_format(r.params.response_format.as_ref())?;
        Ok((r, prompt, constraint))
    })
    .await?;
    if let Some(&t) = prompt.iter().find(|&&t| t as usize >= s.model.config.n_vocab) {
        return Err(ApiError::bad_request(format!(
            "token id {t} is outside the vocabulary ({} tokens)",
            s.model.config.n_vocab
        ))
        .param("prompt"));
    }
    let responder = Responder::new(
        Kind::Completion,
        format!("cmpl-{}", request_id()),
        s.name.clone(),
        now(),
        r.logprobs.map(|_| Logprobs::new(Kind::Completion, s.model.clone())),
    );
    let top = r.logprobs.map(|n| n as usize);
    respond(s, prompt, &r.params, responder, top, constraint).await
}

async fn chat(State(s): State<Shared>, body: Result<Bytes, BytesRejection>) -> Result<Response, ApiError> {
    let body = bytes(&s, body)?;
    let (r, prompt, tool_use, constraint) = prepare(&s, move |s| {
        let (r, text, tool_use) = chat_body(&body, chat_template(s)?, render_limit(s))?;
        check_model(s, &r.params)?;
        let prompt = conversation_tokens(s, &text, "messages")?;
        // A forced call is a grammar of the model's call syntax; it and a response format cannot both hold.
        let constraint = match tool_use.as_ref().map(ToolUse::forcing).transpose()?.flatten() {
            Some(grammar) => {
                if s.grammars.response_format(r.params.response_format.as_ref())?.is_some() {
                    return Err(ApiError::bad_request(
                        "tool_choice forces a call and response_format a format: the answer cannot be held to both",
                    )
                    .param("response_format"));
                }
                let forced = s.grammars.lark(&grammar).map_err(|e| {
                    ApiError::bad_request(format!("the tools' parameters cannot be enforced: {e}")).param("tools")
                })?;
                Some(forced)
            }
            None => s.grammars.response_format(r.params.response_format.as_ref())?,
        };
        Ok((r, prompt, tool_use, constraint))
    })
    .await?;
    let mut responder = Responder::new(
        Kind::Chat,
        format!("chatcmpl-{}", request_id()),
        s.name.clone(),
        now(),
        r.logprobs.then(|| Logprobs::new(Kind::Chat, s.model.clone())),
    );
    if let Some(t) = tool_use {
        responder = responder.with_tools(t.format, t.tools);
    }
    let top = r.logprobs.then(|| r.top_logprobs.unwrap_or(0) as usize);
    respond(s, prompt, &r.params, responder, top, constraint).await
}

/// OpenAI's Responses API: the chat endpoint's path (template, tokens, job, prompt cache) with the
/// Responses shapes in and out (`responses.rs`).
async fn responses(State(s): State<Shared>, body: Result<Bytes, BytesRejection>) -> Result<Response, ApiError> {
    let body = bytes(&s, body)?;
    let (r, prompt) = prepare(&s, move |s| {
        let (r, messages) = responses_body(&body)?;
        check_model(s, &r.params())?;
        let template = chat_template(s)?.ok_or_else(no_template)?;
        let text = render(template, &messages, &[], render_limit(s))?;
        Ok((r, conversation_tokens(s, &text, "input")?))
    })
    .await?;
    let params = r.params();
    let settings = params.settings(prompt.len(), s.ctx_size, s.model.config.n_vocab, "max_output_tokens")?;
    let reply = Reply::new(&r, &request_id(), s.name.clone(), now(), &settings.sampler);
    let mut rx = submit(&s, prompt, settings, None, None, false)?;
    if !params.stream {
        let (text, _, finish, usage) = collect(&mut rx).await?;
        return Ok(Json(reply.whole(&text, finish, usage)).into_response());
    }
    Ok(Sse::new(response_events(rx, Events::new(reply))).into_response())
}

/// The chat template conversations are rendered with: None when there is none (a 400 for the request), a
/// 500 when the model's does not parse.
fn chat_template(s: &AppState) -> Result<Option<&ChatTemplate>, ApiError> {
    match &s.template {
        Template::Ready(t) => Ok(Some(&**t)),
        Template::Missing => Ok(None),
        Template::Broken(why) => Err(ApiError::internal(why.clone())),
    }
}

/// The most bytes a rendered conversation may take: 16 times the largest body, far more than a real template
/// writes for a conversation (its text once, a few dozen bytes of markup a message, a system prompt), and
/// little enough memory (16 MiB at the default --max-body) to hold for each request being prepared. A
/// template that writes more is at fault, and answered 500 when it gets there.
fn render_limit(s: &AppState) -> usize {
    s.body_limit.saturating_mul(16)
}

/// The tokens of a rendered conversation `text`. The template usually writes the BOS token itself; it is
/// added once, as a token.
fn conversation_tokens(s: &AppState, text: &str, param: &'static str) -> Result<Vec<u32>, ApiError> {
    let bos = s
        .model
        .tokenizer
        .added_bos()
        .and_then(|b| s.model.tokenizer.token_bytes(b))
        .map(|b| String::from_utf8_lossy(b).into_owned());
    let text = bos.as_deref().and_then(|b| text.strip_prefix(b)).unwrap_or(text);
    tokenize(s, text, param)
}

async fn tokenize_text(State(s): State<Shared>, body: Result<Bytes, BytesRejection>) -> Result<Json<Value>, ApiError> {
    let body = bytes(&s, body)?;
    prepare(&s, move |s| crate::tokens::tokenize(&s.model.tokenizer, &body))
        .await
        .map(Json)
}

async fn detokenize_ids(State(s): State<Shared>, body: Result<Bytes, BytesRejection>) -> Result<Json<Value>, ApiError> {
    let body = bytes(&s, body)?;
    prepare(&s, move |s| crate::tokens::detokenize(&s.model.tokenizer, &body))
        .await
        .map(Json)
}

/// Queues the request and answers it, whole or streamed; `top_logprobs`: with log-probabilities, how many
/// of the most likely tokens to give beside the chosen one; `constraint`: the grammar its output follows.
async fn respond(
    s: Shared,
    prompt: Vec<u32>,
    params: &Params,
    mut responder: Responder,
    top_logprobs: Option<usize>,
    constraint: Option<Constraint>,
) -> Result<Response, ApiError> {
    let settings = params.settings(prompt.len(), s.ctx_size, s.model.config.n_vocab, "max_tokens")?;
    responder.seed = settings.sampler.seed;
    let special = responder.renders_control_tokens();
    let mut rx = submit(&s, prompt, settings, top_logprobs, constraint, special)?;
    if !params.stream {
        let (text, entries, finish, usage) = collect(&mut rx).await?;
        return Ok(Json(responder.whole(&text, &entries, finish, usage)).into_response());
    }
    let include_usage = params.stream_options.as_ref().is_some_and(|o| o.include_usage);
    Ok(Sse::new(chunks(rx, responder, include_usage)).into_response())
}

/// Queues a request's job; its events come on the receiver. A full queue is a 429. `constraint`: the grammar
/// its output follows; `special`: control tokens reach the text as their names (see [`Job::special`]).
fn submit(
    s: &AppState,
    prompt: Vec<u32>,
    settings: Settings,
    top_logprobs: Option<usize>,
    constraint: Option<Constraint>,
    special: bool,
) -> Result<mpsc::UnboundedReceiver<Event>, ApiError> {
    let (tx, rx) = mpsc::unbounded_channel();
    let prompt_len = prompt.len();
    let job = Job {
        prompt,
        sampler: settings.sampler,
        max_tokens: settings.max_tokens,
        stop: settings.stop,
        logprobs: top_logprobs.is_some(),
        top_logprobs: top_logprobs.unwrap_or(0),
        constraint,
        special,
        events: tx,
        queued_at: Instant::now(),
        span: tracing::Span::current(),
    };
    s.metrics.queued.fetch_add(1, Ordering::Relaxed);
    if s.queue.try_send(job).is_err() {
        s.metrics.queued.fetch_sub(1, Ordering::Relaxed);
        s.metrics.rejected.fetch_add(1, Ordering::Relaxed);
        return Err(ApiError::busy(s.queue_len));
    }
    s.metrics.requests.fetch_add(1, Ordering::Relaxed);
    s.metrics.prompt_tokens.fetch_add(prompt_len as u64, Ordering::Relaxed);
    Ok(rx)
}

/// The SSE stream of a Responses request: its opening events, a delta per piece of text, and its closing
/// events (or `response.failed`). As with [`chunks`], dropping it frees the request's slot.
fn response_events(
    rx: mpsc::UnboundedReceiver<Event>,
    mut events: Events,
) -> impl Stream<Item = Result<SseEvent, Infallible>> {
    let sse = |(name, v): Named| SseEvent::default().event(name).data(v.to_string());
    let opening = events.start();
    stream::once(async { opening })
        .chain(stream::unfold(Some((rx, events)), |open| async move {
            let (mut rx, mut events) = open?;
            let (out, next) = match rx.recv().await {
                Some(Event::Text { text, .. }) if text.is_empty() => (Vec::new(), true),
                Some(Event::Text { text, .. }) => (vec![events.delta(&text)], true),
                Some(Event::Done { finish, usage }) => (events.done(finish, usage), false),
                Some(Event::Failed(why)) => (vec![events.failed(&why)], false),
                None => (
                    vec![events.failed("the engine stopped before the request finished")],
                    false,
                ),
            };
            Some((out, next.then_some((rx, events))))
        }))
        .flat_map(move |v| stream::iter(v.into_iter().map(move |e| Ok(sse(e)))))
}

/// The SSE stream of a request: a chunk per piece of text, the finishing chunk, the usage chunk if asked
/// for, then `[DONE]`. Dropping the stream (the client went away) drops the receiver, which frees the
/// request's slot at the engine's next step.
fn chunks(
    rx: mpsc::UnboundedReceiver<Event>,
    r: Responder,
    include_usage: bool,
) -> impl Stream<Item = Result<SseEvent, Infallible>> {
    struct Open {
        rx: mpsc::UnboundedReceiver<Event>,
        r: Responder,
    }
    let data = |v: Value| SseEvent::default().data(v.to_string());
    stream::unfold(Some(Open { rx, r }), move |open| async move {
        let mut o = open?;
        let events = match o.rx.recv().await {
            Some(Event::Text { text, logprob }) => {
                let entries: Vec<_> = logprob.into_iter().collect();
                let chunks: Vec<SseEvent> = o.r.pieces(&text, &entries).into_iter().map(data).collect();
                return Some((chunks, Some(o)));
            }
            Some(Event::Done { finish, usage }) => {
                let mut v: Vec<SseEvent> = o.r.end(finish).into_iter().map(data).collect();
                if include_usage {
                    v.push(data(o.r.usage_chunk(usage)));
                }
                v
            }
            Some(Event::Failed(why)) => vec![data(ApiError::internal(why).body())],
            None => vec![data(
                ApiError::internal("the engine stopped before the request finished").body(),
            )],
        };
        Some((
            events.into_iter().chain([SseEvent::default().data("[DONE]")]).collect(),
            None,
        ))
    })
    .flat_map(|events| stream::iter(events.into_iter().map(Ok)))
}

fn now() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

/// A request id unique within the process and unlikely to repeat across restarts.
fn request_id() -> String {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    format!("{:x}{:06x}", now(), NEXT.fetch_add(1, Ordering::Relaxed))
}
