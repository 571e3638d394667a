//! `titan serve`: an OpenAI-compatible server. Requests become sequences of one engine, batched together
//! step by step (continuous batching); the HTTP side only parses, queues and streams.

pub mod api;
mod conn;
pub mod constraint;
pub mod error;
mod fields;
mod http;
mod logprobs;
mod metrics;
mod prompt_cache;
mod props;
pub mod responses;
mod scheduler;
pub mod template;
mod tokens;
pub mod tool_calls;

use std::io;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use titan_engine::Model;

pub use scheduler::{DraftSource, SchedulerOptions};
use template::{ChatTemplate, TemplateError};

/// Why the server did not start. (Once it listens, it serves until the process is stopped.)
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// The chat template given (`--chat-template`) is not valid Jinja. (The model's own is not a reason to
    /// stop: the server starts and answers chat requests 500, since completions still work.)
    #[error("the chat template does not parse: {0}")]
    Template(#[from] TemplateError),
    /// The operating system refused the engine's thread.
    #[error("the engine thread does not start: {0}")]
    EngineThread(#[source] io::Error),
    /// The operating system refused the HTTP side's runtime (its threads, its event queue).
    #[error("the HTTP runtime does not start: {0}")]
    Runtime(#[source] io::Error),
    /// llguidance refused the model's vocabulary (structured output needs it).
    #[error("the vocabulary cannot be used for structured output: {0}")]
    Grammars(#[from] constraint::ConstraintError),
    /// The address does not resolve, is taken, or is not this machine's.
    #[error("listening on {addr}: {source}")]
    Listen { addr: String, source: io::Error },
}

/// A chat template from a file, and the file, which errors name.
pub struct TemplateFile {
    pub path: PathBuf,
    pub source: String,
}

pub struct ServeOptions {
    pub listen: String,
    pub api_key: Option<String>,
    /// The model id clients name.
    pub name: String,
    /// The model's file as given (`GET /props` shows it).
    pub model_path: PathBuf,
    /// A chat template overriding the model's.
    pub chat_template: Option<TemplateFile>,
    pub scheduler: SchedulerOptions,
    /// Requests that may wait for a slot before new ones get 429.
    pub queue_len: usize,
    pub body_limit: usize,
    /// How long a connection may take to send a request's header whole, counted from when the server
    /// starts waiting for it: a new connection's first request, or a kept-alive one's next (so this is
    /// also how long an idle kept-alive connection stays open).
    pub header_timeout: Duration,
    /// How long a request's body may take to arrive whole, counted from the end of its header (408).
    pub body_timeout: Duration,
    /// Connections open at once; past it, a new one is answered 503 and closed.
    pub max_connections: usize,
}

/// A duration as the log gives it: milliseconds to a tenth, as a small model answers in less than one.
fn ms(d: std::time::Duration) -> String {
    format!("{:.1}", d.as_secs_f64() * 1e3)
}

/// Serves `model` until the process is stopped; prints `listening on ADDR` once it accepts connections.
pub fn serve(model: Model, opts: ServeOptions) -> Result<(), ServeError> {
    let token = |id: Option<u32>| {
        id.and_then(|t| model.tokenizer.token_bytes(t))
            .map(|b| String::from_utf8_lossy(b).into_owned())
            .unwrap_or_default()
    };
    let (bos, eos) = (token(model.tokenizer.bos()), token(model.tokenizer.eos()));
    let template = match &opts.chat_template {
        // The operator's own file: a mistake to fix before serving.
        Some(file) => http::Template::Ready(Box::new(
            ChatTemplate::new(&file.source, &bos, &eos)?
                .with_origin(format!("--chat-template {}", file.path.display())),
        )),
        None => match model.weights.file.get_str("tokenizer.chat_template").ok().flatten() {
            // The model's: completions still work, so the server starts, says why chat cannot, and
            // answers each chat request so.
            Some(source) => match ChatTemplate::new(source, &bos, &eos) {
                Ok(t) => http::Template::Ready(Box::new(t.with_origin("the model's tokenizer.chat_template"))),
                Err(e) => {
                    let why = format!("the model's chat template does not parse: {e}");
                    tracing::error!(
                        "{why}: /v1/chat/completions will answer 500 (--chat-template FILE gives one that does)"
                    );
                    http::Template::Broken(format!("{why}; start titan serve with --chat-template FILE"))
                }
            },
            None => {
                tracing::warn!(
                    "the model has no chat template and none was given: /v1/chat/completions will answer 400"
                );
                http::Template::Missing
            }
        },
    };
    let template_source = match &opts.chat_template {
        Some(file) => Some(file.source.clone()),
        None => model
            .weights
            .file
            .get_str("tokenizer.chat_template")
            .ok()
            .flatten()
            .map(str::to_string),
    };
    let props = props::props(&props::Props {
        model: &model,
        name: &opts.name,
        path: &opts.model_path,
        ctx_size: opts.scheduler.ctx_size,
        slots: opts.scheduler.parallel,
        chat_template: template_source.as_deref(),
        bos: &bos,
        eos: &eos,
    });
    let grammars = constraint::Grammars::new(&model.tokenizer)?;
    let model = Arc::new(model);
    let metrics = Arc::new(metrics::Metrics::default());
    let ctx_size = opts.scheduler.ctx_size;
    let queue = scheduler::start(model.clone(), opts.scheduler, opts.queue_len, metrics.clone())
        .map_err(ServeError::EngineThread)?;
    let created = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    // Rendering, tokenising and parsing bodies run on tokio's blocking threads, so that /health and the
    // streams never wait behind them; this many at once, so that a burst of them (or a template that
    // spends all its fuel) takes a few cores from the engine, not all.
    let preparing = std::thread::available_parallelism().map_or(2, |n| n.get().clamp(2, 4));
    let state = Arc::new(http::AppState {
        model,
        grammars,
        name: opts.name,
        template,
        queue,
        queue_len: opts.queue_len,
        metrics: metrics.clone(),
        api_key: opts.api_key,
        ctx_size,
        body_limit: opts.body_limit,
        body_timeout: opts.body_timeout,
        preparing: Arc::new(tokio::sync::Semaphore::new(preparing)),
        created,
        props,
    });
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(ServeError::Runtime)?;
    rt.block_on(async move {
        let listen = |source| ServeError::Listen {
            addr: opts.listen.clone(),
            source,
        };
        let listener = tokio::net::TcpListener::bind(&opts.listen).await.map_err(listen)?;
        println!("listening on {}", listener.local_addr().map_err(listen)?);
        conn::accept(
            listener,
            http::router(state),
            conn::Limits {
                header_timeout: opts.header_timeout,
                max_connections: opts.max_connections,
            },
            metrics,
        )
        .await
    })
}
